"""Helpers for the experiment-framework tests: compose the real conf/ tree, run run.py in-process or as
a subprocess, and the overrides of the smallest real run (tiny random target, one question, 4 tokens)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import itertools

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
TINY = ["model=tiny_random", "method=ar", "dataset.limit=1", "dataset.first_turn_only=true", "gen.max_new_tokens=4"]


def compose_cfg(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra_config)


def sweep_points(preset: str) -> list[list[str]]:
    """Every point of an experiment preset's hydra.sweeper.params grid, as override lists."""
    params = compose_cfg([f"experiment={preset}"], hydra_config=True).hydra.sweeper.params or {}
    parser = OverridesParser.create()
    axes = [[f"{o.key_or_group}={v}" for v in o.sweep_string_iterator()]
            for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()])]
    return [list(p) for p in itertools.product(*axes)] if axes else [[]]


def run_py(args: list[str], tmp: Path) -> tuple[int, str, str]:
    """run.py in this process (no interpreter start-up); returns (exit code, stdout, stderr)."""
    argv = [str(ROOT / "run.py"), *args, f"results_dir={tmp}", f"hydra.run.dir={tmp}/run",
            f"hydra.sweep.dir={tmp}/multirun"]
    out, err, code = StringIO(), StringIO(), 0
    saved_argv, saved_env = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = argv
    try:
        with redirect_stdout(out), redirect_stderr(err):
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved_argv
        if saved_env is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_env
    return code, out.getvalue(), err.getvalue()


def run_py_subprocess(args: list[str], tmp: Path, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "run.py"), *args, f"results_dir={tmp}", f"hydra.run.dir={tmp}/run",
           f"hydra.sweep.dir={tmp}/multirun"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def written(tmp: Path) -> list[Path]:
    """Result files a run left anywhere under `tmp`."""
    return [p for name in ("answers.jsonl", "summary.json", "runs.parquet", "runs.csv") for p in tmp.rglob(name)]
