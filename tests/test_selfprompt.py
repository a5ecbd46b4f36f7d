"""Self-prompts (`graft_lab.train.selfprompt`): user turns the target samples from its own user header, screened,
written in whole seeded batches so that a resumed file equals an unbroken one."""

from __future__ import annotations

import json
import re

import pytest

from graft_lab.data.base import read_question_jsonl
from graft_lab.models.target import EMBEDDED, load_model
from graft_lab.train import selfprompt as S
from graft_lab.train.decontaminate import build_index
from graft_lab.train.regenerate import meta_path, question_file

TARGET = "random:llama?seed=0&hidden=64&layers=4"
MT_BENCH_1 = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
              "and must-see attractions.")


def test_the_user_header_is_the_template_before_a_first_user_turn():
    _, tok = load_model(TARGET, dtype="float32")
    header = S.user_header(tok)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False)
    assert chat.startswith(header + "Hello there") and header.endswith("user\n")


def test_the_screen_drops_unfinished_short_long_repeated_and_evaluation_turns():
    screen = S.Screen(build_index([("mt_bench:81:1", MT_BENCH_1)]))
    turns = [None, "Hi!", " ".join(["word"] * (S.MAX_WORDS + 1)), "Name three rivers in Spain.",
             "name three RIVERS in spain!", "Please: " + MT_BENCH_1, "Name three rivers in France."]
    assert [screen.keep(t) for t in turns] == [False, False, False, True, False, False, True]
    assert screen.dropped == {"unfinished": 1, "length": 2, "repeat": 1, "evaluation": 1}


def test_a_cut_last_line_is_dropped_and_the_next_draw_follows_the_last_batch(tmp_path):
    path = tmp_path / "self.jsonl"
    rows = [{"question_id": 0, "category": "self", "turns": ["a b c d"], "draw": 0},
            {"question_id": 1, "category": "self", "turns": ["e f g h"], "draw": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"question_id": 2, "cat')
    got, draw = S.existing(path)
    assert got == rows and draw == 4
    assert S.existing(tmp_path / "none.jsonl") == ([], 0)


def test_the_cli_drops_turns_a_random_target_never_ends_and_says_why(tmp_path, capsys):
    out = tmp_path / "self.jsonl"
    S.main(["--target", TARGET, "--dtype", "float32", "--out", str(out), "--prompts", "1", "--minutes", "0.001",
            "--batch", "3", "--max-new-tokens", "4"])
    assert out.read_text() == ""  # a random model does not end a turn in 4 tokens
    said = re.search(r"0 new prompts of (\d+) drawn \((\d+) unfinished dropped\)", capsys.readouterr().out)
    assert said and said[1] == said[2] and int(said[1]) % 3 == 0  # whole batches of 3 until the minutes ran out
    assert json.loads(meta_path(out).read_text())["runs"][0]["flags"]["temperature"] == 0.8


@pytest.mark.parametrize("args, message", [(["--prompts", "0"], "give --prompts N or --minutes M"),
                                           (["--prompts", "4", "--temperature", "0"], "must be above 0"),
                                           (["--prompts", "4", "--batch", "0"], "at least 1")])
def test_the_cli_rejects_bad_arguments_in_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        S.main(["--out", str(tmp_path / "x.jsonl")] + args)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_writes_prompts_and_a_resumed_file_equals_an_unbroken_one(tmp_path):
    common = ["--target", EMBEDDED, "--dtype", "float32", "--batch", "8", "--max-new-tokens", "64", "--seed", "3"]
    whole, split = tmp_path / "whole.jsonl", tmp_path / "split.jsonl"
    S.main(common + ["--out", str(whole), "--prompts", "8"])
    S.main(common + ["--out", str(split), "--prompts", "3"])
    first = split.read_text()
    S.main(common + ["--out", str(split), "--prompts", "8"])
    assert split.read_text().startswith(first) and split.read_text() == whole.read_text()
    rows = [json.loads(line) for line in whole.read_text().splitlines()]
    assert len(rows) >= 8 and [r["question_id"] for r in rows] == list(range(len(rows)))
    turns = [q.turns[0] for q in read_question_jsonl(whole)]
    assert len(set(turns)) == len(turns) and all(S.MIN_WORDS <= len(t.split()) <= S.MAX_WORDS for t in turns)
    assert [m[0]["content"] for _, m in question_file(whole)] == turns  # what `regenerate --prompts` reads
    other = tmp_path / "other.jsonl"
    S.main(common[:-1] + ["4", "--out", str(other), "--prompts", "1"])
    assert not set(turns) & {q.turns[0] for q in read_question_jsonl(other)}  # another seed, other turns
