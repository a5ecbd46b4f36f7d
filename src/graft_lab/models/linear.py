"""The target's (and the drafter's) linear layers on CPU: `model.linear=onednn` swaps every nn.Linear for a
PackedLinear, whose weight is reordered once into oneDNN's blocked layout, so that no call repacks it.

Why: verification multiplies a few rows (the tree's nodes) by every weight. On the CPUs we measured, torch's
default CPU GEMM handles 2-16 rows far worse than one row (2 rows cost 1.9x one row over SmolLM2's weights),
while oneDNN's prepacked GEMM costs about 1.06x. The packed GEMM is also row-invariant: each row's result is
bit-identical whether it is computed alone or among others, so a batched verify forward's linear layers
agree exactly with a one-token forward's (tests/test_linear.py).

`auto` packs where oneDNN supports the weights' dtype on this CPU (fp32 on any x86 CPU; bf16 needs
avx512bw/vl/dq or avx_ne_convert) and keeps torch's kernel elsewhere (GPUs, fp16, bf16 on AVX2).
`python -m benchmarks.verify_cost --linear torch onednn` measures both side by side.
"""

from __future__ import annotations

import torch
from torch import nn

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
    """`auto` -> `onednn` where it is supported, else `torch`; an explicit `onednn` must be supported."""
    if linear not in LINEARS:
        raise ValueError(f"unknown linear '{linear}'; valid: {', '.join(LINEARS)}")
    supported = onednn_supports(dtype, device)
    if linear == "onednn" and not supported:
        raise ValueError(f"linear=onednn is not supported for {str(dtype).removeprefix('torch.')} on {device} "
                         "here (oneDNN packs fp32 on x86 CPUs, bf16 only with AVX-512 or AVX-NE-CONVERT); "
                         "use linear=auto or torch")
    return "onednn" if linear == "onednn" or (linear == "auto" and supported) else "torch"


class PackedLinear(nn.Module):
    """An inference-only nn.Linear: `weight` stays the original parameter (ties and parameter counts hold),
    the product uses a oneDNN copy of it, packed once."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._bias = None if linear.bias is None else linear.bias.detach()  # detached once, not per call
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features).contiguous(), self.packed, self._bias,
                                               "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


@torch.no_grad()
def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` (in place) by a PackedLinear; returns how many."""
    swaps = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
