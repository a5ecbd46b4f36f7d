"""The one draft-tree type that drafters, retrievers, grafting, verification and acceptance share.

A tree is five aligned 1-D tensors. Node 0 is the root: the last emitted token, not yet in the target's
KV cache. Parents always come before their children, so any prefix of the node list is itself a tree and
"ancestors sorted by index" is the same as "ancestors sorted by depth". Everything derived from the tree
(attention mask, position ids, root-to-leaf paths) is computed with a loop over depth levels at most,
never over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from enum import IntEnum

import torch


class Source(IntEnum):
    """Where a node came from; kept per node so metrics can split drafted from retrieved tokens, and the
    acceptance model can calibrate each source apart.

    A retrieved node's value also says which retriever proposed it: RETRIEVED + i for the i-th source of a
    pool of retrievers (`retrievers/pool.py`), RETRIEVED itself for a method's one retriever. The three
    functions below are the only place that encoding is read or written."""

    ROOT = 0
    DRAFT = 1
    RETRIEVED = 2


MAX_RETRIEVERS = 127 - int(Source.RETRIEVED)  # sources a pool can tell apart in the int8 `source`


def retrieved_by(index: int) -> int:
    """The source value of nodes that retriever `index` of a pool proposed (0: a method's only retriever)."""
    if not 0 <= index < MAX_RETRIEVERS:
        raise ValueError(f"a retriever index must be in 0..{MAX_RETRIEVERS - 1}, got {index}")
    return int(Source.RETRIEVED) + index


def is_retrieved(source: torch.Tensor) -> torch.Tensor:
    """bool [N]: the retrieved nodes, whichever retriever proposed them. `source`: [N] Source values, as
    a tensor or a NumPy array (so is the result, here and in `retriever_index`)."""
    return source >= int(Source.RETRIEVED)


def retriever_index(source: torch.Tensor) -> torch.Tensor:
    """[N] the index of the retriever that proposed each node, -1 for the root and drafted nodes."""
    return source.clip(int(Source.DRAFT)) - int(Source.RETRIEVED)


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor  # [N] int64 token ids
    parents: torch.Tensor  # [N] int64, parents[0] == -1, parents[i] < i
    depth: torch.Tensor  # [N] int64, depth[0] == 0
    score: torch.Tensor  # [N] float32: cumulative log-probability or a retrieval score (root: 0)
    source: torch.Tensor  # [N] int8, a Source value

    # ---- construction -------------------------------------------------------------------------
    @staticmethod
    def root(token: int | torch.Tensor, device: torch.device | str = "cpu") -> "DraftTree":
        """A one-node tree: what autoregressive decoding verifies every step."""
        tok = torch.as_tensor(token, dtype=torch.long, device=device).reshape(1)
        return DraftTree(
            tokens=tok,
            parents=torch.full((1,), -1, dtype=torch.long, device=device),
            depth=torch.zeros(1, dtype=torch.long, device=device),
            score=torch.zeros(1, dtype=torch.float32, device=device),
            source=torch.full((1,), int(Source.ROOT), dtype=torch.int8, device=device),
        )

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def select(self, keep: torch.Tensor) -> "DraftTree":
        """Sub-tree of the nodes in `keep` (ascending indices, ancestor-closed, containing 0)."""
        # keep: [M] ascending node indices
        remap = torch.full((self.size,), -1, dtype=torch.long, device=self.device)
        remap[keep] = torch.arange(keep.numel(), device=self.device)
        old_parents = self.parents[keep]
        new_parents = torch.where(old_parents >= 0, remap[old_parents.clamp(min=0)], old_parents)
        if bool((new_parents[1:] < 0).any()):
            raise ValueError("select() needs an ancestor-closed set of nodes that contains the root")
        return DraftTree(self.tokens[keep], new_parents, self.depth[keep], self.score[keep], self.source[keep])

    def add_subtree(
        self,
        under: torch.Tensor,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        score: torch.Tensor,
        source: Source | torch.Tensor,
    ) -> "DraftTree":
        """Append a fragment. `parents[i] == -1` hangs node i under `under[i]` (a node of self);
        otherwise it indexes an earlier node of the fragment. Duplicate children are folded (the earlier
        node, and so its source, wins). `source`: one Source for every node, or [M] values per node."""
        # under: [M] node of self per fragment node (used where parents == -1); tokens/parents/score: [M]
        n = self.size
        attach = parents < 0
        glob_parents = torch.where(attach, under, parents + n)
        base_depth = torch.where(attach, self.depth[under.clamp(min=0)], torch.zeros_like(parents))
        depth = base_depth + 1
        # fragment-internal depths: a level loop (fragments are shallow), never a node loop
        for _ in range(int(tokens.numel())):
            inner = ~attach
            if not bool(inner.any()):
                break
            new_depth = torch.where(inner, depth[parents.clamp(min=0)] + 1, depth)
            if torch.equal(new_depth, depth):
                break
            depth = new_depth
        merged = DraftTree(
            tokens=torch.cat([self.tokens, tokens.to(self.tokens)]),
            parents=torch.cat([self.parents, glob_parents]),
            depth=torch.cat([self.depth, depth]),
            score=torch.cat([self.score, score.to(self.score)]),
            source=torch.cat([self.source, torch.as_tensor(source, dtype=torch.int8, device=self.device).expand(tokens.shape)]),
        )
        return merged.fold_duplicates()

    def fold_duplicates(self) -> "DraftTree":
        """Merge every child whose (parent, token) already exists: the earlier node wins, keeps the higher
        score, and adopts the later node's children. One vectorised pass per depth level."""
        if self.size <= 1:
            return self
        canon = torch.arange(self.size, device=self.device)
        parents = self.parents.clone()
        score = self.score.clone()
        for d in range(1, self.max_depth + 1):
            level = (self.depth == d).nonzero().squeeze(1)
            if level.numel() < 2:
                parents[level] = canon[parents[level]]
                continue
            parents[level] = canon[parents[level]]
            key = parents[level] * (int(self.tokens.max()) + 1) + self.tokens[level]
            uniq, inverse = torch.unique(key, return_inverse=True)
            first = torch.full((uniq.numel(),), self.size, dtype=torch.long, device=self.device)
            first = first.scatter_reduce(0, inverse, level, reduce="amin")
            canon[level] = first[inverse]
            best = torch.full((uniq.numel(),), float("-inf"), device=self.device)
            best = best.scatter_reduce(0, inverse, score[level], reduce="amax")
            score[first] = best
        keep = (canon == torch.arange(self.size, device=self.device)).nonzero().squeeze(1)
        folded = DraftTree(self.tokens, parents, self.depth, score, self.source)
        return folded.select(keep) if keep.numel() < self.size else folded

    def cut(self, budget: int, rank: torch.Tensor | None = None) -> "DraftTree":
        """Keep the best `budget` nodes, ancestor-closed. A node ranks by the minimum `rank` (default: its
        score) on its path, so no child outranks its parent; ties go to the shallower, earlier node. The
        path minimum uses pointer doubling: log2(depth) vectorised steps, fine for long retrieved chains."""
        if budget < 1:
            raise ValueError(f"tree budget must be >= 1, got {budget}")
        if self.size <= budget:
            return self
        path_min = (self.score if rank is None else rank).clone().float()
        path_min[0] = float("inf")
        anc = self.parents.clamp(min=0)
        for _ in range(max(1, self.max_depth).bit_length()):
            path_min = torch.minimum(path_min, path_min[anc])
            anc = anc[anc]
        # lexicographic order: path_min desc, depth asc, index asc (sort is stable)
        order = torch.sort(self.depth, stable=True).indices
        order = order[torch.sort(-path_min[order], stable=True).indices]
        return self.select(torch.sort(order[:budget]).values)

    # ---- what verification needs --------------------------------------------------------------
    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """bool [N, N]: True where node j is node i or one of its ancestors. Computed once per tree:
        verification and acceptance both need it, and a tree never changes. Treat it as read-only."""
        n = self.size
        idx = torch.arange(n, device=self.device)
        mask = torch.zeros(n, n, dtype=torch.bool, device=self.device)
        mask[idx, idx] = True
        anc = self.parents.clone()
        for _ in range(self.max_depth):
            has = anc >= 0
            mask[idx[has], anc[has]] = True
            anc = torch.where(has, self.parents[anc.clamp(min=0)], anc)
        return mask

    def position_ids(self, start: int) -> torch.Tensor:
        """[N] absolute positions: the root sits at `start` (the current cache length)."""
        return self.depth + start

    def paths(self) -> torch.Tensor:
        """[L, max_depth + 1] node indices of each root-to-leaf path, -1 padded (EAGLE's retrieve indices)."""
        is_parent = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        is_parent[self.parents[1:]] = True
        leaves = (~is_parent).nonzero().squeeze(1)
        anc = self.ancestor_mask[leaves]  # [L, N]
        out = torch.full((leaves.numel(), self.max_depth + 1), -1, dtype=torch.long, device=self.device)
        rows, nodes = anc.nonzero(as_tuple=True)
        out[rows, self.depth[nodes]] = nodes
        return out

    def children_count(self) -> torch.Tensor:
        """[N] number of children per node."""
        count = torch.zeros(self.size, dtype=torch.long, device=self.device)
        return count.index_add_(0, self.parents[1:], torch.ones_like(self.parents[1:]))

    def check(self) -> None:
        """Raise if an invariant is broken: parent order, depths, root, no duplicate siblings."""
        n = self.size
        if n < 1 or int(self.parents[0]) != -1 or int(self.depth[0]) != 0:
            raise AssertionError("node 0 must be the root (parent -1, depth 0)")
        idx = torch.arange(n, device=self.device)
        if n > 1:
            p = self.parents[1:]
            if bool((p < 0).any()) or bool((p >= idx[1:]).any()):
                raise AssertionError("parents must come before children")
            if not torch.equal(self.depth[1:], self.depth[p] + 1):
                raise AssertionError("depth must be parent depth + 1")
            key = p * (int(self.tokens.max()) + 1) + self.tokens[1:]
            if torch.unique(key).numel() != n - 1:
                raise AssertionError("duplicate (parent, token) siblings")


@dataclass(frozen=True)
class TreeShape:
    """A verification budget and the draft expansion that goes with it."""

    total_tokens: int  # K: nodes verified per step, root included
    depth: int  # draft levels
    top_k: int  # children per expanded node


def tree_shape(budget: int) -> TreeShape:
    """The dense EAGLE-3 shape for a budget K, the one rule every preset, benchmark and evaluation uses:
    depth K-1 up to EAGLE's 7, and about K/6 children per node up to EAGLE's 10 (K=60 gives 7 x 10)."""
    if budget < 1:
        raise ValueError(f"a tree budget must be >= 1, got {budget}")
    return TreeShape(budget, max(1, min(7, budget - 1)), max(1, min(10, round(budget / 6))))


CHAIN = TreeShape(total_tokens=8, depth=7, top_k=1)  # one candidate per level: EAGLE-3's chain
