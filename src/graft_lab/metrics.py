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
