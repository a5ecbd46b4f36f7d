"""Suffix-automaton retrieval: copy what followed the longest suffix of the context seen before.

The automaton over prompt + output grows by one token in amortised O(1) (Blumer et al. 1985), and each
state keeps the end of its first occurrence, so the longest earlier match and its continuation are read
off without any search. It finds matches of any length, where `ngram` stops at n_max.

Score of a retrieved node: depth * log(decay) (one occurrence, so no counts to share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from ..tree import DraftTree
from .base import RETRIEVERS, Fragment, Successors, TokenBuffer, chain_trie


class SuffixAutomaton:
    """States are equivalence classes of substrings by end positions; state 0 is the empty string."""

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]  # transitions
        self.link: list[int] = [-1]  # suffix link: the longest suffix in another class
        self.length: list[int] = [0]  # longest string of the class
        self.first: list[int] = [-1]  # end position of the class's first occurrence
        self.last = 0  # the class of the whole sequence

    def _new(self, length: int, link: int, first: int, nxt: dict[int, int]) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first.append(first)
        return len(self.length) - 1

    def add(self, token: int, pos: int) -> None:
        """Append `token`, which sits at position `pos` of the sequence."""
        cur = self._new(self.length[self.last] + 1, 0, pos, {})
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new(self.length[p] + 1, self.link[q], self.first[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Extend a match (state, matched length) by `token`, dropping its oldest tokens as needed."""
        while state and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        nxt = self.next[state].get(token)
        return (nxt, length + 1) if nxt is not None else (0, 0)


@dataclass
class SamOptions:
    min_match: int = 1  # shortest matched suffix worth copying from
    max_len: int = 16  # tokens copied
    decay: float = 0.9  # per-token discount of the score

    def __post_init__(self):
        if self.min_match < 1 or self.max_len < 1:
            raise ConfigError(f"retriever.min_match and max_len must be >= 1, got {self.min_match}, {self.max_len}")
        if not 0.0 < self.decay <= 1.0:
            raise ConfigError(f"retriever.decay must be in (0, 1], got {self.decay}")


class SamRetriever:
    prefill_top_k = 0

    def __init__(self, opts: SamOptions, device: torch.device | str):
        self.opts = opts
        self.device = torch.device(device)
        self.log_decay = math.log(opts.decay)
        self.sam = SuffixAutomaton()
        self.buf = TokenBuffer()

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        self.sam, self.buf = SuffixAutomaton(), TokenBuffer()
        self.extend(prompt)

    def extend(self, tokens: torch.Tensor) -> None:
        new = tokens.tolist()
        for i, t in enumerate(new):
            self.sam.add(t, self.buf.n + i)
        self.buf.extend(new)

    def source(self, state: int, length: int) -> int:
        """End position of an earlier occurrence of the match (state, length) with something after it, or -1."""
        sam = self.sam
        if sam.first[state] >= self.buf.n - 1:  # only occurs at the very end: its suffix link occurs earlier too
            state = sam.link[state]
            length = sam.length[state]
        return sam.first[state] if state > 0 and length >= self.opts.min_match else -1

    def retrieve(self, budget: int) -> DraftTree:
        root = int(self.buf.data[self.buf.n - 1])
        end = self.source(self.sam.last, self.buf.n)
        if budget <= 1 or end < 0:
            return DraftTree.root(root, self.device)
        chains = self.buf.after(np.asarray([end]), min(self.opts.max_len, budget - 1))  # [1, L]
        return chain_trie(np.zeros(1, dtype=np.int64), chains, self.log_decay, self.device).tree(root, self.device)

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        # a walk down the tree, one amortised O(1) automaton step per node (pointer chasing: no batching)
        tok, par = tree.tokens.tolist(), tree.parents.tolist()
        state, length = [self.sam.last] + [0] * (tree.size - 1), [self.buf.n] + [0] * (tree.size - 1)
        for i in range(1, tree.size):
            state[i], length[i] = self.sam.step(state[par[i]], length[par[i]], tok[i])
        anchors = nodes.tolist()
        ends = np.asarray([self.source(state[q], length[q]) for q in anchors], dtype=np.int64)
        found = ends >= 0
        if not found.any() or max_len < 1:
            return Fragment.empty(tree.device)
        chains = self.buf.after(ends[found], min(self.opts.max_len, max_len))
        return chain_trie(np.asarray(anchors, dtype=np.int64)[found], chains, self.log_decay, tree.device)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        pass


@RETRIEVERS.register("sam", SamOptions)
def build_sam(opts: SamOptions, vocab_size: int, device: torch.device) -> SamRetriever:
    return SamRetriever(opts, device)
