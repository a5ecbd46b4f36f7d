"""Bundles: regenerated replies packed without their prompts, restored line for line from the prompt source."""

import gzip
import json

import pytest

from graft_lab.errors import ConfigError
from graft_lab.train.bundle import main as bundle_main
from graft_lab.train.bundle import pack, read, restore
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
    assert header["regenerate"]["runs"][0]["flags"]["dtype"] == "float32"  # provenance travels with the replies
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


def test_pack_refuses_an_empty_file_and_a_conversation_that_is_not_a_first_turn(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="holds no replies"):
        pack(empty, None, tmp_path / "b.jsonl.gz")
    long = tmp_path / "long.jsonl"
    msgs = [{"role": r, "content": "x"} for r in ("user", "assistant", "user", "assistant")]
    long.write_text(json.dumps({"index": 3, "messages": msgs, "complete": True}) + "\n")
    with pytest.raises(ConfigError, match="not a regenerated first turn"):
        pack(long, None, tmp_path / "b.jsonl.gz")
