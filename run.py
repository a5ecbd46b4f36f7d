"""Entry point: `python run.py model=... drafter=... pruner=... retriever=... graft=... tree.total_tokens=...`.

Composes the Hydra config under conf/, validates it before any model loads, skips it when the results
table already has a complete run with the same config hash whose summary is still on disk (force=true
reruns), resumes an interrupted run of the same config, decodes the dataset with the chosen method and the
interleaved AR baseline, writes answers.jsonl and summary.json, adds the run's row to
<results_dir>/runs.parquet and runs.csv, and logs it (logger=wandb). Ctrl-C and SIGTERM keep the finished
questions (exit 130). Sweep with -m.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from graft_lab.cli import EXIT_INTERRUPTED, fail, main_with_clean_errors, message_of
from graft_lab.errors import GraftLabError
from graft_lab.experiment import run_experiment
from graft_lab.report import print_summary


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        outcome = run_experiment(cfg, Path(HydraConfig.get().runtime.output_dir))
    except GraftLabError as exc:
        fail(message_of(exc))
    if outcome.summary is None:
        print(f"graft-lab: skipped: a complete run with this config hash is in {outcome.out_dir} (force=true reruns it)")
        if outcome.logged_to:
            print(f"  its log had not been written; logged now to {outcome.logged_to}")
        return
    print_summary(outcome.summary, outcome.out_dir)
    if outcome.logged_to:
        print(f"  logged to {outcome.logged_to}")
    if not outcome.summary["complete"]:
        sys.exit(EXIT_INTERRUPTED)  # stop a sweep too: Ctrl-C means stop, not "next point"


if __name__ == "__main__":
    main_with_clean_errors(main)
