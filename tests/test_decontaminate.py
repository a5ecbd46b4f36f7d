"""Evaluation prompts stay out of the drafter's training data: the index of evaluation prompts, the screen on the
training sources, ShareGPT's evaluation set being the trainer's held-out conversations, and a scan of the whole
training stream."""

from __future__ import annotations

import itertools
import json

import pytest
from omegaconf import OmegaConf

from graft_lab.data import DATASETS
from graft_lab.data.sharegpt import conversations
from graft_lab.train.data import HELDOUT, heldout_end, interleave, regenerated_source, sharegpt_conversations, sharegpt_source
from graft_lab.train.decontaminate import CONF, SPEC_BENCH, build_index, evaluation_prompts, normalise

TRAVEL = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences."


@pytest.fixture(scope="module")
def index():
    return build_index()


def test_the_index_holds_every_evaluation_set(index):
    names = [n for n, _ in evaluation_prompts()]
    sets = {n.split(":")[0] for n in names}
    assert {"mt_bench", "humaneval", "sharegpt"} <= sets
    assert sum(n.startswith("mt_bench:") for n in names) == 160  # all 80 questions, both turns: no preset's limit
    assert sum(n.startswith("humaneval:") for n in names) == 164
    if SPEC_BENCH.is_file():
        assert sum(n.startswith("spec_bench:") for n in names) > 480
    assert len(index) > 300


def test_a_pasted_prompt_overlaps_and_a_generic_turn_does_not():
    idx = build_index([("mt:1", TRAVEL), ("mt:2", "Can you parallelize it?"), ("sg:1", "continue")])
    assert normalise("  Hawaii,\tTRIP!  ") == "hawaii trip"
    assert idx.match(TRAVEL) == "mt:1"
    assert idx.match("Hi! Please help: " + TRAVEL.upper() + " Thanks, and keep it short.") == "mt:1"
    assert idx.match("Compose a short poem about a recent trip to Hawaii.") is None  # same topic, other words
    assert idx.match("can you parallelize it") == "mt:2"  # a short prompt matches only as the whole turn
    assert idx.match("Can you parallelize it? Here is my code: for i in range(10): print(i)") is None
    assert idx.match("continue") is None and len(idx) == 2  # "continue" is not indexed
    chat = [{"role": "user", "content": "hello there, how are you today"}, {"role": "assistant", "content": TRAVEL},
            {"role": "user", "content": TRAVEL}]
    assert idx.conversation(chat[:2]) is None  # replies are not prompts
    assert idx.conversation(chat) == "mt:1"


def test_the_screen_drops_overlapping_conversations_and_keeps_positions(tmp_path):
    idx = build_index([("mt:1", TRAVEL)])
    rows = [{"index": i, "messages": [{"role": "user", "content": TRAVEL if i in (1, 4) else f"question {i} about cats"},
                                      {"role": "assistant", "content": "ok"}], "complete": True} for i in range(6)]
    path = tmp_path / "regen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def other(start):
        return (([{"role": "user", "content": f"b{i}"}], True) for i in range(start, 6))

    full = list(interleave([regenerated_source(path, 1, idx), other]))
    kept = [m[0]["content"] for _, m, _ in full]
    assert TRAVEL not in kept and len(full) == 10  # 12 items, 2 dropped
    positions = [p for p, _, _ in full]
    assert 2 not in positions and 8 not in positions  # items 1 and 4 of the first source
    for skip in range(12):  # a resumed run continues where it stopped, dropped items included
        assert list(interleave([regenerated_source(path, 1, idx), other], skip)) == [r for r in full if r[0] >= skip]
    unscreened = [m[0]["content"] for _, m, _ in interleave([regenerated_source(path, 1), other])]
    assert unscreened.count(TRAVEL) == 2


def test_sharegpt_evaluates_only_the_conversations_the_trainer_held_out():
    end = heldout_end(HELDOUT)
    node = OmegaConf.load(CONF / "sharegpt.yaml")
    qs = DATASETS.build(node)
    order = {cid: n for n, (cid, _) in enumerate(itertools.islice(conversations(), end + 50))}
    assert len(qs) == 24 == end and all(order[q.question_id] < end for q in qs)
    assert all(len(q.turns) <= node.max_turns for q in qs)
    later = DATASETS.build(OmegaConf.merge(node, {"held_out": False, "limit": 30}))
    assert len(later) == 30 and any(order[q.question_id] >= end for q in later)
    first_trained = next(itertools.islice(sharegpt_conversations(), HELDOUT, None))[0]
    assert first_trained == end  # the trainer's first training conversation is the first one not evaluated


def test_no_training_conversation_overlaps_an_evaluation_prompt(index):
    """The whole ShareGPT training stream, unscreened, as the trainer reads it after its held-out conversations
    (the regenerated replies are answers to its first turns). With `held_out: false` in conf/dataset/sharegpt.yaml
    the evaluation set reads on into training conversations, and this test fails."""
    items = list(sharegpt_source(HELDOUT)(0))
    hits = [(n, hit) for n, item in enumerate(items) if (hit := index.conversation(item[0]))]
    assert len(items) > 11_000 and hits == []
