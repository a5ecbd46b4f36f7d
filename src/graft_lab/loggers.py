"""Experiment loggers (`logger=none|wandb`), called once a run has finished so that a failed or skipped
run leaves no half-logged entry. A run that finished but was never logged (interrupted between its table
row and its log) is logged by the rerun that skips it; `logged.json` in the run directory records each
destination it reached, so no run is logged twice to one place. W&B is offline by default: the run directory lands under
`<results_dir>/wandb/` and `wandb sync` uploads it later; `logger.mode=online` streams instead."""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from .errors import ConfigError
from .registry import Registry
from .results import flatten


class Logger(Protocol):
    destination: str | None  # where runs go (None: nowhere); a run logged there is not logged there again

    def check(self) -> None:
        """Raise ConfigError now, before decoding, when logging is bound to fail (no package, no credentials)."""

    def log_run(self, summary: dict, out_dir: Path) -> str | None:
        """Log a finished run; returns where it went (for the console), or None."""


LOGGERS: Registry[Logger] = Registry("logger")


class NoLogger:
    destination = None

    def check(self) -> None:
        return None

    def log_run(self, summary: dict, out_dir: Path) -> str | None:
        return None


@LOGGERS.register("none")
def build_none() -> NoLogger:
    return NoLogger()


@dataclass
class WandbOptions:
    mode: str = "offline"  # offline | online | disabled
    project: str = "graft-lab"
    entity: str | None = None
    dir: str = "results"  # W&B writes its wandb/ folder here
    group: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"logger.mode must be offline, online or disabled; got '{self.mode}'")


SUMMARY_KEYS = ("tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "new_tokens", "steps", "wall_time_s",
                "drafted_per_step", "retrieved_per_step", "accepted_retrieved_per_step", "peak_memory_mb",
                "n_questions", "n_turns", "matches_baseline", "match_share", "noise_bound", "noise_bound_top", "unexplained_divergences",
                "complete", "config_hash", "git_commit", "device", "decode_speedup", "prefill_share", "mean_tree_size",
                "efficiency")
DIVERGENCE_COLUMNS = ["question_id", "turn", "position", "ar_token", "spec_token", "ar_gap", "ar_margin", "spec_gap",
                      "bound", "verdict"]
SAMPLE_COLUMNS = ["question_id", "category", "turn", "new_tokens", "steps", "tau", "wall_time", "baseline_wall_time",
                  "speedup", "matches_baseline", "text"]


def sample_rows(answers: Path) -> list[list]:
    """One row per generated turn of answers.jsonl."""
    rows = []
    for line in answers.read_text().splitlines() if answers.is_file() else []:
        rec = json.loads(line)
        ch, base = rec["choices"][0], rec.get("baseline") or {}
        for t, text in enumerate(ch["turns"]):
            lengths = ch["accept_lengths"][t]
            b_wall = base["wall_time"][t] if base else None
            rows.append([
                str(rec["question_id"]), rec["category"], t, ch["new_tokens"][t], len(lengths),
                sum(lengths) / max(len(lengths), 1), ch["wall_time"][t], b_wall,
                b_wall / ch["wall_time"][t] if b_wall and ch["wall_time"][t] else None,
                base["matches"][t] if base else None, text,
            ])
    return rows


def wandb_credentials() -> bool:
    """Whether W&B can authenticate: WANDB_API_KEY, or a netrc entry for its host (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger:
    def __init__(self, opts: WandbOptions):
        self.opts = opts
        where = Path(opts.dir).resolve() if opts.mode == "offline" else f"{opts.entity or ''}/{opts.project}"
        self.destination = None if opts.mode == "disabled" else f"wandb:{opts.mode}:{where}"

    def check(self) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("logger=wandb needs the wandb package (pip install wandb); or logger=none")
        if self.opts.mode == "online" and not wandb_credentials():
            raise ConfigError("logger.mode=online but no W&B credentials: set WANDB_API_KEY or run `wandb login`; "
                              "or use logger.mode=offline and `wandb sync` later")

    def log_run(self, summary: dict, out_dir: Path) -> str | None:
        import matplotlib.pyplot as plt
        import wandb

        from .plot import run_figures
        from .results import method_name

        Path(self.opts.dir).mkdir(parents=True, exist_ok=True)
        config = summary["config"]
        run = wandb.init(
            mode=self.opts.mode, project=self.opts.project, entity=self.opts.entity, dir=self.opts.dir,
            group=self.opts.group, tags=self.opts.tags or None, name=f"{method_name(config)}-{out_dir.name}",
            config=flatten(config), reinit="finish_previous",
        )
        try:
            run.summary.update({k: summary.get(k) for k in SUMMARY_KEYS})
            run.summary.update({f"phase_share/{k}": v for k, v in summary.get("phase_share", {}).items()})
            run.summary.update({f"category/{c}/{k}": v for c, s in summary.get("per_category", {}).items()
                                for k, v in s.items() if k in ("tau", "speedup")})
            figs = run_figures(summary)
            run.log({
                "samples": wandb.Table(columns=SAMPLE_COLUMNS, data=sample_rows(out_dir / "answers.jsonl")),
                "divergences": wandb.Table(columns=DIVERGENCE_COLUMNS, data=[[d.get(c) for c in DIVERGENCE_COLUMNS]
                                                                              for d in summary.get("divergences") or []]),
                **{f"plots/{name}": wandb.Image(fig) for name, fig in figs.items()},
            })
            for fig in figs.values():
                plt.close(fig)
            return str(Path(run.dir).parent) if self.opts.mode == "offline" else run.url
        finally:
            run.finish()


@LOGGERS.register("wandb", WandbOptions)
def build_wandb(opts: WandbOptions) -> WandbLogger:
    return WandbLogger(opts)
