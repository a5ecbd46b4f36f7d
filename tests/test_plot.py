"""The Pareto figure reads the results table and draws a PNG; the frontier is the non-dominated set."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from graft_lab.plot import frontier, main, pareto_figure, run_figures
from graft_lab.results import ResultsTable

METHODS = {"eagle3": (1.0, 2.4), "eagle3+dyn_depth": (1.1, 2.3), "eagle3+dyn_depth+ngram@root": (1.3, 2.6)}


def fill(table: ResultsTable) -> None:
    for method, (speed, tau) in METHODS.items():
        for k in (20, 40, 60):
            s = speed * (1 + k / 200)
            table.upsert({
                "config_hash": f"{method}-{k}", "run_dir": f"runs/{method}-{k}", "complete": True, "method": method,
                "budget": k, "tau": tau + k / 100, "speedup": s, "tokens_per_s": 30 * s,
                "per_category": json.dumps({c: {"tau": tau, "speedup": s * f} for c, f in (("coding", 1.2), ("writing", 0.9))}),
            })
    table.upsert({"config_hash": "broken", "run_dir": "r", "complete": False, "method": "eagle3", "budget": 5,
                  "tau": 9.0, "speedup": 9.0, "tokens_per_s": 1.0, "per_category": "{}"})


def test_frontier_is_non_dominated():
    x, y = np.array([1, 2, 3, 4.0]), np.array([1, 3, 2, 4.0])
    assert frontier(x, y, x_lower_is_better=True).tolist() == [0, 1, 3]
    assert frontier(x, y, x_lower_is_better=False).tolist() == [3]
    ties = np.array([1, 1, 2.0]), np.array([1, 2, 1.5])
    assert frontier(*ties, x_lower_is_better=True).tolist() == [1]


def test_pareto_png_from_the_table(tmp_path):
    table = ResultsTable(tmp_path)
    fill(table)
    main(["pareto", "--results", str(tmp_path)])
    png = tmp_path / "pareto.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    fig = pareto_figure(table.read().query("complete"))
    tau_ax, budget_ax, cat_ax = fig.axes
    assert len(tau_ax.collections) == len(METHODS) + 1  # one scatter per method, then the frontier rings
    assert {t.get_text() for t in cat_ax.get_xticklabels()} == {"coding", "writing"}
    assert budget_ax.get_xlabel() == "budget"


def test_incomplete_runs_are_left_out(tmp_path):
    fill(ResultsTable(tmp_path))
    from graft_lab.plot import load_runs

    assert len(load_runs(tmp_path)) == 9


def test_make_pareto_entry_point(tmp_path):
    fill(ResultsTable(tmp_path))
    out = tmp_path / "figs" / "p.png"
    proc = subprocess.run([sys.executable, "-m", "graft_lab.plot", "pareto", "--results", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and "9 runs, 3 methods" in proc.stdout


def test_empty_table_says_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="run `python run.py"):
        main(["pareto", "--results", str(tmp_path)])


def test_run_figures():
    figs = run_figures({"tau": 2.5, "acceptance_by_position": [0.8, 0.5], "phase_share": {"verify": 0.7, "draft": 0.3},
                        "per_category": {"coding": {"tau": 2.0}}})
    assert set(figs) == {"acceptance_by_position", "phase_share", "per_category"}


CALIBRATED_RUN = {
    "tau": 2.1, "acceptance_by_position": [0.6], "phase_share": {"verify": 1.0}, "per_category": {},
    "acceptance_reliability": [[0.05, 0.04, 300], [0.45, 0.5, 40], [0.92, 0.9, 120]],
    "calibration": {"tokens_ratio": 0.95, "bins": [[1.0, 1.1, 1.0, 20], [2.0, 2.2, 2.1, 50], [3.0, 3.4, 3.0, 9]]},
}


def test_calibration_figure_from_a_run_summary(tmp_path):
    from graft_lab.plot import calibration_figure

    fig = calibration_figure(CALIBRATED_RUN)
    nodes, steps = fig.axes
    assert nodes.collections[0].get_offsets().shape == (3, 2) and steps.collections[0].get_offsets().shape == (3, 2)
    assert "0.95" in steps.get_title()
    assert "calibration" in run_figures(CALIBRATED_RUN)
    with pytest.raises(ValueError, match="tree=auto"):
        calibration_figure({"tau": 1.0})
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(CALIBRATED_RUN))
    main(["calibration", "--run", str(run)])
    assert (run / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (run / "summary.json").write_text(json.dumps({"tau": 1.0}))
    with pytest.raises(SystemExit, match="tree=auto"):
        main(["calibration", "--run", str(run)])
