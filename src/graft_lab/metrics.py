"""Per-step and per-turn figures: phase times, accepted length, tree composition, the planner's predictions;
run-level figures: tau, end-to-end and decode-only speedup, prefill's share, the cost model's calibration."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from .tree import DraftTree, Source, is_retrieved

if TYPE_CHECKING:
    from .planner import Plan

PHASES = ("draft", "retrieve", "graft", "plan", "verify", "accept", "update")
CALIBRATION_EDGES = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0)  # predicted tokens per step, bin lower edges


class PhaseTimer:
    """Wall time per named phase; synchronises CUDA so GPU work lands in the phase that launched it."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.times: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.times[name] += time.perf_counter() - t0

    def total(self, name: str) -> float:
        return self.times.get(name, 0.0)

    def elapsed(self) -> float:
        """Seconds of every finished phase since the last reset."""
        return sum(self.times.values())

    def reset(self) -> None:
        self.times = defaultdict(float)


@dataclass(frozen=True)
class StepRecord:
    accept_length: int  # tokens emitted this step: accepted tree nodes + the bonus token
    accepted_retrieved: int  # how many of the accepted nodes were retrieved
    tree_size: int
    drafted: int
    retrieved: int
    times: dict[str, float]
    predicted_tokens: float | None = None  # the planner's expected accept_length (tree=auto), else None
    predicted_time: float | None = None  # the planner's expected step seconds
    verify_ratio: float | None = None  # the profile's t_verify(tree_size) / t_verify(1) at this step

    @property
    def step_time(self) -> float:
        return sum(self.times.values())

    @staticmethod
    def of(tree: DraftTree, path: torch.Tensor, timer: PhaseTimer, plan: "Plan | None" = None) -> "StepRecord":
        src = tree.source
        retrieved = is_retrieved(src)  # [N] bool, whichever retriever proposed the node
        return StepRecord(
            accept_length=int(path.numel()),
            accepted_retrieved=int(retrieved[path].sum()),
            tree_size=tree.size,
            drafted=int((src == Source.DRAFT).sum()),
            retrieved=int(retrieved.sum()),
            times=dict(timer.times),
            predicted_tokens=plan.expected_tokens if plan else None,
            predicted_time=plan.expected_time if plan else None,
            verify_ratio=plan.verify_ratio if plan else None,
        )


@dataclass
class TurnStats:
    """One generated turn, as stored in answers.jsonl and aggregated into summary.json."""

    new_tokens: int
    wall_time: float  # seconds, prefill included
    accept_lengths: list[int]
    phase_times: dict[str, float]
    drafted: int  # tree nodes drafted, summed over steps
    retrieved: int
    accepted_retrieved: int
    peak_memory_mb: float = 0.0  # CUDA max allocated during the turn, or the process's peak RSS so far
    tree_sizes: list[int] = field(default_factory=list)  # per step: nodes verified (the chosen N)
    step_times: list[float] = field(default_factory=list)  # per step: measured seconds
    predicted_tokens: list[float | None] = field(default_factory=list)  # per step (tree=auto), else None
    predicted_times: list[float | None] = field(default_factory=list)
    verify_ratios: list[float | None] = field(default_factory=list)

    @staticmethod
    def of(tokens: list[int], steps: list[StepRecord], prefill_s: float, wall_time: float,
           peak_mb: float = 0.0) -> "TurnStats":
        phases: dict[str, float] = defaultdict(float, prefill=prefill_s)
        for s in steps:
            for k, v in s.times.items():
                phases[k] += v
        return TurnStats(
            new_tokens=len(tokens),
            wall_time=wall_time,
            accept_lengths=[s.accept_length for s in steps],
            phase_times=dict(phases),
            drafted=sum(s.drafted for s in steps),
            retrieved=sum(s.retrieved for s in steps),
            accepted_retrieved=sum(s.accepted_retrieved for s in steps),
            peak_memory_mb=peak_mb,
            tree_sizes=[s.tree_size for s in steps],
            step_times=[s.step_time for s in steps],
            predicted_tokens=[s.predicted_tokens for s in steps],
            predicted_times=[s.predicted_time for s in steps],
            verify_ratios=[s.verify_ratio for s in steps],
        )


def aggregate(turns: list[TurnStats], baseline: list[TurnStats] | None) -> dict:
    """Run-level figures: tau (bonus included), throughput, speedup over the interleaved AR baseline (end
    to end, and decode-only with prefill excluded), prefill's share, phase shares, per-position acceptance
    rates, and with tree=auto the planner's calibration and efficiency."""
    lengths = [a for t in turns for a in t.accept_lengths]
    steps = max(len(lengths), 1)
    tokens = sum(t.new_tokens for t in turns)
    wall = sum(t.wall_time for t in turns)
    phases: dict[str, float] = defaultdict(float)
    for t in turns:
        for k, v in t.phase_times.items():
            phases[k] += v
    total_phase = sum(phases.values()) or 1.0
    max_len = max(lengths, default=1)
    position_rate = [sum(a > d for a in lengths) / steps for d in range(1, max_len)]
    out = {
        "tau": sum(lengths) / steps,
        "new_tokens": tokens,
        "steps": len(lengths),
        "wall_time_s": wall,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "phase_time_s": dict(phases),
        "phase_share": {k: v / total_phase for k, v in phases.items()},
        "acceptance_by_position": position_rate,
        "drafted_per_step": sum(t.drafted for t in turns) / steps,
        "retrieved_per_step": sum(t.retrieved for t in turns) / steps,
        "accepted_retrieved_per_step": sum(t.accepted_retrieved for t in turns) / steps,
        "baseline_tokens_per_s": None,
        "speedup": None,
    }
    sizes = [n for t in turns for n in t.tree_sizes]
    out["mean_tree_size"] = sum(sizes) / len(sizes) if sizes else None
    out.update(decode_only(turns, ""))
    out.update(baseline_decode_tokens_per_s=None, baseline_prefill_share=None, decode_speedup=None)
    out["calibration"] = calibration(turns)
    if baseline:
        b_tokens = sum(t.new_tokens for t in baseline)
        b_wall = sum(t.wall_time for t in baseline)
        out["baseline_tokens_per_s"] = b_tokens / b_wall if b_wall else 0.0
        out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"] if out["baseline_tokens_per_s"] else None
        out.update(decode_only(baseline, "baseline_"))
        base = out["baseline_decode_tokens_per_s"]
        out["decode_speedup"] = out["decode_tokens_per_s"] / base if base else None
    out.update(efficiency(turns, out.get("decode_speedup")))
    return out


def decode_only(turns: list[TurnStats], prefix: str) -> dict:
    """Throughput with prefill excluded (the first token, which prefill yields, too) and prefill's share
    of the wall time."""
    wall = sum(t.wall_time for t in turns)
    prefill = sum(t.phase_times.get("prefill", 0.0) for t in turns)
    tokens = sum(max(0, t.new_tokens - 1) for t in turns)
    return {
        f"{prefix}decode_tokens_per_s": tokens / (wall - prefill) if wall > prefill else 0.0,
        f"{prefix}prefill_share": prefill / wall if wall else 0.0,
    }


def calibration(turns: list[TurnStats]) -> dict | None:
    """How well the planner predicted (tree=auto): tokens per step and step time, predicted against
    realised, over the steps with a prediction; None when there were none."""
    rows = [(p, a, pt, mt) for t in turns
            for p, a, pt, mt in zip(t.predicted_tokens, t.accept_lengths, t.predicted_times, t.step_times) if p is not None]
    if not rows:
        return None
    pred, real, p_time, m_time = (np.asarray(c, dtype=np.float64) for c in zip(*rows))
    bins = np.searchsorted(CALIBRATION_EDGES, pred, side="right") - 1
    return {
        "steps": len(rows),
        "predicted_tau": float(pred.mean()),
        "realised_tau": float(real.mean()),
        "tokens_error": float(np.abs(pred - real).mean()),  # mean |predicted - realised| tokens per step
        "tokens_ratio": float(real.sum() / pred.sum()),  # realised / predicted: 1 is calibrated
        "time_error": float((np.abs(p_time - m_time) / np.maximum(m_time, 1e-12)).mean()),  # relative
        "time_ratio": float(m_time.sum() / p_time.sum()),  # measured / predicted step time
        # per predicted-tokens bin: [lower edge, mean predicted, mean realised, steps]
        "bins": [[CALIBRATION_EDGES[b], float(pred[bins == b].mean()), float(real[bins == b].mean()), int((bins == b).sum())]
                 for b in range(len(CALIBRATION_EDGES)) if (bins == b).any()],
    }


def efficiency(turns: list[TurnStats], decode_speedup: float | None) -> dict:
    """Where a cost profile priced the steps: the ideal speedup tau x t(1) / t(N) (tokens per AR-step
    equivalent of verification, summed over steps) and the share of it the decode-only speedup reached."""
    rows = [(a, r) for t in turns for a, r in zip(t.accept_lengths, t.verify_ratios) if r is not None]
    if not rows:
        return {"ideal_speedup": None, "efficiency": None}
    ideal = sum(a for a, _ in rows) / sum(r for _, r in rows)
    return {"ideal_speedup": ideal, "efficiency": decode_speedup / ideal if decode_speedup else None}


def peak_memory_mb(device: torch.device) -> float:
    """CUDA max allocated on GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
