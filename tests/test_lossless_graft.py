"""The contract for Graft: every pruner x retriever x graft combination decodes exactly what the target
alone decodes (greedy), and every grafted tree keeps the invariants (budget, parent order, no duplicate
siblings, draft root) at every step.

Random tiny Llama / Qwen2 / Qwen3 targets, random EAGLE-3 drafters, budgets 1..80, prompts with
repeats so the retrievers find matches and retrieved nodes really get accepted."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab.graft import GRAFTS, graft_root
from graft_lab.pruners import PRUNERS
from graft_lab.retrievers import RETRIEVERS
from graft_lab.tree import DraftTree, Source
from graft_lab.verify import SamplingParams
from tiny import hf_greedy, repetitive_prompt, shared_tiny_target, tiny_eagle3

ARCHS = ("llama", "qwen2", "qwen3")
COMBOS = list(itertools.product(("none", "dyn_depth"), ("none", "recycle", "ngram", "sam"), ("root", "tail", "match")))
COMBOS += list(itertools.product(("none", "dyn_depth"), ("pool",), ("root", "tail", "match")))  # ngram + recycle + sam
BUDGETS = (1, 2, 3, 5, 8, 13, 24, 40, 60, 80)
REFS: dict[tuple, list[int]] = {}




target_for = shared_tiny_target
pytestmark = pytest.mark.usefixtures("one_thread")


def reference(arch: str, prompt: torch.Tensor, new: int) -> list[int]:
    key = (arch, tuple(prompt.tolist()), new)
    if key not in REFS:
        REFS[key] = hf_greedy(target_for(arch).model, prompt, new)
    return REFS[key]




def pruner_node(name: str, rng: random.Random) -> dict:
    if name == "none":
        return {"name": "none"}
    split = sorted(rng.uniform(0.05, 1.0) for _ in range(4))
    return {"name": "dyn_depth", "checkpoints": [0, 1, rng.randint(2, 5)],
            "thresholds": [rng.uniform(0.0, 0.6) for _ in range(3)], "draft_split": split}


class Checked:
    """Wraps a graft: checks every step's tree, and that root grafting fills every slot it can."""

    def __init__(self, graft, name: str):
        self.graft, self.name = graft, name
        self.steps = 0

    def __call__(self, draft: DraftTree, retrieved: DraftTree, budget: int) -> DraftTree:
        tree = self.graft(draft, retrieved, budget)
        tree.check()
        assert tree.size <= budget
        assert int(tree.tokens[0]) == int(draft.tokens[0]) == int(retrieved.tokens[0])
        if self.name == "root":
            assert torch.equal(tree.tokens[: draft.size], draft.tokens)  # the retained draft stays whole
            assert tree.size == min(budget, graft_root(draft, retrieved, 10**6).size)  # folded slots are refilled
        self.steps += 1
        return tree


def run_case(arch: str, pruner: str, retriever: str, graft: str, budget: int, seed: int) -> tuple[list[int], list[int], object]:
    rng = random.Random(seed)
    target = target_for(arch)
    prompt = repetitive_prompt(rng)
    new = rng.randint(8, 32)
    if rng.random() < 0.2:
        drafter = NoDrafter()
    else:
        net = tiny_eagle3(target, rng.choice([None, 40]), seed=seed)
        drafter = Eagle3Drafter(net, target.model.get_input_embeddings(), depth=rng.randint(1, 8), top_k=rng.randint(1, 10))
    r = RETRIEVERS.build({"name": retriever}, vocab_size=target.vocab_size, device=target.device)
    checked = Checked(GRAFTS.build({"name": graft}, retriever=r), graft)
    method = Method(drafter, PRUNERS.build(pruner_node(pruner, rng)), r, checked, budget)
    out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=new))
    assert checked.steps == len(out.steps)
    return out.tokens, reference(arch, prompt, new), out


@pytest.mark.parametrize("pruner,retriever,graft", COMBOS)
def test_every_combination_is_lossless(pruner, retriever, graft):
    i = COMBOS.index((pruner, retriever, graft))
    for j, arch in enumerate(ARCHS):
        budget = BUDGETS[(3 * i + 7 * j) % len(BUDGETS)]
        got, ref, _ = run_case(arch, pruner, retriever, graft, budget, seed=100 * i + j)
        assert got == ref, (arch, budget)


@pytest.mark.parametrize("graft", ["root", "tail", "match"])
def test_retrieved_nodes_are_accepted(graft):
    """Not only lossless by doing nothing: retrieved tokens share trees with drafted ones and get accepted."""
    accepted, mixed = 0, 0
    for seed in range(3):
        got, ref, out = run_case("llama", "dyn_depth", "recycle", graft, 60, seed=7 + seed)
        assert got == ref
        accepted += sum(s.accepted_retrieved for s in out.steps)
        mixed += sum(s.drafted > 0 and s.retrieved > 0 for s in out.steps)
    assert accepted > 0 and mixed > 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_sweep_every_combination_and_budget(arch):
    for n, (combo, budget) in enumerate(itertools.product(COMBOS, (1, 4, 17, 60, 80))):
        got, ref, _ = run_case(arch, *combo, budget, seed=10_000 + 97 * n + ARCHS.index(arch))
        assert got == ref, (combo, budget)


def test_invariant_checks_catch_a_broken_graft():
    """The wrapper is not vacuous: a graft that overfills the budget is caught."""
    def overfill(draft, retrieved, budget):
        return graft_root(draft, retrieved, 10**6)

    tree = DraftTree.root(3)
    retrieved = DraftTree(torch.tensor([3, 4, 5]), torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]),
                          torch.zeros(3), torch.tensor([0, 2, 2], dtype=torch.int8))
    assert int((retrieved.source == Source.RETRIEVED).sum()) == 2
    with pytest.raises(AssertionError):
        Checked(overfill, "root")(tree, retrieved, 2)
