"""benchmarks/methods.py's bookkeeping: the prompt order of a stoppable run, and tables from per-prompt records."""

from dataclasses import asdict

import pytest

from benchmarks.methods import METHODS, build, interleave, main, needs_drafter, records_table
from graft_lab.data import Question
from graft_lab.metrics import TurnStats


def stats(tokens: int, steps: int, wall: float) -> dict:
    lengths = [tokens // steps] * steps
    lengths[-1] += tokens - sum(lengths)
    return asdict(TurnStats(tokens, wall, lengths, {"verify": wall}, drafted=0, retrieved=0, accepted_retrieved=0))


def record(prompt: int, group: str, method: str, k: int, st: dict, identical: bool = True) -> dict:
    return {"prompt": prompt, "group": group, "category": group, "method": method, "K": k, "identical": identical, "stats": st}


def test_interleave_is_round_robin_over_categories_in_file_order():
    q = lambda i, c: Question(i, c, ("?",))
    questions = [("mt_bench", q(1, "writing")), ("mt_bench", q(2, "writing")), ("mt_bench", q(3, "math")),
                 ("qa", q(4, "qa")), ("qa", q(5, "qa")), ("qa", q(6, "qa"))]
    order = [q.question_id for _, q in interleave(questions)]
    assert order == [1, 3, 4, 2, 5, 6]


def test_tables_count_only_prompts_every_method_finished_and_flag_mismatches():
    records = [
        record(0, "mt_bench", "AR", 1, stats(100, 100, 4.0)),
        record(0, "mt_bench", "graft root", 16, stats(100, 50, 2.0)),
        record(1, "qa", "AR", 1, stats(100, 100, 4.0)),
        record(1, "qa", "graft root", 16, stats(100, 25, 1.0), identical=False),
        record(2, "qa", "AR", 1, stats(100, 100, 4.0)),  # the run stopped before graft finished prompt 2
    ]
    rows, text = records_table(records)
    assert text.startswith("2 prompts finished by every method")
    graft = next(r for r in rows if r["method"] == "graft root")
    assert graft["tau"] == 200 / 75 and graft["speedup"] == 200 / 3.0 / (200 / 8.0)
    assert graft["lossless"] is False
    # per group: mt_bench speedup 2, qa 4, unweighted mean 3
    speedup = text.split("speedup by group")[1].split("\n\n")[0]
    assert "| graft root | 16 | 2.00 | 4.00 | 3.00 |" in speedup


def test_rows_are_the_run_py_method_presets():
    """A benchmark row is built by the same preset path as `python run.py method=NAME` at that K."""
    from graft_lab.tree import tree_shape
    from tiny import tiny_target

    target = tiny_target("llama")
    assert {m for m in METHODS if not needs_drafter(m)} == {"pld", "recycle"}
    m = build("pld", target, None, 16, ())
    assert m.budget == 16 and type(m.retriever).__name__ == "NgramRetriever" and not m.drafter.needs_features
    m = build("recycle", target, None, 32, ("retriever.top_k=10",))
    assert m.budget == tree_shape(32).total_tokens and m.retriever.k == 10


def test_report_of_a_missing_or_empty_file_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no records"):
        main(["--report", str(tmp_path / "missing.jsonl")])
