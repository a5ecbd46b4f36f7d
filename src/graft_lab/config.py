"""The run configuration: one strict schema for the fixed groups, and the registries for the pluggable ones.

`validate(cfg)` runs before any model loads. An unknown key or an out-of-range value raises ConfigError
naming the field; the pluggable groups (drafter, pruner, retriever, graft, dataset, logger) are checked by the
registry entry they name, against that entry's options dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .data import DATASETS
from .drafters import DRAFTERS
from .errors import ConfigError
from .graft import GRAFTS
from .loggers import LOGGERS
from .models.target import DTYPES
from .pruners import PRUNERS
from .retrievers import RETRIEVERS

PLUGGABLE = {"drafter": DRAFTERS, "pruner": PRUNERS, "retriever": RETRIEVERS, "graft": GRAFTS, "dataset": DATASETS,
              "logger": LOGGERS}


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    path: str = "embedded:smollm2-135m-instruct"  # hub id, local dir, or the embedded model
    dtype: str = "float32"
    device: str = "cpu"
    device_map: str | None = None  # "auto" spreads a large target over several GPUs
    eagle3_drafter: str | None = None  # the EAGLE-3 checkpoint trained for this target
    max_context: int | None = None  # cap on prompt + generation; default: the model's own limit

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {', '.join(DTYPES)}; got '{self.dtype}'")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"model.max_context must be >= 2 or null, got {self.max_context}")


@dataclass
class TreeConfig:
    total_tokens: int = 60  # K: nodes verified per step, root included
    depth: int = 7  # draft levels
    top_k: int = 10  # children per expanded node

    def __post_init__(self):
        for name in ("total_tokens", "depth", "top_k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tree.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class GenConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int = 0
    stop_strings: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"gen.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"gen.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"gen.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"gen.top_k must be >= 0, got {self.top_k}")
        if any(s == "" for s in self.stop_strings):
            raise ConfigError("gen.stop_strings holds an empty string, which would stop every turn after one token")


@dataclass
class VerifyConfig:
    attn: str = "auto"  # auto: triton on CUDA, sdpa on CPU; or triton | sdpa | eager

    def __post_init__(self):
        if self.attn not in ("auto", "triton", "sdpa", "eager"):
            raise ConfigError(f"verify.attn must be one of auto, triton, sdpa, eager; got '{self.attn}'")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    drafter: Any = None
    pruner: Any = None
    retriever: Any = None
    graft: Any = None
    dataset: Any = None
    logger: Any = None
    baseline: str = "ar"  # ar: decode the same prompts autoregressively, interleaved; none: skip
    output_dir: str | None = None  # default: Hydra's run directory
    results_dir: str = "results"
    experiment_name: str = "default"
    tags: list[str] = field(default_factory=list)
    force: bool = False  # rerun even when a complete run with the same config hash exists

    def __post_init__(self):
        if self.baseline not in ("ar", "none"):
            raise ConfigError(f"baseline must be 'ar' or 'none', got '{self.baseline}'")


def walk(data: Any, prefix: str = ""):
    """(dotted key, value) for every leaf of a nested dict / list."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else None
    if items is None:
        yield prefix, data
        return
    for k, v in items:
        yield from walk(v, f"{prefix}.{k}" if prefix else str(k))


def check_values(node: DictConfig) -> dict[str, Any]:
    """The resolved config, after the checks that hold for every field: no value left as ??? (a path the
    user must give), no NaN or infinity."""
    missing = sorted(k for k in OmegaConf.missing_keys(node) if not k.startswith("hydra."))
    if missing:
        raise ConfigError(f"{missing[0]} is required (it is ??? in the config): add {missing[0]}=... to the command line")
    try:
        data = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"invalid config{f' at {key}' if key else ''}: {str(exc).splitlines()[0]}") from None
    data.pop("hydra", None)
    for key, value in walk(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
    return data


def validate(cfg: DictConfig | dict) -> tuple[RunConfig, dict[str, Any]]:
    """Check the whole config; returns the typed fixed part and the validated options per pluggable group."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    data = check_values(node)
    for group in PLUGGABLE:
        if data.get(group) is None:
            raise ConfigError(f"the '{group}' config group is missing")
    try:
        run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), data))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"invalid config{f' at {key}' if key else ''}: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    options = {group: reg.options(data[group]) for group, reg in PLUGGABLE.items()}
    return run, options
