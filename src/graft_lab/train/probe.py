"""Pick the training dtypes on the machine that trains, by timing them there: the target's feature prefill in fp32
or bf16, and the drafter's TTT step with or without bf16 autocast. CPUs with AMX or avx512_bf16 run bf16 several
times faster than fp32; an AVX2-only CPU runs it several times slower (MODEL_CARD.md gives both)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from ..models.target import Target
from .features import target_features
from .ttt import ttt_loss


@dataclass(frozen=True)
class Choice:
    target_dtype: str  # "float32" or "bfloat16"
    autocast: bool
    seconds: dict  # what each option took on the probe sequence (fastest of the repeats)

    def line(self) -> str:
        times = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.seconds.items())
        return f"[train] dtypes measured here ({times}): target {self.target_dtype}, drafter autocast {self.autocast}"


def _fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def choose(target32: Target, net, keep: torch.Tensor, tokens: int = 96, repeats: int = 2, steps: int = 3,
           dtypes: tuple[str, ...] = ("float32", "bfloat16"), autocasts: tuple[bool, ...] = (False, True),
           timer=_fastest) -> Choice:
    """Time one feature prefill per target dtype and one TTT forward + backward per autocast mode on a random
    `tokens`-long sequence; keep the fastest of each. `target32` is the fp32 target; `net` a drafter for it."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target32.vocab_size, (tokens,), generator=gen)
    mask = torch.ones(tokens, dtype=torch.bool)
    seconds = {}
    for name in dtypes:
        model = target32.model if name == "float32" else copy.deepcopy(target32.model).to(getattr(torch, name))
        tgt = Target(model, target32.tokenizer)
        seconds[f"prefill {name}"] = timer(lambda: target_features(tgt, ids, keep), repeats)
    f = target_features(target32, ids, keep)
    t2d = torch.full((target32.vocab_size,), -1, dtype=torch.long)
    t2d[keep] = torch.arange(keep.numel())

    def ttt(autocast: bool):
        loss, _ = ttt_loss(net, ids, mask, f.aux, f.embeds, f.draft_logits, t2d, steps, "soft", 0.8, autocast)
        loss.backward()
        net.zero_grad(set_to_none=True)

    for ac in autocasts:
        seconds[f"ttt autocast={ac}"] = timer(lambda: ttt(ac), repeats)
    dtype = min(dtypes, key=lambda d: seconds[f"prefill {d}"])
    autocast = min(autocasts, key=lambda a: seconds[f"ttt autocast={a}"])
    return Choice(dtype, autocast, seconds)
