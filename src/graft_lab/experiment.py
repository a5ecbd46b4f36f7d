"""One run.py job end to end: validate, load and check the questions, skip a sweep point that is already
done, check weights, sizes and every output location, decode, then record the table row and log.
Everything that can fail on bad input fails before the first file of the run is written; a failure after
decoding starts leaves the summary (complete=false) and the row on disk, and a rerun resumes the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .config import RunConfig, validate
from .data import content_hash, load_questions
from .errors import GraftLabError, OutputError
from .loggers import LOGGERS, Logger
from .preflight import preflight
from .provenance import metadata
from .results import ResultsTable, row_of
from .rundir import RunDir
from .runner import run

DECODE_GROUPS = ("drafter", "pruner", "retriever", "graft", "dataset")


@dataclass(frozen=True)
class Outcome:
    out_dir: Path  # the run's directory, or the complete run's that made this one a skip
    summary: dict | None  # None: skipped
    logged_to: str | None = None  # where the run was logged by this call (None: not logged now)


def choose_out_dir(run_cfg: RunConfig, table: ResultsTable, config_hash: str, default: Path) -> Path:
    """output_dir when given; else the directory of an interrupted run of this config (to resume it), else
    Hydra's fresh run directory."""
    if run_cfg.output_dir:
        return Path(run_cfg.output_dir)
    if not run_cfg.force and (interrupted := table.recorded_run(config_hash, complete=False)):
        return interrupted
    return default


def run_experiment(cfg: DictConfig, default_out_dir: Path) -> Outcome:
    run_cfg, _ = validate(cfg)
    nodes = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in DECODE_GROUPS}
    questions = load_questions(cfg.dataset)
    meta = metadata(cfg, content_hash(questions))
    table = ResultsTable(Path(run_cfg.results_dir))
    table.read()  # an unreadable table fails now, not after decoding (force=true too)
    logger = LOGGERS.build(cfg.logger)
    if not run_cfg.force and (done := table.complete_run(meta["config_hash"])):
        return Outcome(done, None, log_once(logger, RunDir(done)))
    preflight(run_cfg, nodes, questions)
    logger.check()
    table.check_writable()
    out = RunDir(choose_out_dir(run_cfg, table, meta["config_hash"], default_out_dir))
    with out.open(meta["config_hash"], run_cfg.force) as resume:
        summary = run(run_cfg, nodes, questions, out, resume, meta)
        try:
            table.upsert(row_of(summary, out.path, table.root))
        except OutputError as exc:
            raise OutputError(f"{exc}; the run's summary.json is in {out.path}") from None
    if summary["error"]:
        raise GraftLabError(f"{summary['error']} ({summary['n_questions']} finished questions and summary.json "
                            f"with complete=false are in {out.path}; rerun to resume)")
    return Outcome(out.path, summary, log_once(logger, out, summary))


def log_once(logger: Logger, out: RunDir, summary: dict | None = None) -> str | None:
    """Log the complete run in `out` (its summary: given, or read from disk) unless it already reached the
    logger's destination (a skipped sweep point is logged here when its run was interrupted before its log)."""
    if logger.destination is None or logger.destination in out.logged():
        return None
    if summary is None:  # a skipped run: nothing checked the logger yet
        logger.check()
        summary = out.recorded()
    try:
        logged_to = logger.log_run(summary, out.path)
    except Exception as exc:  # W&B raises many error types (network, auth, disk); the run itself is saved
        raise OutputError(f"logging failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                          f"the run is saved in {out.path}; rerun to log it") from None
    out.record_logged(logger.destination, logged_to)
    return logged_to
