"""The consolidated results table: one row per run in `<results_dir>/runs.parquet` and `runs.csv`.

A row is keyed by the run's config hash, so a rerun replaces its row instead of adding one, and a sweep
that was interrupted can skip every point that already has a complete row whose run directory still holds
its complete summary. Parallel sweep jobs share the table through a file lock; each write goes to a
temporary file that replaces the table in one rename. An unreadable table is an error before any decoding.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock

from .errors import OutputError
from .rundir import check_writable_dir

METRICS = (
    "complete", "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "new_tokens", "steps", "wall_time_s",
    "drafted_per_step", "retrieved_per_step", "accepted_retrieved_per_step", "peak_memory_mb", "n_questions",
    "n_turns", "matches_baseline", "match_share", "noise_bound", "noise_bound_top", "unexplained_divergences", "device", "config_hash",
    "dataset_hash", "git_commit", "error", "decode_speedup", "prefill_share", "decode_tokens_per_s", "mean_tree_size",
    "ideal_speedup", "efficiency",
)
KEY_COLUMNS = ("config_hash", "complete", "run_dir")
JSON_FIELDS = ("acceptance_by_position", "per_category", "versions", "mismatched_questions", "divergences", "calibration")


def method_name(config: dict[str, Any]) -> str:
    """A short label per decoding method: drafter, then the pruner and retriever@graft when used."""
    parts = [config["drafter"]["name"]]
    if config["pruner"]["name"] != "none":
        parts.append(config["pruner"]["name"])
    if config["retriever"]["name"] != "none":
        parts.append(f"{config['retriever']['name']}@{config['graft']['name']}")
    return "+".join(parts)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; lists become JSON text so every cell is a scalar."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def row_of(summary: dict[str, Any], out_dir: Path, root: Path) -> dict[str, Any]:
    """The table row of a finished run; `run_dir` is relative to the table's folder when inside it, so a
    results folder can be moved or shipped (results/sample) as a whole."""
    config = summary["config"]
    rel = os.path.relpath(out_dir.resolve(), root.resolve())
    return {
        "run_dir": out_dir.as_posix() if rel.startswith("..") else Path(rel).as_posix(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "experiment_name": config.get("experiment_name"),
        "method": summary.get("method") or method_name(config),
        "components": method_name(config),
        "model": config["model"]["name"],
        "dataset": config["dataset"]["name"],
        "budget": config["tree"]["total_tokens"],
        **{k: summary.get(k) for k in METRICS},
        **{f"phase_share.{k}": v for k, v in summary.get("phase_share", {}).items()},
        **{k: json.dumps(summary.get(k)) for k in JSON_FIELDS},
        **flatten(config, "cfg."),
    }


def arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns whose cells mix Python types (a null in one run, a list in another) become text."""
    for col in df.select_dtypes(include="object").columns:
        if len({type(v) for v in df[col].dropna()}) > 1:
            df[col] = df[col].map(lambda v: None if pd.isna(v) else str(v))
    return df


@dataclass(frozen=True)
class ResultsTable:
    root: Path

    @property
    def parquet(self) -> Path:
        return self.root / "runs.parquet"

    @property
    def csv(self) -> Path:
        return self.root / "runs.csv"

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".runs.lock"), timeout=600)

    def read(self) -> pd.DataFrame:
        if not self.parquet.is_file():
            return pd.DataFrame()
        try:
            df = pd.read_parquet(self.parquet)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise OutputError(f"results table {self.parquet} is unreadable ({str(exc).splitlines()[0]}); "
                              "move it away to start a new table") from None
        missing = [c for c in KEY_COLUMNS if not df.empty and c not in df.columns]
        if missing:
            raise OutputError(f"results table {self.parquet} has no column {missing[0]!r}: not a graft-lab table; "
                              "move it away to start a new table")
        return df

    def check_writable(self) -> None:
        """Fail now, not after decoding, when the table cannot be written."""
        check_writable_dir(self.root, "results_dir")
        for path in (self.parquet, self.csv):
            if path.exists() and not path.is_file():
                raise OutputError(f"results table {path} is not a file")

    def run_dir(self, rel: str) -> Path:
        return self.root / rel

    def recorded_run(self, config_hash: str, complete: bool) -> Path | None:
        """The run directory of a run with this config hash and completeness, if the table has one and the
        directory still holds that run's summary.json (a deleted or overwritten directory does not count)."""
        df = self.read()
        if df.empty:
            return None
        hit = df[(df["config_hash"] == config_hash) & (df["complete"].astype(bool) == complete)]
        for rel in hit["run_dir"]:
            out = self.run_dir(str(rel))
            try:
                summary = json.loads((out / "summary.json").read_text())
            except (OSError, ValueError):
                continue
            if summary.get("config_hash") == config_hash and bool(summary.get("complete")) == complete:
                return out
        return None

    def complete_run(self, config_hash: str) -> Path | None:
        """The directory of a complete run with this config hash (see recorded_run)."""
        return self.recorded_run(config_hash, complete=True)

    def upsert(self, row: dict[str, Any]) -> None:
        """Add `row`, replacing any row with the same config hash; both files are replaced atomically."""
        try:
            with self.lock():
                df = self.read()
                if not df.empty:
                    df = df[df["config_hash"] != row["config_hash"]]
                df = pd.concat([df, pd.DataFrame([row])], ignore_index=True) if not df.empty else pd.DataFrame([row])
                df = arrow_safe(df)
                for path, write in ((self.parquet, lambda p: df.to_parquet(p, index=False)),
                                    (self.csv, lambda p: df.to_csv(p, index=False))):
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                    try:
                        write(tmp)
                        os.replace(tmp, path)
                    finally:
                        tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"could not write the results table in {self.root}: {exc.strerror or exc}") from None
