"""One run.py job end to end: validate, skip a sweep point that is already done, check weights and sizes,
decode, then record the table row and log. Everything that can fail on bad input fails before the
first file of the run is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .config import validate
from .loggers import LOGGERS
from .preflight import preflight
from .provenance import metadata
from .results import ResultsTable, row_of
from .runner import run

DECODE_GROUPS = ("drafter", "pruner", "retriever", "graft", "dataset")


@dataclass(frozen=True)
class Outcome:
    out_dir: Path  # the run's directory, or the complete run's that made this one a skip
    summary: dict | None  # None: skipped
    logged_to: str | None = None


def run_experiment(cfg: DictConfig, default_out_dir: Path) -> Outcome:
    run_cfg, _ = validate(cfg)
    meta = metadata(cfg)
    table = ResultsTable(Path(run_cfg.results_dir))
    if not run_cfg.force and (done := table.complete_run(meta["config_hash"])):
        return Outcome(table.root / done, None)
    preflight(run_cfg, OmegaConf.to_container(cfg.drafter, resolve=True))
    out_dir = Path(run_cfg.output_dir or default_out_dir)
    summary = run(run_cfg, {g: cfg[g] for g in DECODE_GROUPS}, out_dir, meta)
    table.upsert(row_of(summary, out_dir, table.root))
    logged_to = LOGGERS.build(cfg.logger).log_run(summary, out_dir)
    return Outcome(out_dir, summary, logged_to)
