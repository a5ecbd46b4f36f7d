"""Every dataset yields questions in the question.jsonl schema; the packaged ones work offline, the
streamed ShareGPT reader survives its truncated tail, long prompts hit their token lengths, and the hub
sets fail fast and clearly offline."""

from __future__ import annotations

import json
import time

import pytest

from graft_lab.data import DATASETS, Question
from graft_lab.data.json_stream import stream_json_array
from graft_lab.data.sharegpt import ShareGPTOptions, human_turns
from graft_lab.errors import ConfigError
from graft_lab.weights import model_tokenizer

TINY_TOKENIZER = "random:llama"


def check_schema(questions: list[Question]) -> None:
    assert questions
    ids = [q.question_id for q in questions]
    assert len(set(ids)) == len(ids)
    for q in questions:
        assert isinstance(q.question_id, (int, str)) and isinstance(q.category, str) and q.category
        assert isinstance(q.turns, tuple) and q.turns and all(isinstance(t, str) and t.strip() for t in q.turns)
        json.dumps({"question_id": q.question_id, "category": q.category, "turns": list(q.turns)})


def test_mt_bench():
    qs = DATASETS.build({"name": "mt_bench", "limit": None})
    check_schema(qs)
    assert len(qs) == 80 and all(len(q.turns) == 2 for q in qs)


def test_humaneval():
    qs = DATASETS.build({"name": "humaneval", "limit": None})
    check_schema(qs)
    assert len(qs) == 164 and qs[0].question_id == "HumanEval/0" and "def has_close_elements" in qs[0].turns[0]
    assert len(DATASETS.build({"name": "humaneval", "limit": 5, "template": "{prompt}"})[0].turns[0]) < 500


def test_sharegpt_streams_human_turns():
    t0 = time.perf_counter()
    qs = DATASETS.build({"name": "sharegpt", "limit": 10, "max_turns": 3})
    assert time.perf_counter() - t0 < 5, "10 questions must not read the whole 125 MB file"
    check_schema(qs)
    assert len(qs) == 10 and all(1 <= len(q.turns) <= 3 for q in qs) and {q.category for q in qs} == {"sharegpt"}
    later = DATASETS.build({"name": "sharegpt", "limit": 2, "skip": 5})
    assert later[0].question_id not in {q.question_id for q in qs[:5]}


def test_sharegpt_reader_on_a_truncated_file(tmp_path):
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}a"}, {"from": "gpt", "value": "x" * 50},
                                               {"from": "human", "value": f"q{i}b"}]} for i in range(30)]
    text = json.dumps(convs, indent=1)
    path = tmp_path / "sg.json"
    path.write_text(text[: int(len(text) * 0.9)])  # cut inside an element, as in the packaged dump
    items = list(stream_json_array(path, chunk=97))  # tiny chunks: elements straddle reads
    assert 20 < len(items) < 30 and items == convs[: len(items)]
    qs = human_turns(ShareGPTOptions(limit=None), path)
    assert qs[0] == Question("c0", "sharegpt", ("q0a", "q0b"))


def test_long_context_lengths_are_exact_prompt_tokens():
    lengths = [256, 700]
    qs = DATASETS.build({"name": "long_context", "target_lengths": lengths, "per_length": 2, "tokenizer": TINY_TOKENIZER})
    check_schema(qs)
    tok = model_tokenizer(TINY_TOKENIZER)
    for q in qs:
        n = len(tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"])
        target = int(q.category.removesuffix("_tokens"))
        assert target - 8 <= n <= target, (q.question_id, n)
    assert [q.category for q in qs] == ["256_tokens"] * 2 + ["700_tokens"] * 2
    assert qs[0].turns[0] != qs[1].turns[0]


def test_long_context_rejects_lengths_beyond_the_context():
    with pytest.raises(ConfigError, match="exceed the model's context"):
        DATASETS.build({"name": "long_context", "target_lengths": [4000], "tokenizer": "random:llama?ctx=2048"})
    with pytest.raises(ConfigError, match="exceed"):
        DATASETS.build({"name": "long_context", "target_lengths": [1000], "max_context": 1024, "reserve": 128,
                        "tokenizer": TINY_TOKENIZER})


@pytest.mark.parametrize("name", ["longbench", "pg19"])
def test_hub_sets_fail_fast_offline(name):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="unreachable.*dataset=long_context"):
        DATASETS.build({"name": name})
    assert time.perf_counter() - t0 < 10


def test_jsonl_round_trip(tmp_path):
    rows = [{"question_id": 7, "category": "qa", "turns": ["a?", "b?"]}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert DATASETS.build({"name": "jsonl", "path": str(tmp_path / "q.jsonl")}) == [Question(7, "qa", ("a?", "b?"))]
