"""Bad inputs through the CLI (issue 13's fault catalogue): every case ends with a non-zero exit, exactly one
stderr line that names the field or file, no traceback, and no result file written or changed. Cases that
are knowable from the config, the files or the tokenizer also fail before any model loads."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pandas as pd
import pytest

from harness import TINY, run_py, run_py_subprocess, written

Setup = Callable[[Path, Path, pytest.MonkeyPatch], list[str]]  # (tmp, assets, monkeypatch) -> extra overrides


@dataclass
class Case:
    name: str
    args: list[str]
    needle: str  # must appear in the one error line (the field or the file)
    setup: Setup | None = None
    before_load: bool = True  # fails before any model loads
    base: list[str] = field(default_factory=lambda: list(TINY))


def jsonl(*rows: str | bytes) -> Setup:
    """A dataset file holding `rows` (raw lines), passed as dataset=jsonl dataset.path=FILE."""
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        path = tmp / "data" / "q.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"".join((r if isinstance(r, bytes) else r.encode()) + b"\n" for r in rows))
        return ["dataset=jsonl", f"dataset.path={path}"]
    return setup


def row(turns, qid=1, **extra) -> str:
    return json.dumps({"question_id": qid, "category": "qa", "turns": turns, **extra})


def file_at(name: str, content: bytes, key: str) -> Setup:
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        path = tmp / "files" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
        return [f"{key}={path}"]
    return setup


def model_variant(breakage: Callable[[Path], None], key: str = "model.path") -> Setup:
    """A copy of the good local model directory, broken by `breakage`."""
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        path = tmp / "model"
        shutil.copytree(assets / "model", path)
        breakage(path)
        return [f"{key}={path}"]
    return setup


def drafter_variant(breakage: Callable[[Path], None]) -> Setup:
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        path = tmp / "drafter"
        shutil.copytree(assets / "drafter", path)
        breakage(path)
        return ["drafter=eagle3", f"drafter.path={path}"]
    return setup


def truncate(name: str) -> Callable[[Path], None]:
    def breakage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: len(data) // 2])
    return breakage


def remove(*names: str) -> Callable[[Path], None]:
    def breakage(path: Path) -> None:
        for name in names:
            (path / name).unlink()
    return breakage


def output_dir_with(summary: dict | str | None, answers: str | None = None) -> Setup:
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        out = tmp / "out"
        out.mkdir()
        if summary is not None:
            (out / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
        if answers is not None:
            (out / "answers.jsonl").write_text(answers)
        return [f"output_dir={out}"]
    return setup


def results_with(make: Callable[[Path], None]) -> Setup:
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        make(tmp)
        return []
    return setup


def output_dir_under_a_file(tmp: Path, assets: Path, mp) -> list[str]:
    (tmp / "afile").write_text("x")
    return [f"output_dir={tmp / 'afile' / 'sub'}"]


def read_only(module: str) -> Setup:
    """The directory `module` probes (results_dir or output_dir) refuses new files, as a read-only mount does
    (tests run as root, for whom chmod does not bar writes)."""
    def setup(tmp: Path, assets: Path, mp) -> list[str]:
        def refuse(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        mp.setattr(f"graft_lab.{module}.tempfile", SimpleNamespace(NamedTemporaryFile=refuse))
        return []
    return setup


def no_wandb_credentials(tmp: Path, assets: Path, mp) -> list[str]:
    mp.delenv("WANDB_API_KEY", raising=False)
    (tmp / "netrc").write_text("")
    mp.setenv("NETRC", str(tmp / "netrc"))
    return []


def no_triton_interpreter(tmp: Path, assets: Path, mp) -> list[str]:
    mp.delenv("TRITON_INTERPRET", raising=False)
    return []


LONG_TURN = " ".join(["word"] * 400)

CASES = [
    # non-finite and out-of-range numbers
    Case("temperature nan", ["gen.temperature=nan"], "gen.temperature"),
    Case("temperature inf", ["gen.temperature=inf"], "gen.temperature"),
    Case("temperature negative", ["gen.temperature=-1"], "gen.temperature"),
    Case("top_p inf", ["gen.top_p=inf"], "gen.top_p"),
    Case("top_p nan", ["gen.top_p=nan"], "gen.top_p"),
    Case("top_k negative", ["gen.top_k=-1"], "gen.top_k"),
    Case("seed not a number", ["gen.seed=abc"], "gen.seed"),
    Case("empty stop string", ['gen.stop_strings=[""]'], "gen.stop_strings"),
    Case("tree depth 0", ["tree.depth=0"], "tree.depth"),
    Case("dataset limit negative", ["dataset.limit=-3"], "dataset.limit"),
    Case("unknown dtype", ["model.dtype=float13"], "model.dtype"),
    Case("unknown baseline", ["baseline=sometimes"], "baseline"),
    Case("pruner threshold nan", ["pruner=dyn_depth", "pruner.thresholds=[nan,0.3,0.1]"], "pruner.thresholds"),
    # the budget against the context
    Case("budget beyond the context", ["tree.total_tokens=100000"], "tree.total_tokens"),
    Case("new tokens fill the context", ["gen.max_new_tokens=5000"], "gen.max_new_tokens"),
    Case("max_context beyond the model", ["model.max_context=100000"], "model.max_context"),
    Case("first prompt beyond the context", ["model.max_context=24", "tree.total_tokens=2", "gen.max_new_tokens=2"],
         "model.max_context"),
    Case("long jsonl prompt beyond the context", ["model.max_context=256"], "q.jsonl",
         jsonl(row([LONG_TURN], 1), row(["short"], 2))),
    # mandatory paths and model directories
    Case("model=local without a path", ["model=local"], "model.path"),
    Case("model path missing", ["model=local", "model.path=/nonexistent/model"], "/nonexistent/model"),
    Case("model dir without config", [], "config.json", model_variant(remove("config.json"))),
    Case("model dir with a garbage config", [], "config.json",
         model_variant(lambda p: (p / "config.json").write_text("{not json"))),
    Case("truncated model safetensors", [], "model.safetensors", model_variant(truncate("model.safetensors"))),
    Case("model dir without tokenizer", [], "tokenizer", model_variant(remove("tokenizer.json", "tokenizer_config.json"))),
    Case("random model option", ["model.path='random:llama?width=3'"], "width"),
    Case("cuda on a CPU machine", ["model.device=cuda"], "model.device"),
    Case("triton attention on CPU", ["verify.attn=triton"], "verify.attn", no_triton_interpreter),
    Case("drafter path missing", ["drafter=eagle3", "drafter.path=/nonexistent/drafter"], "/nonexistent/drafter"),
    Case("truncated drafter safetensors", [], "model.safetensors", drafter_variant(truncate("model.safetensors"))),
    Case("unknown drafter dtype", ["drafter.dtype=int8"], "drafter.dtype", drafter_variant(lambda p: None)),
    # datasets
    Case("jsonl without a path", ["dataset=jsonl"], "dataset.path"),
    Case("jsonl file missing", ["dataset=jsonl", "dataset.path=/nonexistent/q.jsonl"], "/nonexistent/q.jsonl"),
    Case("latin-1 dataset", [], "q.jsonl:2", jsonl(row(["fine"], 1), '{"question_id": 2, "turns": ["caf\u00e9"]}'.encode("latin-1"))),
    Case("lone surrogate", [], "q.jsonl:1", jsonl('{"question_id": 1, "category": "qa", "turns": ["a \\ud800 b"]}')),
    Case("turns is a string", [], "q.jsonl:1", jsonl(row("Hello"))),
    Case("turns is empty", [], "q.jsonl:1", jsonl(row([]))),
    Case("turn is not a string", [], "q.jsonl:1", jsonl(row(["a", 5]))),
    Case("turn is blank", [], "q.jsonl:1", jsonl(row(["a", "  "]))),
    Case("not a JSON line", [], "q.jsonl:2", jsonl(row(["a"]), "{oops")),
    Case("row is a list", [], "q.jsonl:1", jsonl('["a", "b"]')),
    Case("no question_id", [], "q.jsonl:1", jsonl('{"category": "qa", "turns": ["a"]}')),
    Case("question_id is null", [], "q.jsonl:1", jsonl(row(["a"], None))),
    Case("category not a string", [], "q.jsonl:1", jsonl(row(["a"], 1, category=3))),
    Case("duplicate question ids", [], "q.jsonl:2", jsonl(row(["a"], 7), row(["b"], 7))),
    Case("empty dataset file", [], "q.jsonl", jsonl()),
    Case("unknown category", ["dataset.categories=[nope]"], "dataset.categories"),
    Case("long_context lengths", ["dataset=long_context", "dataset.target_lengths=[10]"], "dataset.target_lengths"),
    # retriever warm-up files
    Case("warm_path missing", ["retriever=recycle", "retriever.warm_path=/nonexistent/w.npy"], "retriever.warm_path"),
    Case("warm_path garbage npy", ["retriever=recycle"], "retriever.warm_path",
         file_at("w.npy", b"garbage, not numpy", "retriever.warm_path")),
    Case("warm_path garbage pt", ["retriever=recycle"], "retriever.warm_path",
         file_at("w.pt", b"\x80\x04garbage", "retriever.warm_path")),
    Case("warm_path wrong suffix", ["retriever=recycle"], "retriever.warm_path",
         file_at("w.txt", b"1 2 3", "retriever.warm_path")),
    # logging
    Case("wandb online without credentials", ["logger=wandb", "logger.mode=online"], "logger.mode",
         no_wandb_credentials),
    # the results table and the output directory
    Case("corrupt runs.parquet", [], "runs.parquet",
         results_with(lambda tmp: (tmp / "runs.parquet").write_bytes(b"PAR1 this is not parquet"))),
    Case("corrupt runs.parquet with force", ["force=true"], "runs.parquet",
         results_with(lambda tmp: (tmp / "runs.parquet").write_bytes(b"PAR1 this is not parquet"))),
    Case("foreign runs.parquet", [], "runs.parquet",
         results_with(lambda tmp: pd.DataFrame({"x": [1]}).to_parquet(tmp / "runs.parquet"))),
    Case("runs.csv is a directory", [], "runs.csv", results_with(lambda tmp: (tmp / "runs.csv").mkdir())),
    Case("results_dir read-only", [], "results_dir", read_only("rundir")),
    Case("output_dir read-only", [], "output_dir", read_only("rundir")),
    Case("output_dir is a file", [], "output_dir", file_at("out", b"x", "output_dir")),
    Case("output_dir under a file", [], "output_dir", output_dir_under_a_file),
    Case("output_dir holds a finished run", [], "force=true",
         output_dir_with({"complete": True, "config_hash": "x"}, row(["a"]) + "\n")),
    Case("output_dir holds another config", [], "another config",
         output_dir_with({"complete": False, "config_hash": "other"}, row(["a"]) + "\n")),
    Case("output_dir holds answers only", [], "answers.jsonl", output_dir_with(None, row(["a"]) + "\n")),
    Case("output_dir summary corrupt", [], "summary.json", output_dir_with("{half")),
]
assert len({c.name for c in CASES}) == len(CASES) >= 40


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """A good local model directory (the tiny random Llama with its tokenizer) and an EAGLE-3 drafter for it."""
    from graft_lab.models.target import Target, load_model
    from tiny import write_eagle3

    root = tmp_path_factory.mktemp("assets")
    model, tokenizer = load_model("random:llama?seed=0&hidden=64&layers=4")
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    write_eagle3(Target(model, tokenizer), root / "drafter")
    return root


def snapshot(tmp: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in written(tmp) if p.is_file()}


def check_one_line(code: int, out: str, err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert code != 0, (out, err)
    assert len(lines) == 1 and lines[0].startswith("graft-lab: error:"), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in out + err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, assets, tmp_path, monkeypatch):
    loads = []
    real_load = __import__("graft_lab.runner", fromlist=["load_model"]).load_model
    monkeypatch.setattr("graft_lab.runner.load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    extra = case.setup(tmp_path, assets, monkeypatch) if case.setup else []
    if any(a.startswith("model.path=") and not a.startswith("model.path=random") for a in [*case.args, *extra]):
        extra = ["model=local", *extra]
    before = snapshot(tmp_path)
    code, out, err = run_py([*case.base, *extra, *case.args], tmp_path)
    check_one_line(code, out, err, case.needle)
    assert snapshot(tmp_path) == before, "a result file was written or changed"
    if case.before_load:
        assert not loads, "the model was loaded before the error"


def test_a_good_local_model_dir_passes_the_same_checks(assets, tmp_path):
    """The positive control for the model-directory cases: the unbroken copy runs."""
    code, out, err = run_py([*TINY, "model=local", f"model.path={assets / 'model'}", "drafter=eagle3",
                             f"drafter.path={assets / 'drafter'}", "tree.total_tokens=4"], tmp_path)
    assert code == 0, err[-2000:]
    assert len(written(tmp_path)) == 4


@pytest.mark.parametrize("args,needle", [
    (["gen.temperature=nan"], "gen.temperature"),
    (["model=local"], "model.path"),
    (["tree.total_tokens=100000"], "tree.total_tokens"),
], ids=["nan", "model-path", "budget"])
def test_bad_input_in_a_real_process(args, needle, tmp_path):
    proc = run_py_subprocess([*TINY, *args], tmp_path, timeout=300)
    assert proc.returncode == 2
    check_one_line(proc.returncode, proc.stdout, proc.stderr, needle)
    assert not written(tmp_path)


def test_corrupt_table_in_a_real_process(tmp_path):
    (tmp_path / "runs.parquet").write_bytes(b"not parquet at all")
    proc = run_py_subprocess(TINY, tmp_path, timeout=300)
    check_one_line(proc.returncode, proc.stdout, proc.stderr, "runs.parquet")
    assert (tmp_path / "runs.parquet").read_bytes() == b"not parquet at all"


def test_output_dir_in_use_by_another_run(tmp_path):
    from filelock import FileLock

    out = tmp_path / "out"
    out.mkdir()
    with FileLock(str(out / ".run.lock")):
        proc = run_py_subprocess([*TINY, f"output_dir={out}"], tmp_path, timeout=300)
    check_one_line(proc.returncode, proc.stdout, proc.stderr, "in use")
    assert not written(tmp_path)
