"""The consolidated table: one row per run with its provenance, reruns of a complete config are skipped
(force=true replaces the row), Ctrl-C marks the row incomplete, and parallel writers lose no row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import TINY, compose_cfg
from graft_lab import runner
from graft_lab.experiment import run_experiment
from graft_lab.results import ResultsTable, arrow_safe, method_name


def go(tmp: Path, *overrides: str):
    cfg = compose_cfg([*TINY, f"results_dir={tmp}", *overrides])
    return run_experiment(cfg, tmp / "runs" / f"run{len(list((tmp / 'runs').glob('run*'))) if (tmp / 'runs').exists() else 0}")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("results")
    return tmp, go(tmp)


def test_a_run_writes_its_row_with_provenance(first):
    tmp, outcome = first
    df = pd.read_parquet(tmp / "runs.parquet")
    assert len(df) == 1 and len(pd.read_csv(tmp / "runs.csv")) == 1
    row = df.iloc[0]
    assert bool(row["complete"]) and row["method"] == "ar" and row["components"] == "none" and row["model"] == "tiny_random"
    assert row["config_hash"] == outcome.summary["config_hash"] and tmp / row["run_dir"] == outcome.out_dir
    assert row["cfg.tree.total_tokens"] == 1 and row["budget"] == 1 and row["tau"] == 1.0  # method=ar: tree=k1
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    for key in ("config", "config_hash", "git_commit", "versions", "device", "peak_memory_mb", "acceptance_by_position"):
        assert key in summary
    assert summary["versions"]["torch"] and json.loads(row["versions"]) == summary["versions"]
    assert (outcome.out_dir / "answers.jsonl").read_text().count("\n") == 1


def test_rerun_skips_and_force_replaces(first):
    tmp, outcome = first
    again = go(tmp)
    assert again.summary is None and again.out_dir == outcome.out_dir
    forced = go(tmp, "force=true")
    assert forced.summary is not None and forced.summary["config_hash"] == outcome.summary["config_hash"]
    df = ResultsTable(tmp).read()
    assert len(df) == 1 and tmp / df.iloc[0]["run_dir"] == forced.out_dir


def test_ctrl_c_marks_the_row_incomplete_and_a_rerun_completes_it(tmp_path, monkeypatch):
    real = runner.answer_question
    calls = []

    def interrupted_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "answer_question", interrupted_on_second)
    outcome = go(tmp_path, "dataset.limit=3")
    assert outcome.summary["complete"] is False and outcome.summary["n_questions"] == 1
    assert (outcome.out_dir / "answers.jsonl").read_text().count("\n") == 1
    df = ResultsTable(tmp_path).read()
    assert len(df) == 1 and not bool(df.iloc[0]["complete"])
    monkeypatch.setattr(runner, "answer_question", real)
    done = go(tmp_path, "dataset.limit=3")  # incomplete is not skipped
    df = ResultsTable(tmp_path).read()
    assert done.summary["complete"] and len(df) == 1 and bool(df.iloc[0]["complete"])


WRITER = """
import sys
from pathlib import Path
from graft_lab.results import ResultsTable
root, worker = Path(sys.argv[1]), int(sys.argv[2])
for i in range(6):
    ResultsTable(root).upsert({"config_hash": f"w{worker}-{i}", "complete": True, "run_dir": f"r{worker}{i}", "x": i})
"""


def test_parallel_writers_neither_lose_nor_duplicate_rows(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(w)]) for w in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "0"], check=True)  # a rerun replaces its rows
    df = ResultsTable(tmp_path).read()
    assert sorted(df["config_hash"]) == sorted(f"w{w}-{i}" for w in range(3) for i in range(6))
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 18
    assert not list(tmp_path.glob(".*.tmp"))


def test_mixed_cell_types_still_write_parquet(tmp_path):
    table = ResultsTable(tmp_path)
    table.upsert({"config_hash": "a", "complete": True, "run_dir": "a", "cfg.model.max_context": None, "v": "1"})
    table.upsert({"config_hash": "b", "complete": False, "run_dir": "b", "cfg.model.max_context": 4096, "v": 2})
    df = table.read()
    assert len(df) == 2 and table.complete_run("a") is None  # the table alone is not trusted: no summary on disk
    for name, complete in (("a", True), ("b", False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"config_hash": name, "complete": complete}))
    assert table.complete_run("a") == tmp_path / "a" and table.complete_run("b") is None
    assert arrow_safe(pd.DataFrame({"c": [1, "x"]}))["c"].tolist() == ["1", "x"]


def test_method_names():
    cfg = lambda d, p, r, g="root": {"drafter": {"name": d}, "pruner": {"name": p}, "retriever": {"name": r},
                                     "graft": {"name": g}}
    assert method_name(cfg("none", "none", "none")) == "none"
    assert method_name(cfg("eagle3", "none", "none")) == "eagle3"
    assert method_name(cfg("eagle3", "dyn_depth", "ngram", "tail")) == "eagle3+dyn_depth+ngram@tail"


@pytest.fixture(scope="module")
def random_drafter(tmp_path_factory):
    """A random EAGLE-3 checkpoint for the tiny random target (drafter-based methods end to end)."""
    from graft_lab.models.target import Target, load_model
    from tiny import write_eagle3

    path = compose_cfg(TINY).model.path
    return write_eagle3(Target(*load_model(path)), tmp_path_factory.mktemp("drafter"))


@pytest.mark.parametrize("graft", ["root", "tail", "match"])
def test_every_graft_mode_runs_end_to_end(graft, random_drafter, tmp_path):
    outcome = go(tmp_path, f"method=graft_{graft}", f"drafter.path={random_drafter}", "retriever=ngram", "tree=k16")
    assert outcome.summary["complete"] and outcome.summary["matches_baseline"]
    row = ResultsTable(tmp_path).read().iloc[0]
    assert row["method"] == f"graft_{graft}[retriever=ngram]" and row["components"] == f"eagle3+dyn_depth+ngram@{graft}"
