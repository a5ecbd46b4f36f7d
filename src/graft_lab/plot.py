"""Figures from the results table, and the per-run figures the W&B logger uploads.

    python -m graft_lab.plot pareto [--results results] [--out results/pareto.png]
    python -m graft_lab.plot calibration --run RUN_DIR [--out RUN_DIR/calibration.png]

The Pareto figure has three panels: speedup against tau, speedup against the verification budget K
(frontier points ringed), and per-category speedup of each method's best run; one colour per method.
The calibration figure (a tree=auto run) has two: each node's predicted path probability against the
share of such nodes verification accepted, and each step's predicted tokens against the realised ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .results import ResultsTable


def load_runs(results_dir: str | Path, complete_only: bool = True) -> pd.DataFrame:
    df = ResultsTable(Path(results_dir)).read()
    if df.empty:
        raise SystemExit(f"no runs in {Path(results_dir) / 'runs.parquet'}: run `python run.py ...` first")
    return df[df["complete"].astype(bool)].reset_index(drop=True) if complete_only else df


def colours(methods) -> dict[str, tuple]:
    """One fixed colour per method, the same in every panel."""
    cmap = plt.get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(sorted(set(methods)))}


def frontier(x: np.ndarray, y: np.ndarray, x_lower_is_better: bool) -> np.ndarray:
    """Indices of the points no other point beats on both axes (y higher is better), in x order."""
    order = np.lexsort((-y, x if x_lower_is_better else -x))  # by x, the best y first among equal x
    best, keep = -np.inf, []
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.array(keep, dtype=int)


def metric_of(df: pd.DataFrame) -> str:
    """Speedup when the runs had the AR baseline, else tokens/s."""
    return "speedup" if df["speedup"].notna().any() else "tokens_per_s"


def scatter_panel(ax, df: pd.DataFrame, x: str, y: str, colour: dict, x_lower_is_better: bool) -> None:
    data = df.dropna(subset=[x, y])
    for method, part in data.groupby("method"):
        ax.scatter(part[x], part[y], color=colour[method], label=method, s=36, zorder=3)
    if len(data):
        idx = frontier(data[x].to_numpy(float), data[y].to_numpy(float), x_lower_is_better)
        front = data.iloc[idx]
        ax.plot(front[x], front[y], "k--", lw=1, zorder=2, drawstyle="steps-post" if x_lower_is_better else "default")
        ax.scatter(front[x], front[y], s=120, facecolors="none", edgecolors="k", lw=1.5, zorder=4, label="frontier")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)


def category_panel(ax, df: pd.DataFrame, y: str, colour: dict) -> None:
    """Per-category `y` of each method's best run (by overall `y`)."""
    best = df.loc[df.groupby("method")[y].idxmax().dropna()]
    per = {r.method: json.loads(r.per_category or "{}") for r in best.itertuples()}
    cats = sorted({c for v in per.values() for c in v})
    width = 0.8 / max(len(per), 1)
    for i, (method, cat_stats) in enumerate(sorted(per.items())):
        values = [(cat_stats.get(c) or {}).get(y) or 0.0 for c in cats]
        ax.bar(np.arange(len(cats)) + i * width, values, width, color=colour[method], label=method)
    ax.set_xticks(np.arange(len(cats)) + width * (len(per) - 1) / 2, cats, rotation=30, ha="right")
    ax.set_ylabel(f"{y} (best run per method)")
    ax.grid(alpha=0.3, axis="y")


def pareto_figure(df: pd.DataFrame):
    y = metric_of(df)
    colour = colours(df["method"])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    scatter_panel(axes[0], df, "tau", y, colour, x_lower_is_better=False)
    axes[0].set_title(f"{y} vs tau")
    scatter_panel(axes[1], df, "budget", y, colour, x_lower_is_better=True)
    axes[1].set_title(f"{y} vs verification budget K")
    category_panel(axes[2], df, y, colour)
    axes[2].set_title("per category")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def calibration_figure(summary: dict):
    """Predicted against realised acceptance, from a run's summary (tree=auto); the diagonal is perfect."""
    nodes = summary.get("acceptance_reliability") or []
    steps = (summary.get("calibration") or {}).get("bins") or []
    if not nodes and not steps:
        raise ValueError("the summary has no calibration data: only tree=auto runs predict acceptance")
    fig, (ax_n, ax_s) = plt.subplots(1, 2, figsize=(10, 4.2))
    if nodes:
        pred, real, count = (np.asarray(c, dtype=float) for c in zip(*nodes))
        ax_n.plot([0, 1], [0, 1], "k--", lw=1)
        ax_n.scatter(pred, real, s=20 + 80 * count / count.max(), zorder=3)
    ax_n.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted path probability", ylabel="share accepted",
             title="per node")
    if steps:
        _, pred, real, count = (np.asarray(c, dtype=float) for c in zip(*steps))
        hi = max(pred.max(), real.max()) * 1.05
        ax_s.plot([1, hi], [1, hi], "k--", lw=1)
        ax_s.scatter(pred, real, s=20 + 80 * count / count.max(), zorder=3)
    cal = summary.get("calibration") or {}
    ratio = f" (realised / predicted {cal['tokens_ratio']:.2f})" if cal.get("tokens_ratio") else ""
    ax_s.set(xlabel="predicted tokens per step", ylabel="realised tokens per step", title=f"per step{ratio}")
    for ax in (ax_n, ax_s):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def run_figures(summary: dict) -> dict:
    """Per-run figures: acceptance rate by draft position, phase time shares, per-category tau."""
    figs = {}
    fig, ax = plt.subplots(figsize=(5, 3.2))
    rate = summary.get("acceptance_by_position") or []
    ax.bar(range(1, len(rate) + 1), rate)
    ax.set(xlabel="draft position", ylabel="acceptance rate", title=f"tau {summary['tau']:.2f}")
    figs["acceptance_by_position"] = fig
    fig, ax = plt.subplots(figsize=(5, 3.2))
    share = summary.get("phase_share") or {}
    ax.barh(list(share), list(share.values()))
    ax.set(xlabel="share of decode time", title="phase times")
    figs["phase_share"] = fig
    fig, ax = plt.subplots(figsize=(5, 3.2))
    cats = summary.get("per_category") or {}
    ax.bar(list(cats), [c["tau"] for c in cats.values()])
    ax.set(ylabel="tau", title="per category")
    ax.tick_params(axis="x", rotation=30)
    figs["per_category"] = fig
    if summary.get("calibration") or summary.get("acceptance_reliability"):
        figs["calibration"] = calibration_figure(summary)
    for f in figs.values():
        f.tight_layout()
    return figs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("figure", choices=["pareto", "calibration"])
    ap.add_argument("--results", default="results", help="the results_dir holding runs.parquet")
    ap.add_argument("--run", help="calibration: the run directory holding summary.json")
    ap.add_argument("--out", help="PNG path (default: <results>/pareto.png, <run>/calibration.png)")
    args = ap.parse_args(argv)
    plt.switch_backend("Agg")  # files only, also where a display exists
    if args.figure == "calibration":
        if not args.run or not (Path(args.run) / "summary.json").is_file():
            raise SystemExit("calibration needs --run DIR with a summary.json (a run with tree=auto)")
        try:
            fig = calibration_figure(json.loads((Path(args.run) / "summary.json").read_text()))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        out = Path(args.out or Path(args.run) / "calibration.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        print(f"calibration -> {out}")
        return
    df = load_runs(args.results)
    out = Path(args.out or Path(args.results) / "pareto.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = pareto_figure(df)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"{len(df)} runs, {df['method'].nunique()} methods -> {out}")


if __name__ == "__main__":
    main()
