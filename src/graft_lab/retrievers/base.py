"""Retrievers propose continuations of the current context without a model, as a tree fragment rooted
at the current token, and learn online from what the target verified.

Scores. Every retrieved node carries a log-probability estimate of its path from the node it hangs
under (<= 0, non-increasing along a path), so grafting can rank drafted and retrieved candidates with
one number and `DraftTree.cut` stays ancestor-closed. Each retriever documents its estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import numpy as np
import torch

from ..models.target import Successors
from ..registry import Registry
from ..tree import DraftTree, Source


@dataclass(frozen=True)
class Fragment:
    """Retrieved continuations to hang under nodes of a tree (`DraftTree.add_subtree`'s arguments)."""

    under: torch.Tensor  # [M] anchor: the node of the queried tree this node's chain hangs under
    tokens: torch.Tensor  # [M] int64
    parents: torch.Tensor  # [M] int64: -1 hangs under `under`, else an earlier fragment node
    depth: torch.Tensor  # [M] int64 depth below the anchor (1 for nodes hanging directly)
    score: torch.Tensor  # [M] float32 log-probability estimate of the path from the anchor
    source: torch.Tensor  # [M] int8 Source value: which retriever proposed the node (`tree.retrieved_by`)

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "Fragment":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return Fragment(z, z, z, z, torch.zeros(0, device=device), retrieved(0, device))

    @staticmethod
    def below_root(tree: DraftTree) -> "Fragment":
        """A tree's non-root nodes, anchored at node 0 (the inverse of `Fragment.tree`)."""
        parents = tree.parents[1:] - 1  # the root (0) becomes the anchor (-1)
        return Fragment(torch.zeros_like(parents), tree.tokens[1:], parents, tree.depth[1:], tree.score[1:], tree.source[1:])

    @staticmethod
    def concat(fragments: list["Fragment"], device: torch.device | str) -> "Fragment":
        """One fragment of several, in order; duplicates among them are left for `add_subtree` to fold."""
        frags = [f for f in fragments if f.size]
        if not frags:
            return Fragment.empty(device)
        offsets = accumulate((f.size for f in frags[:-1]), initial=0)  # first node of each fragment
        cat = lambda field: torch.cat([getattr(f, field).to(device) for f in frags])
        parents = torch.cat([torch.where(f.parents < 0, f.parents, f.parents + o).to(device) for f, o in zip(frags, offsets)])
        return Fragment(cat("under"), cat("tokens"), parents, cat("depth"), cat("score"), cat("source"))

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def tree(self, root: int, device: torch.device | str) -> DraftTree:
        """The fragment as a tree under `root` (every anchor must be node 0 of the queried tree)."""
        cat = lambda head, rest: torch.cat([torch.tensor([head], dtype=rest.dtype, device=device), rest.to(device)])
        return DraftTree(
            tokens=cat(root, self.tokens),
            parents=cat(-1, self.parents + 1),  # fragment -1 (the anchor) becomes node 0
            depth=cat(0, self.depth),
            score=cat(0.0, self.score),
            source=cat(int(Source.ROOT), self.source),
        )


def retrieved(n: int, device: torch.device | str) -> torch.Tensor:
    """[n] int8 source values of nodes a method's one retriever proposed (a pool re-tags them by index)."""
    return torch.full((n,), int(Source.RETRIEVED), dtype=torch.int8, device=device)


class Retriever(Protocol):
    prefill_top_k: int  # top-k next tokens per distinct prompt token that reset() wants from prefill (0: none)

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        """Start a new sequence. prompt: [S]; successors: the target's top-`prefill_top_k` next tokens after
        each distinct prompt token (at its last occurrence), or None."""

    def extend(self, tokens: torch.Tensor) -> None:
        """Append emitted tokens [n] to the context; the last one is the next tree's root."""

    def retrieve(self, budget: int) -> DraftTree:
        """A tree of at most `budget` nodes rooted at the last context token."""

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        """Continuations of context + the path to each of `nodes` ([Q] nodes of `tree`, rooted at the last
        context token), at most `max_len` deep; nodes whose path matches nothing get none."""

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """Learn from a verified tree and the target's logits at its nodes ([N, V])."""


RETRIEVERS: Registry[Retriever] = Registry("retriever")


class TokenBuffer:
    """The context as a growable int64 array (amortised O(1) appends), for vectorised copy-outs."""

    def __init__(self):
        self.data = np.zeros(1024, dtype=np.int64)
        self.n = 0

    def extend(self, ids: list[int]) -> None:
        if self.n + len(ids) > self.data.size:
            self.data = np.resize(self.data, max(2 * self.data.size, self.n + len(ids)))
        self.data[self.n : self.n + len(ids)] = ids
        self.n += len(ids)

    def after(self, ends: np.ndarray, length: int) -> np.ndarray:
        """[C, length] the tokens that followed positions `ends` ([C]), -1 past the end of the context."""
        idx = ends[:, None] + 1 + np.arange(length)
        return np.where(idx < self.n, self.data[np.minimum(idx, self.n - 1)], -1)


def chain_trie(anchors: np.ndarray, chains: np.ndarray, log_decay: float, device: torch.device | str) -> Fragment:
    """Merge token chains into one trie per anchor, counting how many chains pass through each node.

    anchors: [C] anchor node per chain; chains: [C, L] token ids, -1 padded at the end. A node's score is
    log(chains through it / chains of its anchor) + depth * log_decay: the share of matched occurrences
    that continue this way, discounted because a copy drifts from the context the further it runs.
    Vectorised per depth level (L iterations), nodes come out level by level, so parents precede children."""
    c, length = chains.shape
    if c == 0 or length == 0:
        return Fragment.empty(device)
    group = np.unique(anchors, return_inverse=True)[1].reshape(-1)
    per_anchor = np.bincount(group)[group]  # [C] chains that share each chain's anchor
    node = np.full(c, -1, dtype=np.int64)  # [C] fragment node each chain sits at (-1: the anchor)
    key = anchors.astype(np.int64)  # [C] identity of the prefix so far
    width = int(chains.max()) + 1
    out_tok, out_par, out_dep, out_score, out_anchor = [], [], [], [], []
    n = 0
    for d in range(length):
        alive = chains[:, d] >= 0
        if not alive.any():
            break
        rows = alive.nonzero()[0]
        uniq, first, inverse, count = np.unique(
            key[rows] * width + chains[rows, d], return_index=True, return_inverse=True, return_counts=True
        )
        out_tok.append(chains[rows[first], d])
        out_par.append(node[rows[first]])
        out_dep.append(np.full(uniq.size, d + 1))
        out_score.append(np.log(count / per_anchor[rows[first]]) + (d + 1) * log_decay)
        out_anchor.append(anchors[rows[first]])
        node[rows] = n + inverse.reshape(-1)
        key[rows] = node[rows]
        n += uniq.size
    as_long = lambda parts: torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device)
    return Fragment(
        under=as_long(out_anchor),
        tokens=as_long(out_tok),
        parents=as_long(out_par),
        depth=as_long(out_dep),
        score=torch.from_numpy(np.concatenate(out_score).astype(np.float32)).to(device),
        source=retrieved(n, device),
    )


class NoRetriever:
    """Retrieves nothing: the root alone."""

    prefill_top_k = 0

    def __init__(self):
        self.root = 0

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        self.root = int(prompt[-1])

    def extend(self, tokens: torch.Tensor) -> None:
        self.root = int(tokens[-1])

    def retrieve(self, budget: int) -> DraftTree:
        return DraftTree.root(self.root)

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        return Fragment.empty(tree.device)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        pass


@RETRIEVERS.register("none")
def build_none(vocab_size: int, device: torch.device) -> NoRetriever:
    return NoRetriever()
