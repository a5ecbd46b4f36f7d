"""No lost or mixed-up results (issue 13): runs started together keep apart, SIGTERM and a full disk leave a
consistent incomplete run that a rerun resumes question by question, the skip check trusts only what is
on disk, sampling is independent of the baseline, and broken numbers stop decoding with a typed error."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import ROOT, TINY, compose_cfg, run_py
from graft_lab import rundir, runner
from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.none import NoDrafter
from graft_lab.errors import DecodingError, DrafterMismatchError, NonFiniteLogitsError
from graft_lab.experiment import run_experiment
from graft_lab.graft import graft_root
from graft_lab.pruners import NoPruner
from graft_lab.results import ResultsTable
from graft_lab.retrievers import NoRetriever
from graft_lab.tree import DraftTree, Source
from graft_lab.verify import SamplingParams

SAMPLE = ["gen=sample", "gen.temperature=5.0", "gen.top_p=1.0"]  # flat enough that samples differ by seed


def go(tmp: Path, *overrides: str, out: str = "r0"):
    return run_experiment(compose_cfg([*TINY, f"results_dir={tmp}", *overrides]), tmp / "runs" / out)


def lines(path: Path) -> list[dict]:
    data = path.read_text()
    assert data == "" or data.endswith("\n"), "a half-written line"
    return [json.loads(x) for x in data.splitlines()]


PROGRESS = re.compile(r"\d+/\d+ \[")  # a tqdm bar: "n/total [elapsed<left, rate]"


def error_lines(err: str) -> list[str]:
    """stderr without the progress bar's redraws: what a user reads as messages."""
    return [x for x in err.replace("\r", "\n").splitlines() if x.strip() and not PROGRESS.search(x)]


def cli(tmp: Path, *args: str) -> subprocess.Popen:
    """run.py in its own process with the config's own (unique) Hydra run directory."""
    cmd = [sys.executable, str(ROOT / "run.py"), *TINY, f"results_dir={tmp}", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ---- runs side by side -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_runs_started_together_keep_their_own_dirs_rows_and_answers(tmp_path):
    procs = [cli(tmp_path, "dataset.limit=3", f"gen.seed={seed}") for seed in (1, 2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    df = ResultsTable(tmp_path).read()
    assert len(df) == 2 and df["complete"].all() and df["run_dir"].nunique() == 2
    for rel in df["run_dir"]:
        run_dir = tmp_path / rel
        assert [r["question_id"] for r in lines(run_dir / "answers.jsonl")] == [81, 82, 83]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["complete"] and summary["n_questions"] == 3
        assert str(summary["config"]["gen"]["seed"]) == str(df.set_index("run_dir").loc[rel, "cfg.gen.seed"])


def test_a_second_run_into_a_busy_output_dir_refuses(tmp_path, monkeypatch):
    """The lock is held while the first run decodes: a run into the same directory fails at once."""
    seen = []

    def second_run_meanwhile(*args, **kwargs):
        if not seen:
            seen.append(run_py([*TINY, f"output_dir={tmp_path / 'out'}", "gen.seed=9"], tmp_path / "other"))
        return real(*args, **kwargs)

    real = runner.answer_question
    monkeypatch.setattr(runner, "answer_question", second_run_meanwhile)
    outcome = go(tmp_path, f"output_dir={tmp_path / 'out'}")
    code, _, err = seen[0]
    assert code == 2 and "in use by another run" in err and len(error_lines(err)) == 1
    assert outcome.summary["complete"] and len(lines(tmp_path / "out" / "answers.jsonl")) == 1


# ---- SIGTERM, a full disk, resuming -------------------------------------------------------------------------

def test_a_sigterm_while_a_line_is_written_keeps_that_question_in_the_file_and_the_summary(tmp_path, monkeypatch):
    """The stop lands inside the append, after the line is written and before it is synced: the line another process
    may already have read stays, and the summary counts it."""
    real = rundir.RunDir.append
    sent = []

    def append_then_stop(self, record):
        real_fsync = os.fsync

        def fsync_then_signal(fd):
            real_fsync(fd)
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # delivered before append's next bytecode unless held
        monkeypatch.setattr(os, "fsync", fsync_then_signal)
        try:
            real(self, record)
        finally:
            monkeypatch.setattr(os, "fsync", real_fsync)

    monkeypatch.setattr(rundir.RunDir, "append", append_then_stop)
    outcome = go(tmp_path, "dataset.limit=3", "gen.max_new_tokens=4")
    assert sent
    done = lines(outcome.out_dir / "answers.jsonl")
    assert not outcome.summary["complete"] and outcome.summary["n_questions"] == len(done) == 1


@pytest.mark.slow
def test_sigterm_keeps_the_finished_questions_and_the_row(tmp_path):
    out = tmp_path / "out"
    proc = cli(tmp_path, "dataset.limit=80", "gen.max_new_tokens=16", f"output_dir={out}")
    answers = out / "answers.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (answers.exists() and answers.read_text().count("\n")):
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    done = lines(answers)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["n_questions"] == len(done) >= 1
    row = ResultsTable(tmp_path).read().iloc[0]
    assert not bool(row["complete"]) and row["n_questions"] == len(done)


def test_disk_full_leaves_no_half_line_and_one_error_line_then_resumes(tmp_path, monkeypatch):
    calls = []
    real_write_all = rundir.write_all

    def full_on_second_question(fd, data):
        calls.append(1)
        if len(calls) == 2:
            os.write(fd, data[: len(data) // 2])  # part of the line reaches the disk, then it is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(rundir, "write_all", full_on_second_question)
    out = tmp_path / "out"
    code, _, err = run_py([*TINY, "dataset.limit=3", f"output_dir={out}"], tmp_path)
    assert code == 2 and "Traceback" not in err
    assert len(error_lines(err)) == 1 and "No space left on device" in err and "answers.jsonl" in err, err
    assert [r["question_id"] for r in lines(out / "answers.jsonl")] == [81]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["n_questions"] == 1 and "No space left" in summary["error"]
    assert not bool(ResultsTable(tmp_path).read().iloc[0]["complete"])

    monkeypatch.setattr(rundir, "write_all", real_write_all)
    code, _, err = run_py([*TINY, "dataset.limit=3", f"output_dir={out}"], tmp_path)
    assert code == 0, err[-2000:]
    assert [r["question_id"] for r in lines(out / "answers.jsonl")] == [81, 82, 83]
    assert json.loads((out / "summary.json").read_text())["complete"]


def test_an_interrupted_run_resumes_per_question_and_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    real = runner.answer_question
    decoded = []

    def interrupt_third(target, method, baseline, q, *args, **kwargs):
        decoded.append(q.question_id)
        if len(decoded) == 3 and interrupt:
            raise KeyboardInterrupt
        return real(target, method, baseline, q, *args, **kwargs)

    monkeypatch.setattr(runner, "answer_question", interrupt_third)
    args = ["dataset.limit=4", "dataset.first_turn_only=false", "gen.max_new_tokens=6", *SAMPLE]
    interrupt = True
    first = go(tmp_path, *args, out="a")
    assert first.summary["complete"] is False and first.summary["n_questions"] == 2
    kept = (first.out_dir / "answers.jsonl").read_text()

    interrupt, decoded[:] = False, []
    resumed = go(tmp_path, *args, out="b")  # no output_dir: the table points at the interrupted run
    assert resumed.out_dir == first.out_dir and decoded == [83, 84]
    assert (first.out_dir / "answers.jsonl").read_text().startswith(kept)
    assert resumed.summary["complete"] and resumed.summary["n_questions"] == 4 and resumed.summary["n_turns"] == 8
    df = ResultsTable(tmp_path).read()
    assert len(df) == 1 and bool(df.iloc[0]["complete"]) and df.iloc[0]["n_questions"] == 4

    straight = go(tmp_path / "straight", *args)
    ids = lambda o: [r["choices"][0]["output_ids"] for r in lines(o.out_dir / "answers.jsonl")]
    assert ids(resumed) == ids(straight)  # per-question generators: resuming does not shift the samples
    assert resumed.summary["new_tokens"] == straight.summary["new_tokens"]


def test_force_overwrites_a_finished_output_dir(tmp_path):
    out = tmp_path / "out"
    go(tmp_path, f"output_dir={out}", "dataset.limit=2")
    code, _, err = run_py([*TINY, f"output_dir={out}"], tmp_path / "other")
    assert code == 2 and "holds a finished run" in err
    assert len(lines(out / "answers.jsonl")) == 2  # untouched
    forced = go(tmp_path / "other", f"output_dir={out}", "force=true")
    assert forced.summary["complete"] and len(lines(out / "answers.jsonl")) == 1


# ---- the skip check and the config hash --------------------------------------------------------------------

def write_questions(path: Path, turns: list[str]) -> None:
    path.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                            for i, t in enumerate(turns)))


def test_skip_only_when_the_output_is_on_disk_and_the_dataset_is_unchanged(tmp_path):
    data = tmp_path / "q.jsonl"
    write_questions(data, ["What is a tree?", "Why is the sky blue?"])
    args = ["dataset=jsonl", f"dataset.path={data}", "dataset.limit=null"]
    first = go(tmp_path, *args, out="a")
    assert first.summary["complete"] and first.summary["dataset_hash"]
    assert go(tmp_path, *args, out="b").summary is None  # skipped: same config, same questions, output on disk

    write_questions(data, ["What is a tree?", "Why is the sea blue?"])  # same path, other content
    changed = go(tmp_path, *args, out="c")
    assert changed.summary is not None and changed.summary["config_hash"] != first.summary["config_hash"]
    assert changed.summary["dataset_hash"] != first.summary["dataset_hash"]
    df = ResultsTable(tmp_path).read()
    assert set(df["dataset_hash"]) == {first.summary["dataset_hash"], changed.summary["dataset_hash"]}
    assert set(df["method"]) == {"ar"}

    for p in sorted(changed.out_dir.iterdir()):
        p.unlink()
    changed.out_dir.rmdir()  # the recorded run was deleted: the table alone does not make it done
    again = go(tmp_path, *args, out="d")
    assert again.summary is not None and again.out_dir == tmp_path / "runs" / "d"


def test_the_method_name_is_part_of_the_config_hash():
    from graft_lab.provenance import config_hash

    config = {"drafter": {"name": "none"}, "pruner": {"name": "none"}, "retriever": {"name": "none"},
              "graft": {"name": "root"}}
    assert config_hash(config, "d1") != config_hash(config, "d2")
    with_ngram = {**config, "retriever": {"name": "ngram"}}
    assert config_hash(with_ngram, "d1") != config_hash(config, "d1")


def test_a_drafter_retrained_under_the_same_path_is_a_new_run(tmp_path):
    """A complete run is reused by config hash: a drafter whose weights changed under the same path (a new
    shipped stage, a rerun of training into the same directory) must not match the old run's hash."""
    from graft_lab.provenance import config_hash, drafter_hash

    ckpt = tmp_path / "drafter"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"stage 6")
    config = {"drafter": {"name": "eagle3", "path": str(ckpt)}}
    before = config_hash(config, "d1")
    assert config_hash(config, "d1") == before  # stable while the files are unchanged
    (ckpt / "model.safetensors").write_bytes(b"stage 7")
    assert config_hash(config, "d1") != before
    assert drafter_hash({"drafter": {"name": "eagle3", "path": "builtin:smollm2-135m-instruct-eagle3"}}) is not None
    assert drafter_hash({"drafter": {"name": "eagle3", "path": "org/hub-id"}}) is None  # no network: the id is hashed
    assert drafter_hash({"drafter": {"name": "none"}}) is None


# ---- generators ----------------------------------------------------------------------------------------------

def test_sampled_output_does_not_depend_on_the_baseline(tmp_path):
    args = ["dataset.limit=2", "dataset.first_turn_only=false", "gen.max_new_tokens=8", *SAMPLE]
    ids = lambda o: [r["choices"][0]["output_ids"] for r in lines(o.out_dir / "answers.jsonl")]
    with_ar = ids(go(tmp_path / "a", *args, "baseline=ar"))
    alone = ids(go(tmp_path / "b", *args, "baseline=none"))
    other_seed = ids(go(tmp_path / "c", *args, "baseline=none", "gen.seed=1"))
    assert with_ar == alone
    assert other_seed != alone  # the samples do depend on the seed: the comparison above can fail


# ---- a later turn beyond the context ----------------------------------------------------------------------

def test_a_later_turn_beyond_the_context_ends_only_that_question(tmp_path):
    data = tmp_path / "q.jsonl"
    long = " ".join(["word"] * 40)
    data.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": [long, long]}) + "\n"
                    + json.dumps({"question_id": 2, "category": "qa", "turns": ["hi", "and?"]}) + "\n")
    code, out, err = run_py([*TINY, "dataset=jsonl", f"dataset.path={data}", "dataset.limit=null",
                             "dataset.first_turn_only=false", "model.max_context=100", "gen.max_new_tokens=8",
                             f"output_dir={tmp_path / 'out'}"], tmp_path)
    assert code == 0, err[-2000:]
    first, second = lines(tmp_path / "out" / "answers.jsonl")
    assert first["stop_reasons"][-1] == "prompt_too_long" and len(first["choices"][0]["turns"]) == 1
    assert len(second["choices"][0]["turns"]) == 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["complete"] and summary["cut_by_context"] == [1] and summary["n_turns"] == 3


# ---- NaN / inf logits and token ids outside the vocabulary ------------------------------------------------

def tiny_setup():
    from tiny import tiny_target

    target = tiny_target("llama", seed=1)
    method = Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, budget=1)
    return target, method, torch.tensor([5, 9, 13, 21])


def test_nan_in_the_target_logits_names_the_step():
    target, method, prompt = tiny_setup()
    real = target.verify
    calls = []

    def nan_on_third(tree, cache, want_aux):
        out = real(tree, cache, want_aux)
        calls.append(1)
        if len(calls) == 3:
            out.logits[0, 7] = float("nan")
        return out

    target.verify = nan_on_third
    with pytest.raises(NonFiniteLogitsError, match="NaN in the target's logits at decode step 3"):
        generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=10))
    with torch.no_grad():
        target.model.get_output_embeddings().weight[3, 0] = float("inf")
    target.verify = real
    with pytest.raises(NonFiniteLogitsError, match="step 0"):
        generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=10))


def test_nan_in_the_drafter_logits_is_an_error():
    from graft_lab.drafters.eagle3 import Eagle3Drafter
    from tiny import tiny_eagle3

    target, _, prompt = tiny_setup()
    net = tiny_eagle3(target)
    with torch.no_grad():
        net.lm_head.weight[0, 0] = float("nan")
    drafter = Eagle3Drafter(net, target.model.get_input_embeddings(), depth=2, top_k=2)
    method = Method(drafter, NoPruner(), NoRetriever(), graft_root, budget=4)
    with pytest.raises(NonFiniteLogitsError, match="drafter"):
        generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=10))


class OutOfVocabulary(NoRetriever):
    def retrieve(self, budget: int) -> DraftTree:
        return DraftTree(torch.tensor([self.root, 10_000]), torch.tensor([-1, 0]), torch.tensor([0, 1]),
                         torch.zeros(2), torch.tensor([int(Source.ROOT), int(Source.RETRIEVED)], dtype=torch.int8))


def test_a_token_id_outside_the_vocabulary_is_never_verified_or_emitted():
    target, _, prompt = tiny_setup()
    method = Method(NoDrafter(), NoPruner(), OutOfVocabulary(), graft_root, budget=2)
    with pytest.raises(DecodingError, match=r"\[10000\] are outside the target's vocabulary"):
        generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=10))


def test_a_drafter_whose_d2t_leaves_the_vocabulary_is_refused():
    from graft_lab.drafters.eagle3 import check_compatible
    from tiny import tiny_eagle3

    target, _, _ = tiny_setup()
    net = tiny_eagle3(target, draft_vocab=32)
    check_compatible(net, target)
    net.d2t[-1] = target.vocab_size  # draft id 31 -> target id vocab + 31
    with pytest.raises(DrafterMismatchError, match="d2t"):
        check_compatible(net, target)


def test_nan_during_a_run_leaves_the_summary_and_the_row_and_one_line(tmp_path, monkeypatch):
    from graft_lab.models.target import Target

    real_verify, real_answer = Target.verify, runner.answer_question
    current = []

    def nan_in_question_82(self, tree, cache, want_aux):
        out = real_verify(self, tree, cache, want_aux)
        if current[-1] == 82:
            out.logits.fill_(float("nan"))
        return out

    def answer(target, method, baseline, q, *args, **kwargs):
        current.append(q.question_id)
        return real_answer(target, method, baseline, q, *args, **kwargs)

    monkeypatch.setattr(Target, "verify", nan_in_question_82)
    monkeypatch.setattr(runner, "answer_question", answer)
    code, _, err = run_py([*TINY, "dataset.limit=2", f"output_dir={tmp_path / 'out'}"], tmp_path)
    assert code == 2 and len(error_lines(err)) == 1 and "Traceback" not in err
    assert "question 82" in err and "NaN in the target's logits at decode step" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["complete"] is False and summary["n_questions"] == 1 and "NaN" in summary["error"]
    assert not bool(pd.read_parquet(tmp_path / "runs.parquet").iloc[0]["complete"])
