"""Pruners decide, level by level, whether drafting goes deeper, and how much of the budget the draft
may keep once it stops (the rest is left to retrieval)."""

from __future__ import annotations

from typing import Protocol

from ..registry import Registry


class Pruner(Protocol):
    def keep_drafting(self, level: int, best_score: float) -> bool:
        """Called after draft level `level` (0 = the root's children) exists; `best_score` is the highest
        cumulative log-probability at that level. False stops drafting there."""

    def draft_budget(self, total: int, last_level: int) -> int:
        """Nodes (root included) the draft may keep when its deepest level is `last_level`."""


PRUNERS: Registry[Pruner] = Registry("pruner")  # factories get the method's planner (pruner=cost uses it)


class NoPruner:
    """Dense drafting: every level, the whole budget."""

    def keep_drafting(self, level: int, best_score: float) -> bool:
        return True

    def draft_budget(self, total: int, last_level: int) -> int:
        return total


@PRUNERS.register("none")
def build_none(planner=None) -> NoPruner:
    return NoPruner()
