"""The planning stage between graft and verify: which nodes of the merged candidate tree to verify.

`FixedPlanner` (a fixed tree: tree=k3, default, ...) verifies the grafted tree as it is. `CostPlanner`
(tree=auto, where K is a cap) keeps, each step, the ancestor-closed subset and the size N that maximise

    expected tokens / (time spent so far this step + t_verify(N) + the rest of the step)

with the acceptance model's path probabilities and the machine's cost profile. Path probability never
rises along a path, so the N nodes with the highest path probabilities (parents first on ties) are
ancestor-closed and the best subset of each size is a prefix of one order. N = 1, a plain AR step, wins
when nothing pays. Expected tokens rise with N, so a size that a bigger, cheaper one dominates is never
the best: the choice always sits on the profile's lower envelope (it fills up to the cheapest size).
The choice of tree never changes the output: verification alone decides what is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .acceptance import AcceptanceModel, NodeArrays, Prediction
from .profile import CostProfile
from .tree import DraftTree

MEASURED_BEFORE_PLAN = ("draft", "retrieve", "graft")  # the phases `spent` covers
EMA_RATE = 0.1


@dataclass(frozen=True)
class Plan:
    tree: DraftTree  # the nodes to verify
    prefix: int = 0  # committed positions before the root
    prediction: Prediction | None = None  # cells and path probabilities of tree's nodes; None: a fixed tree
    expected_tokens: float | None = None  # 1 + the path probabilities of tree's non-root nodes
    expected_time: float | None = None  # predicted seconds of the whole step
    verify_ratio: float | None = None  # t_verify(N) / t_verify(1) by the profile at this prefix


class Planner(Protocol):
    def plan(self, tree: DraftTree, prefix: int, spent: float) -> Plan:
        """Choose what to verify from the grafted `tree`; `spent`: seconds of this step so far."""

    def observe(self, plan: Plan, path: torch.Tensor, times: dict[str, float]) -> None:
        """Learn from the verified plan, its accepted path ([M] node ids) and the step's phase times."""


class FixedPlanner:
    """A fixed tree: verify what grafting built, predict nothing."""

    def plan(self, tree: DraftTree, prefix: int, spent: float) -> Plan:
        return Plan(tree, prefix)

    def observe(self, plan: Plan, path: torch.Tensor, times: dict[str, float]) -> None:
        pass


class CostPlanner:
    def __init__(self, profile: CostProfile, acceptance: AcceptanceModel, cap: int):
        self.profile = profile
        self.acceptance = acceptance
        self.cap = cap
        self.rest_s = 0.0  # EMA: seconds of a step after verify (plan, accept, update)
        self.seconds_per_token = profile.verify_time(1, profile.prefixes[0])  # EMA of step time / tokens

    def plan(self, tree: DraftTree, prefix: int, spent: float) -> Plan:
        nodes = NodeArrays.of(tree)
        pred = self.acceptance.predict(nodes)  # path probabilities [N], root 1
        n_max = min(tree.size, self.cap)
        key = -pred.probs
        key[0] = -np.inf  # the root first
        order = np.lexsort((np.arange(tree.size), nodes.depth, key))[:n_max]  # best first; ties: parents first
        expected = np.cumsum(pred.probs[order])  # [n_max] E(n) = 1 + the best n - 1 path probabilities
        verify = self.profile.curve(prefix)[:n_max]  # [n_max] t_verify(n)
        total = spent + verify + self.rest_s
        rate = expected / total
        n = n_max - int(np.argmax(rate[::-1]))  # the best rate; on a tie, the bigger tree
        keep = np.sort(order[:n])
        chosen = tree if n == tree.size else tree.select(torch.from_numpy(keep).to(tree.device))
        return Plan(chosen, prefix, Prediction(pred.cells[keep], pred.probs[keep]), float(expected[n - 1]),
                    float(total[n - 1]), float(verify[n - 1] / verify[0]))

    def observe(self, plan: Plan, path: torch.Tensor, times: dict[str, float]) -> None:
        self.acceptance.observe(NodeArrays.of(plan.tree), path.cpu().numpy(), plan.prediction)
        verify = times.get("verify", 0.0)
        self.profile.observe(plan.tree.size, plan.prefix, verify)
        step = sum(times.values())
        rest = step - verify - sum(times.get(k, 0.0) for k in MEASURED_BEFORE_PLAN)
        self.rest_s += EMA_RATE * (rest - self.rest_s)
        self.seconds_per_token += EMA_RATE * (step / max(1, path.numel()) - self.seconds_per_token)

    def next_level_pays(self, level: int, best_score: float, margin: float = 1.0) -> bool:
        """Whether drafting one more level is worth its cost: the tokens it is expected to add, valued at
        the recent seconds per token, against the profile's cost of a draft level."""
        gain = self.acceptance.next_level_gain(level, best_score)
        return gain * self.seconds_per_token >= margin * self.profile.draft_level_now


def build_planner(plan: str, target, drafter, cap: int, model_id: str, drafter_id: str) -> Planner:
    """`fixed`: the identity; `auto`: the cost model (its profile read from the cache or measured now)."""
    if plan == "fixed":
        return FixedPlanner()
    from .profile import profile_for

    profile, path, cached = profile_for(target, drafter, model_id, drafter_id, cap)
    took = "" if cached else f" in {profile.measure_s:.1f} s"
    print(f"[graft-lab] cost profile {profile.note}{took} -> {path}")
    return CostPlanner(profile, AcceptanceModel(), cap)
