"""Sweeps through run.py -m: the basic and joblib launchers fill the results table; an interrupted sweep,
rerun, ends with every point once and complete (experiments/pareto_smoke.sh, the issue's acceptance check)."""

from __future__ import annotations

import os
import subprocess

import pandas as pd
import pytest

from harness import ROOT, TINY, run_py_subprocess

pytestmark = pytest.mark.slow  # interpreter start-ups and real (tiny) runs


def table(tmp) -> pd.DataFrame:
    return pd.read_parquet(tmp / "runs.parquet")


def test_basic_sweep_then_rerun_skips_everything(tmp_path):
    args = ["-m", *TINY, "tree.total_tokens=2,3", "tree.top_k=1,2"]
    first = run_py_subprocess(args, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    df = table(tmp_path)
    assert len(df) == 4 and df["complete"].all() and df["config_hash"].nunique() == 4
    again = run_py_subprocess(args, tmp_path)
    assert again.returncode == 0 and again.stdout.count("graft-lab: skipped") == 4
    assert table(tmp_path)["config_hash"].tolist() == df["config_hash"].tolist()


def test_joblib_launcher_runs_points_in_parallel_processes(tmp_path):
    proc = run_py_subprocess(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY, "gen.seed=1,2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = table(tmp_path)
    assert len(df) == 2 and df["complete"].all() and sorted(df["cfg.gen.seed"]) == [1, 2]


def test_pareto_smoke_script_interrupt_and_rerun(tmp_path):
    env = {**os.environ, "TINY": "1", "QUESTIONS": "2", "TOKENS": "4", "OUT": str(tmp_path / "smoke")}
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "pareto_smoke.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "18 rows, 18 complete, 18 config hashes" in proc.stdout
    assert (tmp_path / "smoke" / "pareto.png").is_file()
