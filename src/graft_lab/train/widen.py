"""Widen the drafter's MLP without changing what it computes: a capacity lever inside the official
EAGLE-3 format (one decoder layer; `intermediate_size` is a config field that every loader reads)."""

from __future__ import annotations

import torch

MLP = "midlayer.mlp."


def mlp_width(state: dict) -> int:
    """The MLP width (intermediate size) of a drafter state dict."""
    return state[MLP + "gate_proj.weight"].shape[0]


def widen_mlp(state: dict, width: int, generator: torch.Generator | None = None) -> dict:
    """A drafter state dict whose MLP has `width` hidden units, computing exactly what `state` computes.

    The trained units stay. Each new unit gets gate / up rows drawn with the trained rows' per-matrix
    standard deviation and a zero column in down_proj, so its output is 0 until training moves that column
    (down_proj's gradient there is the unit's activation, which is not 0): the first step starts from the
    trained drafter's loss, not from a perturbed one."""
    old = mlp_width(state)
    if width < old:
        raise ValueError(f"cannot widen a {old}-unit MLP to {width} units: give a width of at least {old}")
    if width == old:
        return dict(state)
    new = dict(state)
    for name in ("gate_proj", "up_proj"):
        w = state[MLP + name + ".weight"]  # [I, H]
        fresh = torch.randn(width - old, w.shape[1], generator=generator, dtype=torch.float32) * w.float().std()
        new[MLP + name + ".weight"] = torch.cat([w, fresh.to(w.dtype)], 0)
    down = state[MLP + "down_proj.weight"]  # [H, I]
    new[MLP + "down_proj.weight"] = torch.cat([down, down.new_zeros(down.shape[0], width - old)], 1)
    return new
