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
from .models.linear import LINEARS
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
    linear: str = "auto"  # the linear layers' CPU kernel: auto | onednn | torch (models/linear.py)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {', '.join(DTYPES)}; got '{self.dtype}'")
        if self.linear not in LINEARS:
            raise ConfigError(f"model.linear must be one of {', '.join(LINEARS)}; got '{self.linear}'")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"model.max_context must be >= 2 or null, got {self.max_context}")


@dataclass
class TreeConfig:
    total_tokens: int = 60  # K: nodes verified per step, root included
    depth: int = 7  # draft levels
    top_k: int = 10  # children per expanded node
    plan: str = "fixed"  # fixed: verify the grafted tree; auto: the cost model picks N <= K each step (K a cap)

    def __post_init__(self):
        for name in ("total_tokens", "depth", "top_k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tree.{name} must be >= 1, got {getattr(self, name)}")
        if self.plan not in ("fixed", "auto"):
            raise ConfigError(f"tree.plan must be 'fixed' or 'auto', got '{self.plan}'")


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
class MethodConfig:
    """The method preset (conf/method/NAME.yaml) and the parts it chose; a run that overrides a part is
    labelled with the override (`graft[retriever=ngram]`)."""

    name: str = "custom"
    parts: dict[str, str] = field(default_factory=dict)  # group -> option name, as the preset set them


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
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
    check_combination(run, data)
    if data["pruner"]["name"] == "cost" and run.tree.plan != "auto":
        raise ConfigError("pruner=cost needs tree=auto (tree.plan=auto): it prices draft levels with the cost model")
    return run, options


def check_combination(run: RunConfig, data: dict[str, Any]) -> None:
    """Parts that cannot work together, each error naming the fix."""
    name = {group: data[group]["name"] for group in ("drafter", "pruner", "retriever", "graft")}
    if name["pruner"] != "none" and name["drafter"] == "none":
        raise ConfigError(f"pruner={name['pruner']} prunes a draft, but drafter=none: add drafter=eagle3, or use "
                          "pruner=none (method=pld, recycle or sam for retrieval alone)")
    if name["graft"] != "root" and name["retriever"] == "none":
        raise ConfigError(f"graft={name['graft']} hangs retrieved continuations under draft nodes, but retriever=none: "
                          "pick a retriever (retriever=recycle, ngram, sam or pool) or graft=root")
    if name["graft"] != "root" and name["drafter"] == "none":
        raise ConfigError(f"graft={name['graft']} grafts onto draft nodes, but drafter=none: use graft=root")


def method_label(config: dict[str, Any]) -> str:
    """The method's name, with any part the command line changed from the preset: `graft[retriever=ngram]`."""
    method = config.get("method") or {}
    changed = [f"{g}={config[g]['name']}" for g, option in (method.get("parts") or {}).items() if config[g]["name"] != option]
    name = method.get("name", "custom")
    return f"{name}[{','.join(changed)}]" if changed else name
