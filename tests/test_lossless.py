"""The contract: every method's greedy output equals transformers' own greedy decoding, token for token.

Random tiny Llama / Qwen2 / Qwen3 targets, random EAGLE-3 drafters (full and reduced draft vocabulary),
many prompts, budgets 1..80, depths 1..8, top_k 1..10, and an oracle retriever that makes long accepted
paths and EOS inside an accepted path likely."""

from __future__ import annotations

import random

import pytest
import torch

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab.graft import graft_root
from graft_lab.pruners import NoPruner
from graft_lab.retrievers import NoRetriever
from graft_lab.tree import DraftTree
from graft_lab.verify import SamplingParams
from oracle import OracleRetriever
from tiny import VOCAB, hf_greedy, tiny_eagle3, tiny_target

ARCHS = ("llama", "qwen2", "qwen3")
TARGETS = {}


def target_for(arch):
    if arch not in TARGETS:
        TARGETS[arch] = tiny_target(arch, seed=ARCHS.index(arch))
    return TARGETS[arch]


def checked(graft):
    """Wrap a graft function so every step's tree is checked against the invariants."""
    def run(draft: DraftTree, retrieved: DraftTree, budget: int) -> DraftTree:
        tree = graft(draft, retrieved, budget)
        tree.check()
        assert tree.size <= budget
        return tree
    return run


class HalfBudget:
    """Leaves half of the budget to retrieval, so drafted and retrieved nodes share every tree."""

    def keep_drafting(self, level: int, best_score: float) -> bool:
        return True

    def draft_budget(self, total: int, last_level: int) -> int:
        return max(1, total // 2)


def random_prompt(rng: random.Random) -> torch.Tensor:
    return torch.tensor([rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 24))])


CASES = [(arch, seed) for arch in ARCHS for seed in range(8)]


@pytest.mark.parametrize("arch,seed", CASES)
def test_eagle3_tree_is_lossless(arch, seed):
    rng = random.Random(seed * 31 + ARCHS.index(arch))
    target = target_for(arch)
    draft_vocab = rng.choice([None, 40])
    drafter = Eagle3Drafter(tiny_eagle3(target, draft_vocab, seed=seed), target.model.get_input_embeddings(),
                            depth=rng.randint(1, 8), top_k=rng.randint(1, 10))
    budget = rng.choice([1, 2, 3, rng.randint(4, 80)])
    prompt = random_prompt(rng)
    new = rng.randint(1, 40)
    ref = hf_greedy(target.model, prompt, new)
    method = Method(drafter, NoPruner(), NoRetriever(), checked(graft_root), budget)
    out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=new))
    assert out.tokens == ref


@pytest.mark.parametrize("arch,seed", CASES)
def test_long_accepted_paths_and_eos_inside_a_path(arch, seed):
    rng = random.Random(1000 + seed)
    target = target_for(arch)
    prompt = random_prompt(rng)
    free = hf_greedy(target.model, prompt, 48)  # no EOS: the full continuation
    fresh = [t for i, t in enumerate(free) if i >= 5 and t not in free[:i]]
    if not fresh:
        pytest.skip("the continuation repeats its first tokens only")
    eos = rng.choice(fresh)  # a token first seen mid-continuation becomes EOS
    ref = hf_greedy(target.model, prompt, 48, eos=eos)
    assert ref[-1] == eos
    budget = rng.randint(4, 80)
    drafter = Eagle3Drafter(tiny_eagle3(target, seed=seed), target.model.get_input_embeddings(), depth=rng.randint(1, 8),
                            top_k=rng.randint(1, 10)) if seed % 2 else NoDrafter()
    oracle = OracleRetriever(free, VOCAB, seed=seed, error_rate=rng.choice([0.0, 0.1, 0.3]))
    method = Method(drafter, HalfBudget(), oracle, checked(graft_root), budget)
    out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=48, eos_ids=(eos,)))
    assert out.tokens == ref
    assert out.stop_reason == "eos" and out.tokens.count(eos) == 1
    assert max(s.accept_length for s in out.steps) >= 3  # the oracle really produced multi-token acceptances


@pytest.mark.parametrize("arch", ARCHS)
def test_autoregressive_baseline_is_lossless(arch):
    target = target_for(arch)
    rng = random.Random(7)
    for _ in range(4):
        prompt = random_prompt(rng)
        ref = hf_greedy(target.model, prompt, 30)
        out = generate(target, Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, 1), prompt,
                       SamplingParams(), StopRule(max_new_tokens=30))
        assert out.tokens == ref
        assert all(s.accept_length == 1 for s in out.steps)


def test_the_lossless_check_can_fail():
    """A deliberately wrong acceptance (accept every drafted child) must break equality."""
    target = target_for("llama")
    prompt = torch.tensor([5, 6, 7, 8])
    ref = hf_greedy(target.model, prompt, 20)
    drafter = Eagle3Drafter(tiny_eagle3(target, seed=3), target.model.get_input_embeddings(), depth=4, top_k=1)
    method = Method(drafter, NoPruner(), NoRetriever(), graft_root, 5)
    import graft_lab.decode as decode_mod
    from graft_lab.verify import Acceptance

    def accept_everything(tree, logits, params, generator=None):
        return Acceptance(path=torch.arange(tree.size), bonus=int(logits[-1].argmax()))

    original = decode_mod.accept
    decode_mod.accept = accept_everything
    try:
        out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=20))
    finally:
        decode_mod.accept = original
    assert out.tokens != ref
