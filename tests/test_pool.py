"""retriever=pool: several retrievers at once, merged into one trie whose nodes remember their source; the
pool forwards everything to its sources; its config fails naming the field; and decoding with it is
lossless (tiny random targets against transformers' greedy decoding, fixed trees and tree=auto)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from graft_lab.acceptance import AcceptanceModel
from graft_lab.config import validate
from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab.errors import ConfigError
from graft_lab.graft import GRAFTS
from graft_lab.models.target import Successors, top_k_logp
from graft_lab.planner import CostPlanner, FixedPlanner
from graft_lab.preflight import check_warm_path
from graft_lab.pruners import PRUNERS
from graft_lab.retrievers import RETRIEVERS
from graft_lab.retrievers.base import Fragment
from graft_lab.retrievers.pool import PoolRetriever
from graft_lab.tree import DraftTree, Source, retrieved_by
from graft_lab.verify import SamplingParams
from harness import compose_cfg, run_py
from tiny import hf_greedy, repetitive_prompt, shared_tiny_target, tiny_eagle3

V = 50


def build(sources: list, vocab: int = V) -> PoolRetriever:
    return RETRIEVERS.build({"name": "pool", "sources": sources}, vocab_size=vocab, device="cpu")


def paths(tree: DraftTree) -> dict[tuple[int, ...], int]:
    """Root-to-node token path -> the node's source, for every node."""
    out = {}
    for i in range(tree.size):
        path, j = [], i
        while j >= 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        out[tuple(reversed(path))] = int(tree.source[i])
    return out


class Fixed:
    """A source that proposes fixed chains under the root and records what reaches it."""

    prefill_top_k = 0

    def __init__(self, chains: list[tuple[list[int], float]], prefill_top_k: int = 0):
        self.chains, self.prefill_top_k = chains, prefill_top_k
        self.calls: list[tuple] = []
        self.root = 0

    def reset(self, prompt, successors):
        self.calls.append(("reset", prompt.tolist(), successors))
        self.root = int(prompt[-1])

    def extend(self, tokens):
        self.calls.append(("extend", tokens.tolist()))
        self.root = int(tokens[-1])

    def retrieve(self, budget):
        tree = DraftTree.root(self.root)
        for toks, score in self.chains:
            n = len(toks)
            tree = tree.add_subtree(torch.zeros(n, dtype=torch.long), torch.tensor(toks), torch.arange(-1, n - 1),
                                    torch.full((n,), score) - torch.arange(n) * 0.01, Source.RETRIEVED)
        return tree.cut(budget)

    def continuations(self, tree, nodes, max_len):
        frag = Fragment.below_root(self.retrieve(10**6))
        return Fragment(nodes[0].repeat(frag.size), frag.tokens, frag.parents, frag.depth, frag.score, frag.source)

    def observe(self, tree, logits):
        self.calls.append(("observe", tree.size, tuple(logits.shape)))


# ---- the merged trie --------------------------------------------------------------------------------
def test_shared_prefixes_fold_and_the_first_source_keeps_them():
    a = Fixed([([5, 6, 7], -0.5), ([5, 8], -0.4)])
    b = Fixed([([5, 6, 9], -0.1), ([4], -2.0)])
    pool = PoolRetriever([a, b], "cpu")
    pool.reset(torch.tensor([1, 2, 1]), None)
    tree = pool.retrieve(100)
    tree.check()  # no duplicate siblings
    assert paths(tree) == {(1,): 0, (1, 5): retrieved_by(0), (1, 5, 6): retrieved_by(0), (1, 5, 6, 7): retrieved_by(0),
                           (1, 5, 8): retrieved_by(0), (1, 5, 6, 9): retrieved_by(1), (1, 4): retrieved_by(1)}
    assert float(tree.score[tree.tokens == 5]) == pytest.approx(-0.1)  # the best score any source gave it
    swapped = PoolRetriever([b, a], "cpu")
    swapped.reset(torch.tensor([1, 2, 1]), None)
    assert paths(swapped.retrieve(100))[(1, 5, 6)] == retrieved_by(0)  # now b is source 0 and keeps the prefix
    assert paths(swapped.retrieve(100))[(1, 5, 8)] == retrieved_by(1)
    small = pool.retrieve(4)
    small.check()
    assert small.size == 4 and pool.retrieve(1).size == 1


@pytest.mark.parametrize("seed", range(6))
def test_the_pool_holds_exactly_the_union_of_its_sources(seed):
    """Against the sources run alone: every token path of any source is in the pool's trie once, tagged with
    the first source that proposed it, and nothing else is."""
    rng = random.Random(seed)
    names = rng.sample(["ngram", "sam", "recycle"], rng.randint(2, 3))
    pool = build(names)
    alone = [RETRIEVERS.build({"name": n}, vocab_size=V, device="cpu") for n in names]
    prompt = torch.tensor([rng.randrange(3, 9) for _ in range(30)])
    for r in [pool, *alone]:
        r.reset(prompt, None)
    for _ in range(4):
        logits = torch.randn(3, V)
        drafted = DraftTree(torch.tensor([int(prompt[-1]), 3, 4]), torch.tensor([-1, 0, 1]), torch.arange(3),
                            torch.zeros(3), torch.tensor([0, 1, 1], dtype=torch.int8))
        new = torch.tensor([rng.randrange(3, 9) for _ in range(rng.randint(1, 3))])
        for r in [pool, *alone]:
            r.observe(drafted, logits)
            r.extend(new)
        merged = paths(pool.retrieve(10**4))
        expected: dict[tuple[int, ...], int] = {}
        for i, r in enumerate(alone):
            for path, source in paths(r.retrieve(10**4)).items():
                expected.setdefault(path, source if len(path) == 1 else retrieved_by(i))
        assert merged == expected
        frag = pool.continuations(drafted, torch.arange(3), 4)
        parts = [r.continuations(drafted, torch.arange(3), 4) for r in alone]
        assert frag.size == sum(p.size for p in parts)
        assert frag.source.tolist() == [retrieved_by(i) for i, p in enumerate(parts) for _ in range(p.size)]


def test_a_pool_of_one_is_that_retriever():
    rng = random.Random(1)
    prompt = torch.tensor([rng.randrange(3, 9) for _ in range(40)])
    pool, ngram = build([{"name": "ngram", "n_max": 3}]), RETRIEVERS.build({"name": "ngram", "n_max": 3}, vocab_size=V, device="cpu")
    for r in (pool, ngram):
        r.reset(prompt, None)
        r.extend(torch.tensor([4, 5]))
    for budget in (1, 3, 20):
        got, want = pool.retrieve(budget), ngram.retrieve(budget)
        assert paths(got) == paths(want)  # the same nodes, tagged Source.RETRIEVED (retriever 0)
        assert sorted(got.score.tolist()) == pytest.approx(sorted(want.score.tolist()))


def test_reset_extend_observe_reach_every_source_and_each_gets_its_prefill_top_k():
    a, b, c = Fixed([], prefill_top_k=0), Fixed([], prefill_top_k=2), Fixed([], prefill_top_k=5)
    pool = PoolRetriever([a, b, c], "cpu")
    assert pool.prefill_top_k == 5  # prefill computes the widest any source asks for
    prompt = torch.tensor([3, 4, 5, 4])
    succ = Successors(torch.tensor([3, 4, 5]), torch.arange(15).view(3, 5), -torch.arange(15.0).view(3, 5))
    pool.reset(prompt, succ)
    assert a.calls[0] == ("reset", [3, 4, 5, 4], None)
    assert b.calls[0][2].ids.tolist() == succ.ids[:, :2].tolist() and b.calls[0][2].logp.shape == (3, 2)
    assert c.calls[0][2].ids.tolist() == succ.ids.tolist()
    pool.extend(torch.tensor([7, 8]))
    pool.observe(DraftTree.root(8), torch.zeros(1, V))
    for s in (a, b, c):
        assert s.calls[1:] == [("extend", [7, 8]), ("observe", 1, (1, V))]
    assert pool.retrieve(10).tokens.tolist() == [8]


def test_recycle_in_a_pool_warms_from_prefill_and_learns_as_alone():
    """The real recycle behind the pool: the prefill warm-up (top-k sliced per source) and observe write the
    same M as recycle alone does."""
    prompt = torch.tensor([3, 4, 5, 4, 6])
    logits = torch.randn(prompt.numel(), V)
    tokens, last = Successors.last_positions(prompt)
    succ = lambda k: Successors(tokens, *top_k_logp(logits[last], k))
    pool = build(["ngram", {"name": "recycle", "top_k": 3, "widths": [3]}, {"name": "recycle", "top_k": 6, "widths": [4]}])
    alone3 = RETRIEVERS.build({"name": "recycle", "top_k": 3, "widths": [3]}, vocab_size=V, device="cpu")
    alone6 = RETRIEVERS.build({"name": "recycle", "top_k": 6, "widths": [4]}, vocab_size=V, device="cpu")
    assert pool.prefill_top_k == 6
    pool.reset(prompt, succ(6))
    alone3.reset(prompt, succ(3))
    alone6.reset(prompt, succ(6))
    tree = DraftTree(torch.tensor([6, 7, 8]), torch.tensor([-1, 0, 1]), torch.arange(3), torch.zeros(3),
                     torch.tensor([0, 1, 1], dtype=torch.int8))
    verified = torch.randn(3, V)
    for r in (pool, alone3, alone6):
        r.observe(tree, verified)
    for part, alone in zip(pool.sources[1:], (alone3, alone6)):
        assert torch.equal(part.ids, alone.ids) and torch.allclose(part.logp, alone.logp)
    assert not torch.equal(alone6.ids[:, :3], torch.arange(3).expand(V, 3))  # the warm-up wrote rows


# ---- config -----------------------------------------------------------------------------------------
def test_the_pool_config_validates_every_source():
    _, opts = validate(compose_cfg(["retriever=pool"]))
    assert opts["retriever"].sources == ["ngram", "recycle", "sam"]
    _, opts = validate(compose_cfg(["retriever=pool", "retriever.sources=[{name:ngram,n_max:3},sam]"]))
    assert opts["retriever"].sources == [{"name": "ngram", "n_max": 3}, "sam"]


@pytest.mark.parametrize("sources,needle", [
    ("[ngram,foo]", r"retriever.sources\[1\]: 'foo' is not a retriever a pool can hold; valid names: ngram, recycle, sam"),
    ("[pool]", r"retriever.sources\[0\]: 'pool'"),
    ("[none,sam]", r"retriever.sources\[0\]: 'none'"),
    ("[]", "retriever.sources must list at least one retriever"),
    ("[sam,{name:ngram,n_mx:3}]", r"retriever.sources\[1\]: unknown key\(s\) for retriever 'ngram': n_mx; valid keys"),
    ("[{name:recycle,top_k:0}]", r"retriever.sources\[0\]: retriever.top_k must be >= 1"),
    ("[{n_max:3}]", r"retriever.sources\[0\]: None is not a retriever"),
])
def test_bad_pool_configs_name_the_source(sources, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(compose_cfg(["retriever=pool", f"retriever.sources={sources}"]))


def test_run_py_reports_a_bad_source_in_one_line(tmp_path):
    code, _, err = run_py(["model=tiny_random", "method=recycle", "retriever=pool", "retriever.sources=[ngram,sma]"], tmp_path)
    assert code == 2
    assert err.strip() == ("graft-lab: error: retriever.sources[1]: 'sma' is not a retriever a pool can hold; "
                           "valid names: ngram, recycle, sam")


def test_a_broken_warm_path_inside_a_pool_fails_before_loading(tmp_path):
    node = {"name": "pool", "sources": ["ngram", {"name": "recycle", "warm_path": str(tmp_path / "missing.npy")}]}
    with pytest.raises(ConfigError, match="warm_path .*missing.npy does not exist"):
        check_warm_path(node, V)
    check_warm_path({"name": "pool", "sources": ["ngram", "recycle"]}, V)


# ---- the contract: lossless with a pool --------------------------------------------------------------
ARCHS = ("llama", "qwen2", "qwen3")
MS = 1e-3
pytestmark = pytest.mark.usefixtures("one_thread")


class Recording:
    """Wraps a planner; records the sources of every verified tree's accepted nodes."""

    def __init__(self, inner):
        self.inner, self.accepted = inner, []

    def plan(self, tree, prefix, spent):
        plan = self.inner.plan(tree, prefix, spent)
        plan.tree.check()
        return plan

    def observe(self, plan, path, times):
        self.accepted += plan.tree.source[path[1:]].tolist()
        self.inner.observe(plan, path, times)

    def next_level_pays(self, level, best_score, margin=1.0):
        return self.inner.next_level_pays(level, best_score, margin)


def decode_with_pool(arch: str, seed: int, auto: bool, graft: str) -> tuple[list[int], list[int], Recording]:
    from graft_lab.profile import CostProfile, grid

    rng = random.Random(seed)
    target = shared_tiny_target(arch)
    budget = rng.choice([4, 8, 16, 40])
    if auto:
        sizes = grid(budget)
        profile = CostProfile({"fake": True}, sizes, [128], [[10 * MS * (1 + 0.2 * (n - 1)) for n in sizes]],
                              draft_base_s=0.5 * MS, draft_level_s=0.2 * MS)
        planner = Recording(CostPlanner(profile, AcceptanceModel(), budget))
    else:
        planner = Recording(FixedPlanner())
    sources = rng.sample(["ngram", "recycle", "sam", {"name": "recycle", "top_k": 4, "widths": [4, 3]}], rng.randint(2, 4))
    pool = build(sources, target.vocab_size)
    drafter = NoDrafter() if rng.random() < 0.3 else Eagle3Drafter(
        tiny_eagle3(target, seed=seed), target.model.get_input_embeddings(), depth=rng.randint(1, 5), top_k=rng.randint(1, 6))
    pruner = PRUNERS.build({"name": "none"})
    method = Method(drafter, pruner, pool, GRAFTS.build({"name": graft}, retriever=pool), budget, planner)
    prompt = repetitive_prompt(rng)
    new = rng.randint(8, 32)
    out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=new))
    return out.tokens, hf_greedy(target.model, prompt, new), planner


CASES = [(arch, auto, graft) for arch in ARCHS for auto in (False, True) for graft in ("root", "tail", "match")]


@pytest.mark.parametrize("arch,auto,graft", CASES)
def test_decoding_with_a_pool_is_lossless(arch, auto, graft):
    got, ref, _ = decode_with_pool(arch, 50 + CASES.index((arch, auto, graft)), auto, graft)
    assert got == ref


def test_nodes_of_several_sources_get_accepted():
    """Not lossless by doing nothing: on repetitive prompts the accepted nodes come from more than one source."""
    accepted = []
    for seed in range(4):
        got, ref, rec = decode_with_pool("llama", 200 + seed, auto=seed % 2 == 1, graft="root")
        assert got == ref
        accepted += rec.accepted
    retrieved = {s for s in accepted if s >= int(Source.RETRIEVED)}
    assert len(retrieved) >= 2, accepted
