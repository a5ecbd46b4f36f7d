"""The divergence audit: in bf16 every turn that differs from same-dtype AR is a numeric tie within the measured
noise bound; a bug injected into the tree forward is caught as unexplained; fp32 stays exact."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
import torch

from graft_lab import audit
from graft_lab.audit import (BOUND_TURNS, TIE, TOP_BOUND_K, UNEXPLAINED, Auditor, Deviation, Turn, ar_logits,
                            first_divergence, method_logits)
from graft_lab.decode import Generation, Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.graft import graft_root
from graft_lab.models.target import Target
from graft_lab.report import audit_line
from graft_lab.runner import ar_method
from graft_lab.tree import DraftTree
from graft_lab.verify import SamplingParams
from harness import TINY, run_py
from oracle import OracleRetriever
from test_lossless import HalfBudget
from tiny import VOCAB, tiny_eagle3, tiny_model

ARCHS = ("llama", "qwen2", "qwen3")
PROMPTS = 6
NEW = 40


def audited_run(arch: str, dtype: torch.dtype) -> dict:
    """Six prompts on a tiny target in `dtype`: a random EAGLE-3 drafter (depth 5, top-4) and an oracle retriever
    that knows AR's continuation share a 16-node budget, so most steps verify multi-token trees."""
    target = Target(tiny_model(arch, seed=ARCHS.index(arch)).to(dtype), None, aux_layers=(1, 2, 3))
    drafter = Eagle3Drafter(tiny_eagle3(target, seed=1).to(dtype), target.model.get_input_embeddings(), depth=5, top_k=4)
    oracle = OracleRetriever([], VOCAB, seed=0, error_rate=0.1)
    method = Method(drafter, HalfBudget(), oracle, graft_root, 16)
    auditor = Auditor(target, method)
    rng = random.Random(ARCHS.index(arch))
    for q in range(PROMPTS):
        prompt = torch.tensor([rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 24))])
        ar = generate(target, ar_method(), prompt, SamplingParams(), StopRule(NEW))
        oracle.reference = ar.tokens
        auditor.add(q, 0, prompt, generate(target, method, prompt, SamplingParams(), StopRule(NEW)), ar)
    return auditor.summarise()


@pytest.fixture(scope="module")
def bf16_runs():
    return {arch: audited_run(arch, torch.bfloat16) for arch in ARCHS}


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 7]) == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_engine_has_no_unexplained_divergence(bf16_runs, arch):
    s = bf16_runs[arch]
    assert s["unexplained_divergences"] == 0
    assert s["noise_bound"] > 0  # bf16 batched forwards do round differently
    assert 0 < s["noise_bound_top"] <= s["noise_bound"]
    assert s["match_share"] == (PROMPTS - len(s["divergences"])) / PROMPTS
    for d in s["divergences"]:
        assert d["bound"] in (s["noise_bound_top"], s["noise_bound"])
        assert d["verdict"] == TIE and 0 <= d["ar_gap"] <= d["ar_margin"] <= 2 * d["bound"]
        assert d["spec_token"] != d["ar_token"] and d["spec_gap"] >= 0


def test_bf16_divergences_happen_so_the_audit_is_exercised(bf16_runs):
    assert sum(len(s["divergences"]) for s in bf16_runs.values()) >= 2


def test_fp32_stays_exact():
    s = audited_run("llama", torch.float32)
    assert s["match_share"] == 1.0 and s["divergences"] == [] and s["unexplained_divergences"] == 0
    assert 0 <= s["noise_bound"] < 1e-3  # measured all the same: fp32 batching moves logits by rounding only


def skip_parent(self, tree, cache, want_aux):
    """Bug: a node at depth >= 2 does not attend to its parent (a wrong ancestor set in the tree mask)."""
    mask = tree.ancestor_mask.clone()
    deep = (tree.depth >= 2).nonzero().squeeze(1)
    mask[deep, tree.parents[deep]] = False
    return self.forward(tree.tokens, tree.position_ids(cache.length), cache, mask, want_aux)


def shifted_positions(self, start):
    """Bug: every node below the root sits one position too far."""
    return self.depth + start + (self.depth > 0).long()


@pytest.mark.parametrize("bug", ["mask", "position"])
def test_an_injected_bug_is_caught_as_unexplained(bug, monkeypatch):
    if bug == "mask":
        monkeypatch.setattr(Target, "verify", skip_parent)
    else:
        monkeypatch.setattr(DraftTree, "position_ids", shifted_positions)
    s = audited_run("llama", torch.bfloat16)
    assert s["unexplained_divergences"] >= 1
    worst = max(d["ar_margin"] for d in s["divergences"] if d["verdict"] == UNEXPLAINED)
    assert worst > 2 * s["noise_bound"]
    assert s["noise_bound"] < 1.0  # the bound is measured without the tree code, so the bug cannot widen it


def test_ar_replay_reproduces_the_baseline_and_the_method_replay_its_tokens():
    """The replays the verdicts rest on: AR's replay picks AR's every token; the method's chain replay, in fp32,
    predicts the method's tokens at every position."""
    target = Target(tiny_model("qwen2", seed=1), None, aux_layers=(1, 2, 3))
    prompt = torch.tensor([5, 9, 14, 3, 7])
    ar = generate(target, ar_method(), prompt, SamplingParams(), StopRule(24))
    assert ar_logits(target, prompt, ar.tokens[:-1]).argmax(-1).tolist() == ar.tokens
    oracle = OracleRetriever(ar.tokens, VOCAB, seed=2, error_rate=0.2)
    method = Method(Eagle3Drafter(tiny_eagle3(target, seed=2), target.model.get_input_embeddings(), depth=3, top_k=3),
                    HalfBudget(), oracle, graft_root, 12)
    gen = generate(target, method, prompt, SamplingParams(), StopRule(24))
    lengths = [s.accept_length for s in gen.steps]
    assert max(lengths) >= 3
    for p in (0, 1, 7, len(gen.tokens) - 1):
        assert int(method_logits(target, method, prompt, gen.tokens, lengths, p).argmax()) == gen.tokens[p]


@pytest.mark.parametrize("runner_up, margin, verdict", [
    (True, 0.15, TIE),  # inside 2 x the top-k bound
    (True, 0.5, UNEXPLAINED),  # inside 2 x the whole-vocabulary bound, but b is a top token: the tight bound rules
    (False, 0.5, TIE),  # b outside AR's top TOP_BOUND_K: only the whole-vocabulary bound covers its logit
    (False, 1.5, UNEXPLAINED),
])
def test_the_tight_bound_applies_when_both_tokens_are_top_tokens(runner_up, margin, verdict, monkeypatch):
    monkeypatch.setattr(audit, "method_logits", lambda *args: torch.zeros(50))
    row = torch.full((50,), -10.0)  # AR's logits: token 0 best; b the runner-up, or behind TOP_BOUND_K closer ones
    b = 1 if runner_up else TOP_BOUND_K + 5
    if not runner_up:
        row[1:TOP_BOUND_K] = -0.01
    row[0], row[b] = 0.0, -margin
    turn = Turn(0, 0, torch.tensor([1]), [7, b], [7, 0], [1, 1], sampled=False)
    d = Auditor(target=None, method=None).explain(turn, 1, row, Deviation(all=0.5, top=0.1))
    assert (d.verdict, d.bound, d.ar_margin) == (verdict, 0.1 if runner_up else 0.5, pytest.approx(margin))


def test_identical_turns_past_the_sample_are_not_kept():
    auditor = Auditor(target=None, method=None)
    same = Generation(tokens=[4, 5, 6])
    for q in range(BOUND_TURNS + 5):
        auditor.add(q, 0, torch.tensor([1]), same, same)
    assert auditor.n_turns == BOUND_TURNS + 5 and len(auditor.kept) == BOUND_TURNS


def test_console_line():
    summary = {"match_share": 5 / 6, "audited_turns": 6, "noise_bound": 0.0625, "unexplained_divergences": 0,
               "divergences": [{"ar_margin": 0.03125, "verdict": TIE}]}
    assert audit_line(summary) == "5/6 turns; 1 numeric tie (gap 0.0312 <= 2 x bound 0.0625); 0 unexplained"
    assert audit_line({**summary, "match_share": 1.0, "divergences": []}).startswith("6/6 turns; 0 numeric ties")
    assert audit_line({"match_share": None, "matches_baseline": None}) == "-"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_run_py_reports_the_audit(dtype, tmp_path):
    """run.py end to end on the tiny random target: summary.json, the results row and the console agree."""
    args = [*TINY, "dataset.limit=2", "dataset.first_turn_only=false", "gen.max_new_tokens=24", "retriever=recycle",
            "tree.total_tokens=16", f"model.dtype={dtype}"]
    code, out, err = run_py(args, tmp_path)
    assert code == 0, err
    s = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert s["audited_turns"] == s["n_turns"] == 4
    assert s["match_share"] == (4 - len(s["divergences"])) / 4
    assert s["unexplained_divergences"] == sum(d["verdict"] == UNEXPLAINED for d in s["divergences"]) == 0
    assert s["matches_baseline"] == (not s["divergences"])
    assert {d["question_id"] for d in s["divergences"]} == set(s["mismatched_questions"])
    for d in s["divergences"]:
        assert set(d) >= {"question_id", "turn", "position", "ar_gap", "spec_gap", "verdict"}
        assert d["ar_margin"] <= 2 * s["noise_bound"]
    if dtype == "float32":
        assert s["match_share"] == 1.0 and s["noise_bound"] < 1e-3
    row = pd.read_parquet(tmp_path / "runs.parquet").iloc[0]
    assert row["match_share"] == s["match_share"] and row["noise_bound"] == s["noise_bound"]
    assert row["unexplained_divergences"] == 0 and json.loads(row["divergences"]) == s["divergences"]
    assert f"{4 - len(s['divergences'])}/4 turns;" in out and "0 unexplained" in out
