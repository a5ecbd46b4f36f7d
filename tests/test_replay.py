"""Replayed verification (train/replay.py) against the real decode loop: the same trees, step for step."""

from __future__ import annotations

import random

import pytest
import torch

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.graft import graft_root
from graft_lab.pruners.base import NoPruner
from graft_lab.retrievers.base import NoRetriever
from graft_lab.train import replay
from graft_lab.train.replay import LOOKAHEAD, ReplayTarget, greedy_continuation, references
from graft_lab.verify import SamplingParams
from tiny import ARCHS, hf_greedy, tiny_eagle3, tiny_target

SMALL_VOCAB = 12  # random drafts hit often enough that most steps accept several tokens


class Recording:
    """A drafter that keeps every tree it drafts."""

    def __init__(self, inner):
        self.inner, self.trees = inner, []
        self.needs_features = inner.needs_features

    def reset(self, max_len):
        self.inner.reset(max_len)

    def draft(self, inp, budget, pruner):
        tree = self.inner.draft(inp, budget, pruner)
        self.trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree


def run(target, net, prompt, depth, top_k, budget, max_new, eos=()):
    drafter = Recording(Eagle3Drafter(net, net_embed(target), depth, top_k))
    gen = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, budget), prompt, SamplingParams(),
                   StopRule(max_new, eos))
    return gen, drafter.trees


def net_embed(target):
    return (target.target if isinstance(target, ReplayTarget) else target).model.get_input_embeddings()


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("depth,top_k,budget", [(5, 4, 24), (7, 1, 8), (3, 6, 40)])
def test_replay_drafts_and_accepts_what_the_real_loop_does(arch, depth, top_k, budget, tmp_path):
    target = tiny_target(arch, seed=list(ARCHS).index(arch), vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, seed=3)
    rng = random.Random(depth * 10 + top_k)
    prompts = [torch.tensor([rng.randrange(3, SMALL_VOCAB) for _ in range(rng.randint(3, 12))]) for _ in range(8)]
    max_new = 30
    conts = references(target, arch, prompts, max_new, cache=tmp_path)
    replayed = ReplayTarget(target, prompts, conts)
    multi = 0
    for prompt, cont in zip(prompts, conts):
        assert cont == hf_greedy(target.model, prompt, max_new + LOOKAHEAD)  # the reference is transformers' greedy
        real, real_trees = run(target, net, prompt, depth, top_k, budget, max_new, eos=(2,))
        rep, rep_trees = run(replayed, net, prompt, depth, top_k, budget, max_new, eos=(2,))
        assert rep.tokens == real.tokens and rep.stop_reason == real.stop_reason
        assert rep_trees == real_trees  # the drafter saw the same features every step
        assert [s.accept_length for s in rep.steps] == [s.accept_length for s in real.steps]
        multi += sum(s.accept_length > 1 for s in real.steps)
    assert multi >= 5  # the comparison covers multi-token steps, not only root-only ones


def test_references_are_read_back_from_the_cache(tmp_path, monkeypatch):
    target = tiny_target("llama", vocab=SMALL_VOCAB)
    prompts = [torch.tensor([3, 4, 5]), torch.tensor([6, 7])]
    first = references(target, "tiny", prompts, 8, cache=tmp_path)
    assert [len(c) for c in first] == [8 + LOOKAHEAD] * 2 and len(list(tmp_path.glob("*.json"))) == 2
    monkeypatch.setattr(replay, "greedy_continuation", lambda *a: pytest.fail("recomputed a cached reference"))
    assert references(target, "tiny", prompts, 8, cache=tmp_path) == first
    assert references(target, "tiny", prompts, 4, cache=tmp_path) == [c[: 4 + LOOKAHEAD] for c in first]
    monkeypatch.setattr(replay, "greedy_continuation", greedy_continuation)
    other = references(target, "another-target", prompts[:1], 8, cache=tmp_path)  # its own key: computed anew
    assert other == first[:1] and len(list(tmp_path.glob("*.json"))) == 3
    with torch.no_grad():
        target.model.lm_head.weight.mul_(-1.0)  # the same name, other weights (a checkpoint trained on)
    flipped = references(target, "tiny", prompts, 8, cache=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 5 and flipped == [greedy_continuation(target, p, 8 + LOOKAHEAD)
                                                                   for p in prompts]


def test_replay_refuses_what_it_cannot_answer(tmp_path):
    target = tiny_target("llama", vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, seed=3)
    prompt = torch.tensor([3, 4, 5, 6])
    replayed = ReplayTarget(target, [prompt], references(target, "tiny", [prompt], 4, cache=tmp_path))
    with pytest.raises(KeyError, match="no greedy continuation for this prompt"):
        run(replayed, net, torch.tensor([9, 9]), 3, 2, 8, 4)
    with pytest.raises(ValueError, match="past the .*-token reference"):
        run(replayed, net, prompt, LOOKAHEAD + 2, 1, LOOKAHEAD + 3, 4)  # a chain deeper than the lookahead
    wrong = ReplayTarget(target, [prompt], [[5] * (4 + LOOKAHEAD)])  # not the target's greedy continuation
    gen, _ = run(wrong, net, prompt, 3, 2, 8, 4)
    assert gen.tokens[:4] == [5] * 4  # replay emits the reference it is given: references() must be the target's


def test_evaluate_replay_reports_what_the_real_loop_reports(tmp_path, monkeypatch):
    import json

    from graft_lab.models.target import Target, load_model
    from graft_lab.train.evaluate import main as evaluate_main
    from tiny import write_eagle3

    monkeypatch.setenv("GRAFT_LAB_CACHE", str(tmp_path / "cache"))
    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt)
    drafter = write_eagle3(Target(model, tok), tmp_path / "drafter")
    common = ["--drafter", str(drafter), "--target", tgt, "--questions", "3", "--new-tokens", "12"]
    evaluate_main(common + ["--out", str(tmp_path / "real.json")])
    evaluate_main(common + ["--replay", "--out", str(tmp_path / "replay.json")])
    real, rep = (json.loads((tmp_path / f).read_text()) for f in ("real.json", "replay.json"))
    assert (real["verification"], rep["verification"]) == ("target", "replay")
    for tree in ("dense", "chain"):
        assert (rep[tree]["tokens"], rep[tree]["steps"]) == (real[tree]["tokens"], real[tree]["steps"])
    assert len(list((tmp_path / "cache" / "replay").glob("*.json"))) == 3  # one reference per prompt, kept
