"""W&B with the real client, offline (no network): a run's config, summary metrics, per-sample table and
plots land in an offline run directory under results_dir; logger=none writes nothing."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from harness import TINY, compose_cfg
from graft_lab.experiment import run_experiment
from graft_lab.loggers import sample_rows

pytest.importorskip("wandb")
BLOCK, HEADER = 32768, 7  # the .wandb file is a LevelDB-style log of protobuf records


def wandb_records(path: Path):
    """The Record protos of an offline run's .wandb file (W&B ships no Python reader for it)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = path.read_bytes(), HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # block trailer
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if pos + HEADER + length > len(data):  # a chunk still being written
            return
        buf = (b"" if kind in (1, 2) else buf) + data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def complete_log(run_dir: Path, timeout: float = 60.0) -> list:
    """The records of an offline run once its log ends with the exit record. `run.finish()` only informs
    wandb-core that the run is done; the core closes the log, and writes its last block, a moment later
    (CI once read the log before that and found no summary)."""
    deadline = time.monotonic() + timeout
    while True:
        records = list(wandb_records(next(run_dir.glob("run-*.wandb"))))
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{run_dir}: no exit record after {timeout:.0f} s"
        time.sleep(0.1)


def logged(run_dir: Path) -> tuple[dict, dict]:
    """(summary, config) as the offline run recorded them."""
    summary, config = {}, {}
    for rec in complete_log(run_dir):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    return summary, config


def test_wandb_offline_run_directory_holds_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg([*TINY, "logger=wandb", f"results_dir={tmp_path}", "experiment_name=logtest", "tags=[t1]"])
    outcome = run_experiment(cfg, tmp_path / "runs" / "r0")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and outcome.logged_to == str(runs[0])
    summary, config = logged(runs[0])
    assert summary["tau"] == outcome.summary["tau"] and summary["config_hash"] == outcome.summary["config_hash"]
    assert summary["samples/_type"] == "table-file" and summary["samples/nrows"] == 1
    for key in ("match_share", "noise_bound", "unexplained_divergences"):  # the divergence audit (audit.py)
        assert summary[key] == outcome.summary[key]
    assert summary["match_share"] == 1.0 and summary["divergences/nrows"] == 0
    assert {"plots/acceptance_by_position/_type", "plots/phase_share/_type", "plots/per_category/_type"} <= set(summary)
    assert config["model.name"] == "tiny_random" and config["tree.total_tokens"] == 1  # method=ar: tree=k1
    media = runs[0] / "files" / "media"
    assert len(list(media.rglob("*.png"))) == 3 and len(list(media.rglob("*.table.json"))) == 2  # samples, divergences


def test_logger_none_writes_nothing(tmp_path):
    outcome = run_experiment(compose_cfg([*TINY, f"results_dir={tmp_path}"]), tmp_path / "runs" / "r0")
    assert outcome.logged_to is None and not (tmp_path / "wandb").exists()
    rows = sample_rows(outcome.out_dir / "answers.jsonl")
    assert len(rows) == 1 and rows[0][3] == outcome.summary["new_tokens"]


def test_a_run_interrupted_before_its_log_is_logged_once_by_the_rerun_that_skips_it(tmp_path, monkeypatch):
    """The race the Pareto smoke script hit: SIGINT after the table row, before the W&B log. The rerun skips
    the decode (the row is complete) but logs the run; a third run neither decodes nor logs it again."""
    import graft_lab.loggers as loggers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg([*TINY, "logger=wandb", f"results_dir={tmp_path}"])

    def interrupted(self, summary, out_dir):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(loggers.WandbLogger, "log_run", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(cfg, tmp_path / "runs" / "r0")
    assert not (tmp_path / "wandb").exists()

    second = run_experiment(cfg, tmp_path / "runs" / "r1")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert second.summary is None and second.out_dir == tmp_path / "runs" / "r0"  # skipped: not decoded again
    assert len(runs) == 1 and second.logged_to == str(runs[0])
    assert logged(runs[0])[0]["config_hash"] == json.loads((second.out_dir / "summary.json").read_text())["config_hash"]

    third = run_experiment(cfg, tmp_path / "runs" / "r2")
    assert third.summary is None and third.logged_to is None
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1
