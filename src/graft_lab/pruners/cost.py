"""Cost-aware pruning (tree=auto): draft the next level only while the tokens it is expected to add are
worth more than it costs on this machine.

After each level the planner's acceptance model estimates what one more level adds through the best path
(`AcceptanceModel.next_level_gain`), values it at the recent seconds per emitted token, and compares that
with the cost profile's price of a draft level (`CostPlanner.next_level_pays`). The draft keeps the whole
budget: the planner picks what gets verified. `dyn_depth` stays for reproducing the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .base import PRUNERS


@dataclass
class CostPrunerOptions:
    margin: float = 1.0  # draft on while expected gain x seconds per token >= margin x a level's cost

    def __post_init__(self):
        if self.margin < 0:
            raise ConfigError(f"pruner.margin must be >= 0, got {self.margin}")


class CostPruner:
    def __init__(self, opts: CostPrunerOptions, planner):
        if not hasattr(planner, "next_level_pays"):
            raise ConfigError("pruner=cost prices draft levels with the cost model: it needs tree=auto (tree.plan=auto)")
        self.margin = opts.margin
        self.planner = planner

    def keep_drafting(self, level: int, best_score: float) -> bool:
        return self.planner.next_level_pays(level, best_score, self.margin)

    def draft_budget(self, total: int, last_level: int) -> int:
        return total


@PRUNERS.register("cost", CostPrunerOptions)
def build_cost(opts: CostPrunerOptions, planner=None) -> CostPruner:
    return CostPruner(opts, planner)
