"""The acceptance model: how likely verification is to accept each candidate node, given that its parent
was accepted, calibrated online per source from what verification accepted.

Cells, each a Beta posterior (prior pseudo-counts plus evidence that fades by `memory` per step, so the
model follows a prompt that turns from chat to copying):
  drafted nodes    by depth and the drafter's own conditional probability exp(score - parent score),
                   in `BUCKETS` equal buckets; prior mean: the bucket's middle
  retrieved nodes  by retriever, depth and rank among their siblings from the same retriever (by score);
                   prior mean 0.3 / (1 + rank). A method's one retriever is retriever 0; a pool of several
                   (`retrievers/pool.py`) tags each node with the source that proposed it, so every source
                   gets its own cells, added (at the prior) when its first node is seen.
A node's path probability is the product of the conditionals on its path, so a child never exceeds its
parent; the expected tokens of a tree are 1 (the bonus token) plus the sum of its nodes' path probabilities.

The arithmetic runs in NumPy on the host: trees are a few dozen nodes, where each torch call would cost
more than the work (the planner's whole step budget is a fraction of a millisecond).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .tree import DraftTree, retriever_index

DEPTHS = 16  # deeper nodes share the last depth's cells
BUCKETS = 10  # draft conditional-probability buckets
RANKS = 8  # retrieved sibling ranks; lower ones share the last
PRIOR_STRENGTH = 2.0  # pseudo-observations per cell
MEMORY = 0.995  # evidence kept per step: about the last 200 steps count
RELIABILITY_BINS = 10  # predicted path probability bins of the calibration record


@dataclass(frozen=True)
class NodeArrays:
    """A tree's node arrays on the host."""

    parents: np.ndarray  # [N] int64, -1 for the root
    depth: np.ndarray  # [N] int64
    score: np.ndarray  # [N] float64
    retriever: np.ndarray  # [N] int64: the retriever that proposed the node, -1 for the root and drafted nodes

    @property
    def retrieved(self) -> np.ndarray:
        return self.retriever >= 0  # [N] bool

    @staticmethod
    def of(tree: DraftTree) -> "NodeArrays":
        ints = torch.stack([tree.parents, tree.depth, tree.source.long()]).cpu().numpy()  # one copy from the device
        return NodeArrays(ints[0], ints[1], tree.score.double().cpu().numpy(), retriever_index(ints[2]))


@dataclass(frozen=True)
class Prediction:
    cells: np.ndarray  # [N] int64 cell per node (the root's is unused)
    probs: np.ndarray  # [N] float64 path probabilities, root 1, never rising along a path


class AcceptanceModel:
    """Cells: the drafted ones (DEPTHS x BUCKETS), then DEPTHS x RANKS per retriever, in retriever order."""

    def __init__(self, prior_strength: float = PRIOR_STRENGTH, memory: float = MEMORY):
        self.prior_strength = prior_strength
        self.memory = memory
        draft_mean = np.tile((np.arange(BUCKETS) + 0.5) / BUCKETS, DEPTHS)  # [DEPTHS * B]
        self.prior_hits = prior_strength * draft_mean
        self.prior_tries = np.full_like(draft_mean, prior_strength)
        self.hits = np.zeros_like(draft_mean)  # evidence: accepted nodes per cell
        self.tries = np.zeros_like(draft_mean)  # evidence: nodes whose parent was accepted
        self.reliability_sums = np.zeros((RELIABILITY_BINS, 3))  # per bin: predicted sum, accepted, nodes
        self.retrievers = 0  # retrievers with cells
        self.add_retrievers(1)  # a method's one retriever; a pool's further sources are added as they appear

    def add_retrievers(self, n: int) -> None:
        """Cells for retrievers up to index n - 1, at their prior (evidence starts at none)."""
        if n <= self.retrievers:
            return
        mean = np.tile(0.3 / (1 + np.arange(RANKS)), DEPTHS * (n - self.retrievers))  # [new cells]
        self.prior_hits = np.concatenate([self.prior_hits, self.prior_strength * mean])
        self.prior_tries = np.concatenate([self.prior_tries, np.full_like(mean, self.prior_strength)])
        self.hits = np.concatenate([self.hits, np.zeros_like(mean)])
        self.tries = np.concatenate([self.tries, np.zeros_like(mean)])
        self.retrievers = n
        self.rates = (self.prior_hits + self.hits) / (self.prior_tries + self.tries)  # [C] P(accepted | parent accepted)

    # ---- per node ------------------------------------------------------------------------------
    def cells(self, nodes: NodeArrays) -> np.ndarray:
        """[N] the cell of each node (the root's is unused); adds the cells of a retriever seen first here."""
        parents = np.maximum(nodes.parents, 0)
        depth = np.clip(nodes.depth, 1, DEPTHS) - 1
        cond = np.exp(np.minimum(nodes.score - nodes.score[parents], 0.0))
        draft_cell = depth * BUCKETS + np.minimum((cond * BUCKETS).astype(np.int64), BUCKETS - 1)
        if not nodes.retrieved.any():
            return draft_cell
        self.add_retrievers(int(nodes.retriever.max()) + 1)
        # rank among siblings of the same source: by score, descending, within (parent, source) groups
        group = parents * (self.retrievers + 1) + nodes.retriever + 1  # source: drafted 0, retriever i i + 1
        order = np.lexsort((-nodes.score, group))
        g = group[order]
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size) - np.searchsorted(g, g)
        retrieved_cell = DEPTHS * BUCKETS + (nodes.retriever * DEPTHS + depth) * RANKS + np.minimum(rank, RANKS - 1)
        return np.where(nodes.retrieved, retrieved_cell, draft_cell)

    def predict(self, nodes: NodeArrays) -> Prediction:
        """Cells and path probabilities: conditionals multiplied down the tree, one depth level at a time."""
        cells = self.cells(nodes)
        cond = self.rates[cells]
        probs = np.ones(cond.size)
        by_depth = np.argsort(nodes.depth, kind="stable")
        bounds = np.searchsorted(nodes.depth[by_depth], np.arange(1, int(nodes.depth.max(initial=0)) + 2))
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # parents come before children, so depth order works
            level = by_depth[lo:hi]
            probs[level] = probs[nodes.parents[level]] * cond[level]
        return Prediction(cells, probs)

    def conditional(self, tree: DraftTree) -> np.ndarray:
        """[N] P(node accepted | parent accepted); the root's is 1."""
        cells = self.cells(NodeArrays.of(tree))  # first: it may add a retriever's cells to the rates
        cond = self.rates[cells]
        cond[0] = 1.0
        return cond

    def path_probs(self, tree: DraftTree) -> np.ndarray:
        """[N] P(the whole path to the node is accepted); the root's is 1."""
        return self.predict(NodeArrays.of(tree)).probs

    def expected_tokens(self, tree: DraftTree) -> float:
        """1 (the bonus token) + the sum of the nodes' path probabilities, root excluded."""
        return 1.0 + float(self.path_probs(tree)[1:].sum())

    # ---- for the cost-aware pruner ---------------------------------------------------------------
    def next_level_gain(self, level: int, best_score: float) -> float:
        """Expected tokens the next draft level adds through the best path so far: its nodes at depth
        level + 1 have cumulative draft log-probability `best_score`, read as `level + 1` equal
        conditionals; the next node is assumed as confident as their mean."""
        d = level + 1
        c = math.exp(min(0.0, best_score) / d)
        b = min(BUCKETS - 1, int(c * BUCKETS))
        depths = np.minimum(np.arange(1, d + 2), DEPTHS) - 1
        return float(np.prod(self.rates[depths * BUCKETS + b]))

    # ---- learning ------------------------------------------------------------------------------
    def observe(self, nodes: NodeArrays, path: np.ndarray, prediction: Prediction) -> None:
        """Learn from one verification of the predicted tree: every node whose parent was accepted was
        tried; the nodes on the accepted path (`path`, node ids, root first) succeeded."""
        on_path = np.zeros(nodes.parents.size, dtype=bool)
        on_path[path] = True
        tried = on_path[np.maximum(nodes.parents, 0)]
        tried[0] = False
        self.hits *= self.memory
        self.tries *= self.memory
        np.add.at(self.hits, prediction.cells[tried], on_path[tried])
        np.add.at(self.tries, prediction.cells[tried], 1.0)
        self.rates = (self.prior_hits + self.hits) / (self.prior_tries + self.tries)
        predicted = prediction.probs[1:]
        bins = np.minimum((predicted * RELIABILITY_BINS).astype(np.int64), RELIABILITY_BINS - 1)
        np.add.at(self.reliability_sums, (bins, 0), predicted)
        np.add.at(self.reliability_sums, (bins, 1), on_path[1:])
        np.add.at(self.reliability_sums, (bins, 2), 1.0)

    def reliability(self) -> list[list[float]]:
        """Per predicted-probability bin with nodes: [mean predicted path probability, share accepted,
        nodes]. A calibrated model lies on the diagonal."""
        s = self.reliability_sums
        return [[s[i, 0] / s[i, 2], s[i, 1] / s[i, 2], int(s[i, 2])] for i in range(RELIABILITY_BINS) if s[i, 2] > 0]
