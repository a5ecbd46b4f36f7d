"""Method presets outside run.py: compose conf/ with `method=NAME` at a budget K and build the same Method a
run would, so benchmarks, notebooks and scripts never re-derive a method's parts or its tree shape."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from .config import RunConfig, validate
from .decode import Method
from .errors import ConfigError
from .models.target import Target
from .tree import tree_shape

CONF = Path(__file__).resolve().parents[2] / "conf"  # the source checkout's config tree


def method_names() -> list[str]:
    return sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def compose_run(overrides: list[str]) -> DictConfig:
    if not CONF.is_dir():
        raise ConfigError(f"method presets need the source checkout's conf/ folder ({CONF} is missing)")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def tree_overrides(budget: int) -> list[str]:
    """The overrides that set K and its shape (graft_lab.tree.tree_shape); K=1 is AR's one-node tree."""
    s = tree_shape(budget)
    return [f"tree.total_tokens={s.total_tokens}", f"tree.depth={s.depth}", f"tree.top_k={s.top_k}"]


def preset(name: str, budget: int | None = None, extra: tuple[str, ...] = ()) -> tuple[RunConfig, DictConfig]:
    """The validated run config of `method=name` (at budget K when given, else the preset's tree)."""
    if name not in method_names():
        raise ConfigError(f"unknown method '{name}'; valid names: {', '.join(method_names())}")
    cfg = compose_run([f"method={name}", *(tree_overrides(budget) if budget else ()), *extra])
    return validate(cfg)[0], cfg


def build_preset(target: Target, name: str, budget: int | None = None, extra: tuple[str, ...] = ()) -> Method:
    from .runner import build_method  # runner imports the decode loop and the registries

    run, cfg = preset(name, budget, extra)
    return build_method(target, run, {g: cfg[g] for g in ("drafter", "pruner", "retriever", "graft")})
