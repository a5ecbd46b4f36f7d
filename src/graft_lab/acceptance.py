"""The acceptance model: how likely verification is to accept each candidate node, given that its parent
was accepted, calibrated online per source from what verification accepted.

Cells, each a Beta posterior (prior pseudo-counts plus evidence that fades by `memory` per step, so the
model follows a prompt that turns from chat to copying):
  drafted nodes    by depth and the drafter's own conditional probability exp(score - parent score),
                   in `BUCKETS` equal buckets; prior mean: the bucket's middle
  retrieved nodes  by depth and rank among their retrieved siblings (by score); prior mean 0.3 / (1 + rank)
A node's path probability is the product of the conditionals on its path, so a child never exceeds its
parent; the expected tokens of a tree are 1 (the bonus token) plus the sum of its nodes' path probabilities.
One model serves one method, so its retrieved cells are the method's retriever's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .tree import DraftTree, Source

DEPTHS = 16  # deeper nodes share the last depth's cells
BUCKETS = 10  # draft conditional-probability buckets
RANKS = 8  # retrieved sibling ranks; lower ones share the last
PRIOR_STRENGTH = 2.0  # pseudo-observations per cell
MEMORY = 0.995  # evidence kept per step: about the last 200 steps count
RELIABILITY_BINS = 10  # predicted path probability bins of the calibration record


class AcceptanceModel:
    def __init__(self, device: torch.device | str = "cpu", prior_strength: float = PRIOR_STRENGTH, memory: float = MEMORY):
        self.device = torch.device(device)
        self.memory = memory
        draft_mean = (torch.arange(BUCKETS, dtype=torch.float64) + 0.5) / BUCKETS  # [B]
        retrieved_mean = 0.3 / (1 + torch.arange(RANKS, dtype=torch.float64))  # [R]
        mean = torch.cat([draft_mean.repeat(DEPTHS), retrieved_mean.repeat(DEPTHS)])  # [C]
        self.prior_hits = (prior_strength * mean).to(self.device)
        self.prior_tries = torch.full_like(self.prior_hits, prior_strength)
        self.hits = torch.zeros_like(self.prior_hits)  # evidence: accepted nodes per cell
        self.tries = torch.zeros_like(self.prior_hits)  # evidence: nodes whose parent was accepted
        self.reliability_sums = np.zeros((RELIABILITY_BINS, 3))  # per bin: predicted sum, accepted, nodes
        self._update_rates()

    def _update_rates(self) -> None:
        self.rates = ((self.prior_hits + self.hits) / (self.prior_tries + self.tries)).float()  # [C]
        self._rates_np = self.rates.double().cpu().numpy()

    # ---- per node ------------------------------------------------------------------------------
    def cells(self, tree: DraftTree) -> torch.Tensor:
        """[N] the cell of each node (the root's is unused)."""
        n = tree.size
        idx = torch.arange(n, device=tree.device)
        parents = tree.parents.clamp(min=0)
        depth = (tree.depth.clamp(1, DEPTHS) - 1)
        cond = torch.exp((tree.score - tree.score[parents]).clamp(max=0.0))
        bucket = (cond * BUCKETS).long().clamp(0, BUCKETS - 1)
        retrieved = tree.source == int(Source.RETRIEVED)
        # rank among siblings of the same source: sort by score desc within (parent, source) groups
        group = parents * 2 + retrieved.long()
        order = torch.sort(-tree.score, stable=True).indices
        order = order[torch.sort(group[order], stable=True).indices]
        g = group[order]
        rank = torch.empty_like(idx)
        rank[order] = idx - torch.searchsorted(g, g)
        draft_cell = depth * BUCKETS + bucket
        retrieved_cell = DEPTHS * BUCKETS + depth * RANKS + rank.clamp(max=RANKS - 1)
        return torch.where(retrieved, retrieved_cell, draft_cell)

    def conditional(self, tree: DraftTree) -> torch.Tensor:
        """[N] P(node accepted | parent accepted); the root's is 1."""
        p = self.rates.to(tree.device)[self.cells(tree)]
        p[0] = 1.0
        return p

    def path_probs(self, tree: DraftTree) -> torch.Tensor:
        """[N] P(the whole path to the node is accepted): the product of the conditionals on the path,
        never above the parent's (the path minimum guards against rounding)."""
        logp = torch.log(self.conditional(tree).clamp(min=1e-12))
        return tree.path_min(torch.exp(tree.path_sum(logp)))

    def expected_tokens(self, tree: DraftTree) -> float:
        """1 (the bonus token) + the sum of the nodes' path probabilities, root excluded."""
        return float(self.path_probs(tree)[1:].sum()) + 1.0

    # ---- for the cost-aware pruner ---------------------------------------------------------------
    def next_level_gain(self, level: int, best_score: float) -> float:
        """Expected tokens the next draft level adds through the best path so far: its nodes at depth
        level + 1 have cumulative draft log-probability `best_score`, read as `level + 1` equal
        conditionals; the next node is assumed as confident as their mean."""
        d = level + 1
        c = math.exp(min(0.0, best_score) / d)
        b = min(BUCKETS - 1, int(c * BUCKETS))
        cells = [min(j, DEPTHS) - 1 for j in range(1, d + 2)]
        rates = self._rates_np[np.asarray(cells) * BUCKETS + b]
        return float(np.prod(rates))

    # ---- learning ------------------------------------------------------------------------------
    def observe(self, tree: DraftTree, path: torch.Tensor, probs: torch.Tensor | None = None) -> None:
        """Learn from one verification: every node whose parent was accepted was tried; the nodes on the
        accepted path (`path`, root first) succeeded. `probs` ([N], what was predicted) feeds the
        calibration record; default: the path probabilities now."""
        n = tree.size
        on_path = torch.zeros(n, dtype=torch.bool, device=tree.device)
        on_path[path] = True
        tried = on_path[tree.parents.clamp(min=0)]
        tried[0] = False
        cells = self.cells(tree)[tried]
        hit = on_path[tried].to(self.hits.dtype)
        predicted = (self.path_probs(tree) if probs is None else probs)[1:].double().cpu().numpy()
        accepted = on_path[1:].cpu().numpy()
        self.hits.mul_(self.memory).index_add_(0, cells.to(self.device), hit.to(self.device))
        self.tries.mul_(self.memory).index_add_(0, cells.to(self.device), torch.ones_like(hit).to(self.device))
        self._update_rates()
        bins = np.minimum((predicted * RELIABILITY_BINS).astype(np.int64), RELIABILITY_BINS - 1)
        np.add.at(self.reliability_sums, (bins, 0), predicted)
        np.add.at(self.reliability_sums, (bins, 1), accepted)
        np.add.at(self.reliability_sums, (bins, 2), 1.0)

    def reliability(self) -> list[list[float]]:
        """Per predicted-probability bin with nodes: [mean predicted path probability, share accepted,
        nodes]. A calibrated model lies on the diagonal."""
        s = self.reliability_sums
        return [[s[i, 0] / s[i, 2], s[i, 1] / s[i, 2], int(s[i, 2])] for i in range(RELIABILITY_BINS) if s[i, 2] > 0]
