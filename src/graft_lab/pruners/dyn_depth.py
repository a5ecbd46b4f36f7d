"""Dynamic-depth pruning (Graft): stop drafting at the first confident-enough checkpoint that fails.

At checkpoint level d (0 = the root's children) the confidence is c_d = exp(best cumulative log-prob at
that level), the probability of the likeliest draft path so far. If c_d < threshold_d drafting stops
there, and the draft keeps that stage's share of the budget K; retrieval fills the rest. A draft that
passes every checkpoint keeps the last share (default: all of K). Paper, K = 60, checkpoints 0, 1, 5:
draft/retrieval 8/52, 24/36, 40/20.

The pruner can record c_d per step (thresholds 0 never stop), which `graft_lab.pruners.calibrate` turns
into thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import PRUNERS


@dataclass
class DynDepthOptions:
    checkpoints: list[int] = field(default_factory=lambda: [0, 1, 5])  # draft levels checked, ascending
    thresholds: list[float] = field(default_factory=lambda: [0.5, 0.3, 0.1])  # stop at checkpoint i when c < thresholds[i]
    # draft nodes (root included) kept when drafting stops at checkpoint i; the last entry: passed them all
    draft_split: list[float] = field(default_factory=lambda: [8 / 60, 24 / 60, 40 / 60, 1.0])
    split_unit: str = "fraction"  # "fraction": shares of K; "count": node counts, capped at K

    def __post_init__(self):
        n = len(self.checkpoints)
        if n == 0 or any(c < 0 for c in self.checkpoints) or any(a >= b for a, b in zip(self.checkpoints, self.checkpoints[1:])):
            raise ConfigError(f"pruner.checkpoints must be distinct ascending levels >= 0, got {self.checkpoints}")
        if len(self.thresholds) != n or any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"pruner.thresholds needs one value in [0, 1] per checkpoint ({n}), got {self.thresholds}")
        if len(self.draft_split) != n + 1:
            raise ConfigError(f"pruner.draft_split needs {n + 1} values (one per checkpoint, then 'passed all'), got {len(self.draft_split)}")
        if self.split_unit == "fraction":
            if any(not 0.0 < s <= 1.0 for s in self.draft_split):
                raise ConfigError(f"pruner.draft_split fractions must lie in (0, 1], got {self.draft_split}")
        elif self.split_unit == "count":
            if any(s < 1 or s != int(s) for s in self.draft_split):
                raise ConfigError(f"pruner.draft_split counts must be integers >= 1, got {self.draft_split}")
        else:
            raise ConfigError(f"pruner.split_unit must be 'fraction' or 'count', got '{self.split_unit}'")


class DynDepthPruner:
    def __init__(self, opts: DynDepthOptions, record: bool = False):
        self.opts = opts
        self.stage_of = {level: i for i, level in enumerate(opts.checkpoints)}
        self.passed = len(opts.checkpoints)  # the stage of a draft that passed every checkpoint
        self.stage = self.passed
        self.record = record
        self.row = [math.nan] * self.passed
        self.confidences: list[list[float]] = []  # per draft: c_d per checkpoint, NaN where not reached

    def keep_drafting(self, level: int, best_score: float) -> bool:
        i = self.stage_of.get(level)
        if i is None:
            return True
        c = math.exp(best_score)
        self.row[i] = c
        if c < self.opts.thresholds[i]:
            self.stage = i
            return False
        return True

    def draft_budget(self, total: int, last_level: int) -> int:
        """Ends the draft: the stage it stopped at picks the share; the per-draft state resets."""
        share = self.opts.draft_split[self.stage]
        if self.record:
            self.confidences.append(self.row)
        self.stage, self.row = self.passed, [math.nan] * self.passed
        nodes = round(share * total) if self.opts.split_unit == "fraction" else int(share)
        return max(1, min(total, nodes))


@PRUNERS.register("dyn_depth", DynDepthOptions)
def build_dyn_depth(opts: DynDepthOptions, planner=None) -> DynDepthPruner:
    return DynDepthPruner(opts)
