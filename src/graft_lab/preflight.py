"""Checks that need more than the config but less than the weights, run before anything loads: the
checkpoints exist (or can be fetched) and are whole, the device and attention kernel exist, sizes fit the
model's vocabulary and context, the first prompts fit the context, and the retriever's warm-up file reads."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from .config import RunConfig
from .data import Question, source_of
from .errors import ConfigError
from .prompts import check_budget, check_first_turns, context_of
from .retrievers.pool import source_nodes
from .retrievers.recycle import load_bigrams
from .weights import DRAFTER, TARGET, Weights, check_weights, local_tokenizer, model_config


def needed_weights(run: RunConfig, drafter: dict[str, Any]) -> list[Weights]:
    out = [Weights(TARGET, run.model.path, "model.path")]
    if drafter.get("name") == "eagle3" and drafter.get("path"):
        out.append(Weights(DRAFTER, drafter["path"], "drafter.path"))
    return out


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device} but this machine has no CUDA device; use model.device=cpu")


def resolve_device(device: str, flag: str = "--device") -> str:
    """`auto`: cuda where torch sees a CUDA device, else cpu; any other name as given, once this machine has it."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{flag} {device}: this machine (or this torch build) has no CUDA device; use {flag} cpu or auto")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"{flag} {device}: unknown device; valid: auto, cpu, cuda, cuda:N")
    return device


def check_attention(run: RunConfig) -> None:
    """verify.attn=triton needs the triton package and a CUDA target (or Triton's CPU interpreter)."""
    if run.verify.attn != "triton":
        return
    if importlib.util.find_spec("triton") is None:
        raise ConfigError("verify.attn=triton needs the triton package (pip install triton); use verify.attn=sdpa")
    on_cuda = run.model.device.startswith("cuda") or bool(run.model.device_map)
    if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(f"verify.attn=triton runs on CUDA, but model.device={run.model.device}; use verify.attn=sdpa "
                          "(or set TRITON_INTERPRET=1 for Triton's slow CPU interpreter)")


def check_sizes(run: RunConfig, path: str) -> int | None:
    """tree.top_k and gen.top_k against the vocabulary, model.max_context and the budget against the
    model's context; returns the vocabulary size (None when the config is not at hand)."""
    config = model_config(path)
    if config is None:
        return None
    text = config.get_text_config()
    vocab = text.vocab_size
    for key, value in (("tree.top_k", run.tree.top_k), ("gen.top_k", run.gen.top_k)):
        if value > vocab:
            raise ConfigError(f"{key}={value} is larger than the vocabulary of {path} ({vocab} tokens)")
    ctx = getattr(text, "max_position_embeddings", None)
    if ctx and run.model.max_context and run.model.max_context > ctx:
        raise ConfigError(f"model.max_context={run.model.max_context} exceeds the context of {path} ({ctx} tokens)")
    check_budget(run, context_of(run, ctx))
    return vocab


def check_warm_path(retriever: dict[str, Any], vocab: int | None) -> None:
    for node in source_nodes(retriever):  # a pool's recycle sources too
        if node.get("name") == "recycle" and node.get("warm_path") and vocab:
            load_bigrams(node["warm_path"], vocab)


def check_prompts(run: RunConfig, questions: list[Question], source: str) -> None:
    """First turns against the context, when the tokenizer and config are on disk (else after loading)."""
    tokenizer = local_tokenizer(run.model.path)
    config = model_config(run.model.path)
    if tokenizer is not None and config is not None:
        ctx = getattr(config.get_text_config(), "max_position_embeddings", None)
        check_first_turns(questions, tokenizer, context_of(run, ctx), source)


def preflight(run: RunConfig, nodes: dict[str, dict[str, Any]], questions: list[Question]) -> None:
    """`nodes`: the resolved pluggable groups (drafter, retriever, dataset, ...)."""
    check_weights(needed_weights(run, nodes["drafter"]))
    if not run.model.device_map:
        check_device(run.model.device)
    check_attention(run)
    vocab = check_sizes(run, run.model.path)
    check_warm_path(nodes["retriever"], vocab)
    check_prompts(run, questions, source_of(nodes["dataset"]))
