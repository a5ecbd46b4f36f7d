"""The target's (and the drafter's) linear layers on CPU: `model.linear=onednn` swaps every nn.Linear for a
PackedLinear, whose weight is reordered once into oneDNN's blocked layout, so that no call repacks it.

Why: verification multiplies a few rows (the tree's nodes) by every weight. On the CPUs we measured, torch's
default CPU GEMM handles 2-16 rows far worse than one row (2 rows cost 1.9x one row over SmolLM2's weights),
while oneDNN's prepacked GEMM costs about 1.06x. The packed GEMM is also row-invariant: each row's result is
bit-identical whether it is computed alone or among others, so a batched verify forward's linear layers
agree exactly with a one-token forward's (tests/test_linear.py).

`auto` decides on the machine it runs on, at load time. Where oneDNN cannot pack the weights' dtype (GPUs,
fp16, bf16 without avx512bw/vl/dq or avx_ne_convert) it keeps torch's kernel. Elsewhere it times one pass over
every linear layer of the model with both kernels, at 1 row (an AR step) and 8 rows (a verify), interleaved,
the fastest of 3 (about a second for SmolLM2-135M), and keeps the faster sum (`time_linears`). Packing won
at every row count on the CPU we measured; a CPU where it loses keeps torch's kernel.
`python -m benchmarks.verify_cost --linear torch onednn` measures both over whole verify steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TIMED_ROWS = (1, 8)  # rows per product `auto` times: an AR step's, and a typical verify's
TIMED_REPEATS = 3

LINEARS = ("auto", "torch", "onednn")


def onednn_supports(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN can prepack `dtype` weights on this device and CPU (a trial reorder of a tiny weight)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), None)
        return True
    except (RuntimeError, AttributeError):
        return False


def resolve_linear(linear: str, dtype: torch.dtype, device: torch.device) -> str:
    """The candidate kernel: `auto` -> `onednn` where it is supported (then timed against torch's by
    `Target.use_linear`), else `torch`; an explicit `onednn` must be supported."""
    if linear not in LINEARS:
        raise ValueError(f"unknown linear '{linear}'; valid: {', '.join(LINEARS)}")
    supported = onednn_supports(dtype, device)
    if linear == "onednn" and not supported:
        raise ValueError(f"linear=onednn is not supported for {str(dtype).removeprefix('torch.')} on {device} "
                         "here (oneDNN packs fp32 on x86 CPUs, bf16 only with AVX-512 or AVX-NE-CONVERT); "
                         "use linear=auto or torch")
    return "onednn" if linear == "onednn" or (linear == "auto" and supported) else "torch"


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # x: [R, in], packed: oneDNN's copy of an [out, in] weight, bias: [out] -> [R, out]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@dataclass(frozen=True)
class LinearTiming:
    """Seconds of one pass over every linear layer of a model, per kernel, at each of `rows`."""

    rows: tuple[int, ...]
    torch_s: tuple[float, ...]
    onednn_s: tuple[float, ...]

    @property
    def faster(self) -> str:
        return "onednn" if sum(self.onednn_s) < sum(self.torch_s) else "torch"

    def describe(self) -> str:
        cells = ", ".join(f"{r} row{'s' * (r > 1)} {1e3 * o:.1f} ms packed vs {1e3 * t:.1f} ms torch"
                          for r, t, o in zip(self.rows, self.torch_s, self.onednn_s))
        return f"{self.faster} (every linear layer, timed now: {cells})"


@torch.no_grad()
def time_linears(module: nn.Module, rows: tuple[int, ...] = TIMED_ROWS, repeats: int = TIMED_REPEATS
                 ) -> tuple[LinearTiming, dict[nn.Linear, torch.Tensor]]:
    """Both kernels over every nn.Linear under `module`, at each row count, interleaved, the fastest of
    `repeats` after a warm-up pass. Returns the timing and the packed weights (for `pack_linears`)."""
    linears = [m for m in module.modules() if type(m) is nn.Linear]
    packed = {m: torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None) for m in linears}
    bias = {m: None if m.bias is None else m.bias.detach() for m in linears}
    widths = {m.in_features for m in linears}
    best = {(kernel, r): float("inf") for kernel in ("torch", "onednn") for r in rows}
    for rep in range(repeats + 1):
        for r in rows:
            x = {w: torch.randn(r, w, dtype=linears[0].weight.dtype) for w in widths}
            for kernel in ("torch", "onednn"):
                t0 = time.perf_counter()
                for m in linears:
                    if kernel == "torch":
                        F.linear(x[m.in_features], m.weight, m.bias)
                    else:
                        packed_product(x[m.in_features], packed[m], bias[m])
                if rep:  # the first pass warms up
                    best[kernel, r] = min(best[kernel, r], time.perf_counter() - t0)
    timing = LinearTiming(tuple(rows), tuple(best["torch", r] for r in rows), tuple(best["onednn", r] for r in rows))
    return timing, packed


class PackedLinear(nn.Module):
    """An inference-only nn.Linear: `weight` stays the original parameter (ties and parameter counts hold),
    the product uses a oneDNN copy of it, packed once."""

    def __init__(self, linear: nn.Linear, packed: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._bias = None if linear.bias is None else linear.bias.detach()  # detached once, not per call
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        y = packed_product(x.reshape(-1, self.in_features).contiguous(), self.packed, self._bias)
        return y.view(*x.shape[:-1], self.out_features)


@torch.no_grad()
def pack_linears(module: nn.Module, packed: dict[nn.Linear, torch.Tensor] | None = None) -> int:
    """Replace every nn.Linear under `module` (in place) by a PackedLinear, reusing the weights `packed`
    already holds (from `time_linears`); returns how many."""
    packed = packed or {}
    swaps = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child, packed.get(child)))
    return len(swaps)
