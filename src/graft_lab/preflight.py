"""Checks that need more than the config but less than the weights, run before anything loads: the
checkpoints exist (or can be fetched), the device exists, and sizes fit the model's vocabulary and context."""

from __future__ import annotations

from typing import Any

import torch

from .config import RunConfig
from .errors import ConfigError
from .weights import DRAFTER, TARGET, Weights, check_weights, model_config


def needed_weights(run: RunConfig, drafter: dict[str, Any]) -> list[Weights]:
    out = [Weights(TARGET, run.model.path, "model.path")]
    if drafter.get("name") == "eagle3" and drafter.get("path"):
        out.append(Weights(DRAFTER, drafter["path"], "drafter.path"))
    return out


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device} but this machine has no CUDA device; use model.device=cpu")


def check_sizes(run: RunConfig, path: str) -> None:
    """tree.top_k and gen.top_k against the vocabulary, model.max_context against the model's context."""
    config = model_config(path)
    if config is None:
        return
    text = config.get_text_config()
    vocab = text.vocab_size
    for key, value in (("tree.top_k", run.tree.top_k), ("gen.top_k", run.gen.top_k)):
        if value > vocab:
            raise ConfigError(f"{key}={value} is larger than the vocabulary of {path} ({vocab} tokens)")
    ctx = getattr(text, "max_position_embeddings", None)
    if ctx and run.model.max_context and run.model.max_context > ctx:
        raise ConfigError(f"model.max_context={run.model.max_context} exceeds the context of {path} ({ctx} tokens)")


def preflight(run: RunConfig, drafter: dict[str, Any]) -> None:
    check_weights(needed_weights(run, drafter))
    if not run.model.device_map:
        check_device(run.model.device)
    check_sizes(run, run.model.path)
