"""Prompt lookup: copy what followed earlier occurrences of the context's last n tokens.

The index maps every n-gram (n_min <= n <= n_max) of prompt + output to its end positions and grows in
`extend`, so a lookup is one hash probe per n, never a rescan. The longest n with an earlier occurrence
wins; its most recent `max_matches` occurrences are merged into a trie ranked by count.

Score of a retrieved node: log(share of the merged occurrences that continue this way) + depth * log(decay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from ..tree import DraftTree
from .base import RETRIEVERS, Fragment, Successors, TokenBuffer, chain_trie


@dataclass
class NgramOptions:
    n_max: int = 4  # longest suffix tried first
    n_min: int = 1  # shortest suffix still worth copying from
    max_matches: int = 8  # most recent occurrences merged into the trie
    max_len: int = 16  # tokens copied per occurrence
    decay: float = 0.9  # per-token discount of the score

    def __post_init__(self):
        if not 1 <= self.n_min <= self.n_max:
            raise ConfigError(f"retriever needs 1 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}")
        if self.max_matches < 1 or self.max_len < 1:
            raise ConfigError(f"retriever.max_matches and max_len must be >= 1, got {self.max_matches}, {self.max_len}")
        if not 0.0 < self.decay <= 1.0:
            raise ConfigError(f"retriever.decay must be in (0, 1], got {self.decay}")


class NgramRetriever:
    prefill_top_k = 0

    def __init__(self, opts: NgramOptions, device: torch.device | str):
        self.opts = opts
        self.device = torch.device(device)
        self.log_decay = math.log(opts.decay)
        self.ctx: list[int] = []
        self.buf = TokenBuffer()
        self.index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ascending end positions

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        self.ctx, self.buf, self.index = [], TokenBuffer(), {}
        self.extend(prompt)

    def extend(self, tokens: torch.Tensor) -> None:
        new = tokens.tolist()
        self.buf.extend(new)
        lo, hi = self.opts.n_min, self.opts.n_max
        for t in new:
            self.ctx.append(t)
            end = len(self.ctx)
            for n in range(lo, min(hi, end) + 1):
                self.index.setdefault(tuple(self.ctx[end - n :]), []).append(end - 1)

    def occurrences(self, tail: tuple[int, ...]) -> list[int]:
        """End positions of the most recent earlier occurrences of the longest indexed suffix of `tail`."""
        last = len(self.ctx) - 1  # nothing follows the context's end yet
        for n in range(min(self.opts.n_max, len(tail)), self.opts.n_min - 1, -1):
            ends = self.index.get(tail[-n:])
            if ends:
                hits = [p for p in ends[-self.opts.max_matches - 1 :] if p < last][-self.opts.max_matches :]
                if hits:
                    return hits
        return []

    def retrieve(self, budget: int) -> DraftTree:
        root = self.ctx[-1]
        ends = np.asarray(self.occurrences(tuple(self.ctx[-self.opts.n_max :])), dtype=np.int64)
        if budget <= 1 or ends.size == 0:
            return DraftTree.root(root, self.device)
        chains = self.buf.after(ends, min(self.opts.max_len, budget - 1))  # [C, L]
        frag = chain_trie(np.zeros(ends.size, dtype=np.int64), chains, self.log_decay, self.device)
        return frag.tree(root, self.device).cut(budget)

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        # one hash probe per node and n: cheaper than any device launch at these sizes
        tails = suffix_rows(tree, nodes, self.ctx[-self.opts.n_max :], self.opts.n_max)  # [Q, n_max]
        anchors, ends = [], []
        for q, row in zip(nodes.tolist(), tails.tolist()):
            hits = self.occurrences(tuple(row))
            anchors += [q] * len(hits)
            ends += hits
        if not ends or max_len < 1:
            return Fragment.empty(tree.device)
        chains = self.buf.after(np.asarray(ends, dtype=np.int64), min(self.opts.max_len, max_len))
        return chain_trie(np.asarray(anchors, dtype=np.int64), chains, self.log_decay, tree.device)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        pass


def suffix_rows(tree: DraftTree, nodes: torch.Tensor, ctx_tail: list[int], n: int) -> np.ndarray:
    """[Q, n] the last n tokens of context + root-to-node path for each of `nodes`, -1 before the start.

    `ctx_tail` is the context's last tokens (its last is the tree's root). One vectorised step per
    position back from the node: ancestors by pointer chasing, then the context above the root."""
    tok, par, dep = (t.cpu().numpy() for t in (tree.tokens, tree.parents, tree.depth))
    q = nodes.cpu().numpy()
    back_ctx = np.full(n + 1, -1, dtype=np.int64)  # back_ctx[a]: context token a places before the root
    back_ctx[: len(ctx_tail)] = ctx_tail[::-1]
    rows = np.empty((q.size, n), dtype=np.int64)
    anc = q.copy()
    for j in range(n):  # j tokens back from the node
        above = j - dep[q]  # >= 0: at or above the root, inside the context
        rows[:, n - 1 - j] = np.where(above >= 0, back_ctx[np.clip(above, 0, n)], tok[anc])
        anc = np.maximum(par[anc], 0)
    return rows


@RETRIEVERS.register("ngram", NgramOptions)
def build_ngram(opts: NgramOptions, vocab_size: int, device: torch.device) -> NgramRetriever:
    return NgramRetriever(opts, device)
