"""dyn_depth: checkpoint stops and stage budgets, calibration quantiles, the calibration CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.base import DraftInput
from graft_lab.errors import ConfigError
from graft_lab.pruners import PRUNERS
from graft_lab.pruners.calibrate import main, significant, stop_shares, thresholds_for, write_config
from graft_lab.pruners.dyn_depth import DynDepthOptions, DynDepthPruner
from tiny import tiny_eagle3, tiny_model, tiny_target, write_eagle3

CONF = Path(__file__).resolve().parent.parent / "conf" / "pruner"


def run_draft(pruner, confidences: dict[int, float], depth: int, budget: int = 60) -> tuple[list[int], int]:
    """Drive the pruner like the drafter does; returns the levels checked and the draft budget."""
    seen, level = [], 0
    while level + 1 < depth:
        seen.append(level)
        if not pruner.keep_drafting(level, math.log(confidences.get(level, 1.0))):
            break
        level += 1
    return seen, pruner.draft_budget(budget, level)


def test_paper_split_per_stage():
    p = PRUNERS.build(OmegaConf.load(CONF / "dyn_depth.yaml"))
    assert run_draft(p, {0: 0.1}, depth=7) == ([0], 8)
    assert run_draft(p, {0: 0.9, 1: 0.1}, depth=7) == ([0, 1], 24)
    assert run_draft(p, {0: 0.9, 1: 0.9, 5: 0.01}, depth=7) == ([0, 1, 2, 3, 4, 5], 40)
    assert run_draft(p, {0: 0.9, 1: 0.9, 5: 0.9}, depth=7) == ([0, 1, 2, 3, 4, 5], 60)  # passed all
    assert run_draft(p, {2: 1e-9}, depth=7)[1] == 60  # only checkpoints stop
    assert run_draft(p, {0: 0.1}, depth=1) == ([], 60)  # no level checked: the state of earlier drafts is gone


def test_counts_are_capped_at_the_budget_and_thresholds_compare_strictly():
    p = DynDepthPruner(DynDepthOptions(checkpoints=[0], thresholds=[0.5], draft_split=[8, 40], split_unit="count"))
    assert run_draft(p, {0: 0.49}, depth=3, budget=16) == ([0], 8)
    assert run_draft(p, {0: 0.5}, depth=3, budget=16) == ([0, 1], 16)
    assert run_draft(p, {0: 0.49}, depth=3, budget=4)[1] == 4


@pytest.mark.parametrize("bad", [
    dict(checkpoints=[1, 1], thresholds=[0.1, 0.1], draft_split=[0.1, 0.2, 1.0]),
    dict(checkpoints=[0], thresholds=[1.5], draft_split=[0.1, 1.0]),
    dict(checkpoints=[0], thresholds=[0.5], draft_split=[0.1]),
    dict(checkpoints=[0], thresholds=[0.5], draft_split=[0.0, 1.0]),
    dict(checkpoints=[0], thresholds=[0.5], draft_split=[2.5, 60], split_unit="count"),
    dict(checkpoints=[0], thresholds=[0.5], draft_split=[0.5, 1.0], split_unit="nodes"),
])
def test_options_are_validated(bad):
    with pytest.raises(ConfigError):
        PRUNERS.options({"name": "dyn_depth", **bad})


def test_recording_keeps_confidences_with_nan_where_not_reached():
    p = DynDepthPruner(DynDepthOptions(thresholds=[0.0, 0.5, 0.0]), record=True)
    run_draft(p, {0: 0.8, 1: 0.3}, depth=7)
    run_draft(p, {0: 0.9, 1: 0.7, 5: 0.2}, depth=7)
    got = np.array(p.confidences)
    assert np.allclose(got[0, :2], [0.8, 0.3]) and np.isnan(got[0, 2])
    assert np.allclose(got[1], [0.9, 0.7, 0.2])


def test_the_eagle3_drafter_stops_at_a_failed_checkpoint():
    target = tiny_target("llama")
    drafter = Eagle3Drafter(tiny_eagle3(target), target.model.get_input_embeddings(), depth=7, top_k=10)
    drafter.reset(64)
    prompt = torch.tensor([5, 6, 7, 8, 9])
    aux = target.prefill(prompt, target.new_cache(64), want_aux=True).aux
    inp = DraftInput(aux, torch.cat([prompt[1:], torch.tensor([3])]), start=0)
    stop0 = DynDepthPruner(DynDepthOptions(thresholds=[1.0, 0.0, 0.0]))
    tree = drafter.draft(inp, 60, stop0)
    assert tree.max_depth == 1 and tree.size == 8
    never = DynDepthPruner(DynDepthOptions(thresholds=[0.0, 0.0, 0.0]), record=True)
    dense = drafter.draft(inp, 60, never)
    assert dense.max_depth >= 2 and dense.size == 60
    assert not np.isnan(never.confidences[0]).any()  # every checkpoint was reached
    assert never.confidences[0] == sorted(never.confidences[0], reverse=True)  # cumulative: non-increasing


# ---- calibration -----------------------------------------------------------------------------------
def synthetic_confidences(rng: np.random.Generator, steps: int) -> np.ndarray:
    """Cumulative path probabilities: non-increasing over checkpoints."""
    return np.cumprod(rng.uniform(0.2, 1.0, size=(steps, 3)), axis=1)


@pytest.mark.parametrize("rates", [[0.3, 0.3, 0.2], [0.0, 0.5, 0.0], [0.1, 0.0, 0.9], [1.0, 0.0, 0.0]])
def test_thresholds_hit_the_target_stop_rates(rates):
    conf = synthetic_confidences(np.random.default_rng(0), 1000)
    thr = thresholds_for(conf, rates)
    assert all(0.0 <= t <= 1.0 for t in thr)
    assert np.allclose(stop_shares(conf, thr), rates, atol=2e-3)
    # the pruner itself stops the same drafts
    p = DynDepthPruner(DynDepthOptions(thresholds=thr))
    stages = [run_draft(p, {0: a, 1: b, 5: c}, depth=7)[1] for a, b, c in conf]
    shares = [np.mean(np.array(stages) == n) for n in (8, 24, 40)]
    assert np.allclose(shares, rates, atol=2e-3)


def test_thresholds_skip_drafts_that_never_reach_a_checkpoint():
    conf = synthetic_confidences(np.random.default_rng(1), 400)
    conf[:100, 2] = np.nan  # shallow drafts: checkpoint 2 never reached
    thr = thresholds_for(conf, [0.25, 0.25, 0.25])
    assert np.allclose(stop_shares(conf, thr), [0.25, 0.25, 0.25], atol=3e-3)
    with pytest.raises(ConfigError):
        thresholds_for(conf, [0.5, 0.5, 0.5])


def test_written_thresholds_keep_tiny_deep_checkpoint_confidences():
    conf = synthetic_confidences(np.random.default_rng(2), 1000)
    conf[:, 2] *= 1e-7  # a depth-5 path probability: a product of six draft probabilities
    rates = [0.3, 0.3, 0.2]
    written = [significant(t) for t in thresholds_for(conf, rates)]
    assert np.allclose(stop_shares(conf, written), rates, atol=3e-3)


def test_written_config_loads_back(tmp_path):
    opts = DynDepthOptions(thresholds=[0.61, 0.42, 0.05])
    write_config(tmp_path / "cal.yaml", opts, "calibrated\non test data")
    text = (tmp_path / "cal.yaml").read_text()
    assert text.startswith("# calibrated\n# on test data\n")
    assert PRUNERS.options(OmegaConf.load(tmp_path / "cal.yaml")) == opts


def tiny_model_dir(out: Path) -> Path:
    """A tiny llama with a word-level tokenizer and a chat template: what the CLI loads from a path."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    model = tiny_model("llama")
    model.save_pretrained(out)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, model.config.vocab_size)}}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(out)
    return out


def test_calibration_cli_on_a_tiny_target(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    drafter = write_eagle3(tiny_target("llama"), tmp_path / "drafter")
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(
        json.dumps({"question_id": i, "category": "t", "turns": [" ".join(f"w{(i * 7 + j) % 90 + 3}" for j in range(12))]}) + "\n"
        for i in range(3)
    ))
    rc = main([
        "--target", str(model_dir), "--drafter", str(drafter), "--questions", str(questions), "--limit", "3",
        "--max-new-tokens", "12", "--budget", "20",
        "--stop-rates", "0.2", "0.3", "0.1", "--name", "cal_tiny", "--out-dir", str(tmp_path / "conf"), "--device", "cpu",
    ])
    assert rc == 0
    node = OmegaConf.load(tmp_path / "conf" / "cal_tiny.yaml")
    opts = PRUNERS.options(node)
    assert opts.checkpoints == [0, 1, 5] and all(0.0 <= t <= 1.0 for t in opts.thresholds)
    assert "0.2, 0.3, 0.1" in (tmp_path / "conf" / "cal_tiny.yaml").read_text()
    assert main(["--target", str(model_dir), "--drafter", str(drafter), "--stop-rates", "0.5", "--name", "x",
                 "--questions", str(questions), "--out-dir", str(tmp_path)]) == 2  # one rate per checkpoint
