"""Per-step and per-turn figures: phase times, accepted length, tree composition."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .tree import DraftTree, Source

PHASES = ("draft", "retrieve", "graft", "verify", "accept", "update")


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

    @staticmethod
    def of(tree: DraftTree, path: torch.Tensor, timer: PhaseTimer) -> "StepRecord":
        src = tree.source
        return StepRecord(
            accept_length=int(path.numel()),
            accepted_retrieved=int((src[path] == Source.RETRIEVED).sum()),
            tree_size=tree.size,
            drafted=int((src == Source.DRAFT).sum()),
            retrieved=int((src == Source.RETRIEVED).sum()),
            times=dict(timer.times),
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
        )


def aggregate(turns: list[TurnStats], baseline: list[TurnStats] | None) -> dict:
    """Run-level figures: tau (bonus included), throughput, speedup over the interleaved AR baseline,
    phase shares and per-position acceptance rates."""
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
    if baseline:
        b_tokens = sum(t.new_tokens for t in baseline)
        b_wall = sum(t.wall_time for t in baseline)
        out["baseline_tokens_per_s"] = b_tokens / b_wall if b_wall else 0.0
        out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"] if out["baseline_tokens_per_s"] else None
    return out


def peak_memory_mb(device: torch.device) -> float:
    """CUDA max allocated on GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
