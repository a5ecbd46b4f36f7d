"""Per-reply drafter agreement (`graft_lab.train.hardness`): the score is the trainer's own held-out statistic on
one reply, scoring resumes after a cut line, and `select` keeps whole replies in the asked order up to a token
budget, in the format the trainer reads."""

from __future__ import annotations

import json

import pytest
import torch

from graft_lab.models.target import Target, load_model
from graft_lab.train import hardness as H
from graft_lab.train.data import regenerated_conversations, render
from graft_lab.train.__main__ import main as train_main
from graft_lab.train.regenerate import main as regen_main
from graft_lab.train.loop import TrainConfig, build_drafter, read_init, validate

TARGET = "random:llama?seed=0&hidden=64&layers=4"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hard")
    model, tok = load_model(TARGET, dtype="float32")
    target = Target(model, tok)
    regen = tmp / "regen.jsonl"  # the target's own greedy replies: the data token is the target's argmax
    regen_main(["--out", str(regen), "--target", TARGET, "--dtype", "float32", "--batch", "4", "--max-new-tokens", "24",
                "--max-prompt-tokens", "40", "--max-prompts", "9"])
    lines = regen.read_text().splitlines()
    data = [tmp / "a.jsonl", tmp / "b.jsonl"]
    data[0].write_text("".join(line + "\n" for line in lines[:4]))
    data[1].write_text("".join(line + "\n" for line in lines[4:]))
    run = tmp / "drafter"  # a few steps on the replies, so that the drafter agrees with the target on some tokens
    train_main(["--target", TARGET, "--target-dtype", "float32", "--draft-vocab", "48", "--vocab-sequences", "4",
                "--eval-questions", "0", "--val-sequences", "1", "--max-len", "64", "--labels-per-step", "16",
                "--progress", "false", "--autocast", "false", "--eval-every-tokens", "0", "--ttt-steps", "3",
                "--max-tokens", "3000", "--warmup-tokens", "10", "--lr", "3e-3", "--epochs", "20",
                "--data", str(data[0]), "--out", str(run)])
    init = read_init(str(run))
    keep = init["vocab"]["keep"]
    net = build_drafter(target, keep, "random", 0)
    net.load_state_dict(init["model"])
    _score(tmp, run, data, tmp / "scores.jsonl")
    return tmp, target, net, keep, run, data


def _score(tmp, run, data, out):
    H.main(["score", "--drafter", str(run), "--target", TARGET, "--target-dtype", "float32", "--autocast", "false",
            "--max-len", "64", "--ttt-steps", "3", "--out", str(out)] + [a for d in data for a in ("--data", str(d))])
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_reply_scores_what_the_trainers_validation_measures_on_it(setup):
    tmp, target, net, keep, run, data = setup
    rows = [json.loads(line) for line in (tmp / "scores.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rows] == [(str(d), i) for d, n in zip(data, (4, 5)) for i in range(n)]
    cfg = TrainConfig(ttt_steps=3, autocast=False)
    t2d_index = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d_index[keep] = torch.arange(keep.numel())
    for r in rows:
        _, msgs, complete = next(regenerated_conversations(r["file"], skip=r["line"]))
        ids, mask = render(target.tokenizer, msgs, 64, complete)
        val = validate(net, target, [(ids, mask)], keep, t2d_index, cfg)
        assert r["agree"] == val["val_acc_full"] and r["loss"] == val["val_loss"] and r["tokens"] == ids.numel()
    assert len({H.agreement(r) for r in rows}) > 1  # the replies differ, so the order means something


def test_scoring_resumes_after_a_cut_line(setup):
    tmp, target, net, keep, run, data = setup
    whole = (tmp / "scores.jsonl").read_text()
    lines = whole.splitlines()
    cut = tmp / "cut.jsonl"
    cut.write_text("\n".join(lines[:6]) + "\n" + lines[6][:20])
    _score(tmp, run, data, cut)
    assert cut.read_text() == whole


def test_select_keeps_whole_replies_in_order_up_to_the_budget(setup, capsys):
    tmp, target, net, keep, run, data = setup
    rows = [{"file": "f", "line": i, "tokens": 10, "labels": 8 if i != 2 else 7, "agree": [i / 10, i / 20]}
            for i in range(8)]
    hard = H.pick(rows, "hardest", 25, seed=1)
    assert sorted(r["line"] for r in hard) == [0, 1, 3]  # lowest agreement first, line 2 has too few labels
    assert sorted(r["line"] for r in H.pick(rows, "easiest", 20, seed=1)) == [6, 7]
    rand = H.pick(rows, "random", 30, seed=4)
    assert rand == H.pick(rows, "random", 30, seed=4) and len(rand) == 3 and all(r["line"] != 2 for r in rand)
    assert {r["line"] for r in H.pick(rows, "random", 80, seed=5)} == {0, 1, 3, 4, 5, 6, 7}
    # stratified: each file keeps its share of the pool's tokens (here 5/7 and 2/7), hardest first within it
    two = [dict(r, file="g" if r["line"] >= 6 else "f") for r in rows]
    strat = H.pick(two, "hardest", 35, seed=1, stratify=True)
    assert sorted((r["file"], r["line"]) for r in strat) == [("f", 0), ("f", 1), ("f", 3), ("g", 6)]
    assert sorted(r["line"] for r in H.pick(two, "hardest", 35, seed=1)) == [0, 1, 3, 4]

    scores = tmp / "scores.jsonl"
    out = tmp / "hard.jsonl"
    H.main(["select", "--scores", str(scores), "--pick", "hardest", "--max-tokens", "60", "--out", str(out)])
    said = capsys.readouterr().out
    assert "[hardness] hardest:" in said and str(out) in said
    chosen = [json.loads(line) for line in out.read_text().splitlines()]
    scored = {(r["file"], r["line"]): r for r in map(json.loads, scores.read_text().splitlines())}
    kept = sorted(scored[(c["source"], c["line"])]["agree"] for c in chosen)
    others = [r for k, r in scored.items() if k not in {(c["source"], c["line"]) for c in chosen} and r["labels"] >= 8]
    assert chosen and all(H.agreement(r) >= max(sum(a) / len(a) for a in kept) for r in others)
    for c in chosen:  # the source row, as the trainer reads it
        src = json.loads((tmp / c["source"].split("/")[-1]).read_text().splitlines()[c["line"]])
        assert c["messages"] == src["messages"] and c["complete"] == src["complete"]
    assert [m for _, m, _ in regenerated_conversations(out)] == [c["messages"] for c in chosen]
    meta = json.loads((tmp / "hard.jsonl.meta.json").read_text())
    assert meta["replies"] == len(chosen) and meta["tokens"] == sum(scored[(c["source"], c["line"])]["tokens"] for c in chosen)


@pytest.mark.parametrize("argv, message", [
    (["select", "--scores", "nowhere.jsonl", "--max-tokens", "10", "--out", "x"], "is not a file"),
    (["select", "--scores", "nowhere.jsonl", "--max-tokens", "0", "--out", "x"], "at least 1"),
    (["score", "--drafter", "d", "--data", "nowhere.jsonl", "--out", "x"], "is not a file"),
    (["score", "--drafter", "nowhere", "--data", "DATA", "--out", "x", "--target", TARGET, "--target-dtype", "float32"],
     "--drafter: init='nowhere' is neither a training run directory"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys, setup):
    argv = [str(setup[5][0]) if a == "DATA" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        H.main(argv)
    said = str(exc.value) if exc.value.code not in (0, 2) else capsys.readouterr().err
    assert message in said
