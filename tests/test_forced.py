"""Teacher-forced chain acceptance (train/forced.py) against the real decode loop: what training's forward
predicts is what the chain drafts, step for step, on tiny Llama, Qwen2 and Qwen3 targets."""

from __future__ import annotations

import json
import random

import pytest
import torch

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.graft import graft_root
from graft_lab.pruners.base import NoPruner
from graft_lab.retrievers.base import NoRetriever
from graft_lab.train.forced import RECALL_AT, forced_chain
from graft_lab.train.replay import LOOKAHEAD, references
from graft_lab.tree import CHAIN
from graft_lab.verify import SamplingParams
from tiny import ARCHS, tiny_eagle3, tiny_target

SMALL_VOCAB = 12  # random drafts hit often enough that many steps accept several tokens
EOS = 2


def real_chain(target, net, prompt, max_new, depth=CHAIN.depth, top_k=CHAIN.top_k, budget=CHAIN.total_tokens):
    drafter = Eagle3Drafter(net, target.model.get_input_embeddings(), depth, top_k)
    return generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, budget), prompt,
                    SamplingParams(), StopRule(max_new, (EOS,)))


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("draft_vocab", [None, 8])
def test_forced_chain_accepts_what_the_real_chain_does(arch, draft_vocab, tmp_path):
    target = tiny_target(arch, seed=list(ARCHS).index(arch), vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, draft_vocab=draft_vocab, seed=3)
    rng = random.Random(len(arch) + (draft_vocab or 0))
    prompts = [torch.tensor([rng.randrange(3, SMALL_VOCAB) for _ in range(rng.randint(3, 12))]) for _ in range(10)]
    max_new = 30
    multi = stops = 0
    for prompt, cont in zip(prompts, references(target, arch, prompts, max_new, cache=tmp_path)):
        real = real_chain(target, net, prompt, max_new)
        forced = forced_chain(target, net, prompt, cont, CHAIN.depth, StopRule(max_new, (EOS,)))
        assert forced.accept_lengths == [s.accept_length for s in real.steps]
        assert (forced.tokens, forced.stop_reason) == (real.tokens, real.stop_reason)
        assert forced.anchors == len(real.tokens)
        assert (forced.hits[:, 0] <= forced.hits[:, 1]).all() and (forced.hits <= forced.anchors).all()
        assert forced.hits[0, 0] >= sum(s.accept_length > 1 for s in real.steps)  # each such step's first draft hit
        multi += sum(s.accept_length > 1 for s in real.steps)
        stops += real.stop_reason == "eos"
    assert multi >= 5 and stops >= 1  # multi-token steps and an EOS inside the run are covered


@pytest.mark.parametrize("draft_vocab", [None, 8])
def test_forced_wide_tree_accepts_what_the_real_loop_does_with_every_top_10_child(draft_vocab, tmp_path):
    """At depth 2 the dense drafter keeps every child: its tree (1 + 10 + 100 nodes) is the wide tree."""
    target = tiny_target("qwen2", seed=1, vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, draft_vocab=draft_vocab, seed=3)
    rng = random.Random(7)
    prompts = [torch.tensor([rng.randrange(3, SMALL_VOCAB) for _ in range(rng.randint(3, 12))]) for _ in range(6)]
    k = min(max(RECALL_AT), draft_vocab or SMALL_VOCAB)
    deep = 0
    for prompt, cont in zip(prompts, references(target, "qwen2", prompts, 30, cache=tmp_path)):
        real = real_chain(target, net, prompt, 30, depth=2, top_k=k, budget=1 + k + k * k)
        forced = forced_chain(target, net, prompt, cont, 2, StopRule(30, (EOS,)))
        assert forced.wide == [s.accept_length for s in real.steps]
        deep += sum(s.accept_length == 3 for s in real.steps)
    assert deep >= 3  # steps that accept both levels are covered


def test_forced_recall_at_step_0_is_the_inference_drafters_top_k():
    """Step 0's top-1 and top-10 hits, against the inference drafter's level 0 (its top-10 children) drafted
    from each anchor's prefix anew."""
    from graft_lab.drafters.base import DraftInput
    from graft_lab.train.replay import greedy_continuation

    target = tiny_target("qwen3", seed=2, vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, seed=3)
    prompt, max_new = torch.tensor([3, 4, 5, 6, 7]), 16
    cont = greedy_continuation(target, prompt, max_new + LOOKAHEAD)
    run = forced_chain(target, net, prompt, cont, 3, StopRule(max_new))  # no EOS: every anchor counts
    seq = torch.cat([prompt, torch.tensor(cont)])
    aux = target.prefill(seq, target.new_cache(seq.numel()), want_aux=True).aux  # [L, 3H]
    drafter = Eagle3Drafter(net, target.model.get_input_embeddings(), 1, max(RECALL_AT))
    hits = [0] * len(RECALL_AT)
    for a in range(prompt.numel() - 1, prompt.numel() - 1 + max_new):
        drafter.reset(seq.numel())
        tree = drafter.draft(DraftInput(aux[: a + 1], seq[1 : a + 2], start=0), 1 + max(RECALL_AT), NoPruner())
        for c, r in enumerate(RECALL_AT):
            hits[c] += int(seq[a + 2]) in tree.tokens[1 : 1 + r].tolist()
    assert run.anchors == max_new and run.hits.shape == (3, len(RECALL_AT))
    assert run.hits[0].tolist() == hits
    assert 0 < hits[0] < hits[1]  # the ranks differ here, so the test tells them apart


def test_forced_chain_refuses_what_it_cannot_play():
    target = tiny_target("llama", vocab=SMALL_VOCAB)
    net = tiny_eagle3(target, seed=3)
    prompt = torch.tensor([3, 4, 5])
    with pytest.raises(ValueError, match="a chain of depth 7 over 8 new tokens reads 16"):
        forced_chain(target, net, prompt, [3] * 15, 7, StopRule(8))
    with pytest.raises(ValueError, match="stop string"):
        forced_chain(target, net, prompt, [3] * 16, 7, StopRule(8, stop_strings=object()))  # any stop-string rule


def test_evaluate_forced_pairs_with_the_real_chain_and_refuses_other_trees(tmp_path, monkeypatch, capsys):
    from graft_lab.models.target import Target, load_model
    from graft_lab.train.compare import compare
    from graft_lab.train.evaluate import main as evaluate_main
    from tiny import write_eagle3

    monkeypatch.setenv("GRAFT_LAB_CACHE", str(tmp_path / "cache"))
    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt)
    drafter = write_eagle3(Target(model, tok), tmp_path / "drafter")
    common = ["--drafter", str(drafter), "--target", tgt, "--questions", "3", "--new-tokens", "12", "--trees", "chain"]
    evaluate_main(common + ["--out", str(tmp_path / "real.json")])
    evaluate_main(common + ["--forced", "--out", str(tmp_path / "forced.json")])
    real, forced = (json.loads((tmp_path / f).read_text()) for f in ("real.json", "forced.json"))
    assert forced["verification"] == "forced" and forced["chain"]["per_prompt"] == real["chain"]["per_prompt"]
    assert compare(real, forced)["chain"]["all"].mean == 0.0
    wide = forced["wide"]
    assert len(wide["per_prompt"]) == 3 and wide["tau"] == sum(t for t, _ in wide["per_prompt"]) / wide["steps"]
    assert set(compare(forced, forced)) == {"chain", "wide"} and "wide" not in real
    assert set(forced["chain"]["recall"]) == {f"top{r}" for r in RECALL_AT}
    assert all(len(v) == CHAIN.depth and all(0 <= x <= 1 for x in v) for v in forced["chain"]["recall"].values())
    for bad in (["--trees", "dense,chain"], ["--trees", "chain", "--replay"]):
        with pytest.raises(SystemExit):
            evaluate_main(common[:-2] + bad + ["--forced"])
        assert "--forced measures the chain alone" in capsys.readouterr().err
