"""Grafting modes: budget, folding of duplicates with slot reuse, placement of retrieved nodes, ranking."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from graft_lab.errors import ConfigError
from graft_lab.graft import GRAFTS, graft_match, graft_root, graft_tail
from graft_lab.models.target import Successors, top_k_logp
from graft_lab.retrievers import RETRIEVERS
from graft_lab.retrievers.base import Fragment, retrieved
from graft_lab.retrievers.ngram import NgramOptions, NgramRetriever
from graft_lab.tree import DraftTree, Source


def tree_of(tokens, parents, score, source=Source.DRAFT) -> DraftTree:
    """A tree from lists; depths follow from parents (parents precede children)."""
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    src = torch.full((len(tokens),), int(source), dtype=torch.int8)
    src[0] = int(Source.ROOT)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth), torch.tensor(score, dtype=torch.float32), src)


def random_tree(rng: random.Random, n: int, vocab: int, source: Source) -> DraftTree:
    """Random parents, tokens and cumulative log-prob scores, duplicate siblings folded."""
    parents, score = [-1], [0.0]
    for i in range(1, n):
        parents.append(rng.randrange(i))
        score.append(score[parents[-1]] - rng.random() * 2)
    return tree_of([1] + [rng.randrange(2, vocab) for _ in range(n - 1)], parents, score, source).fold_duplicates()


def union_size(*trees: DraftTree) -> int:
    """Distinct root-to-node token paths over the trees: what a lossless merge can hold at most."""
    paths = set()
    for t in trees:
        for i in range(t.size):
            path, j = [], i
            while j >= 0:
                path.append(int(t.tokens[j]))
                j = int(t.parents[j])
            paths.add(tuple(reversed(path)))
    return len(paths)


class FakeLookup:
    """Continuations given per anchor as fixed chains, to place them exactly."""

    def __init__(self, chains: dict[int, tuple[list[int], list[float]]]):
        self.chains = chains
        self.asked = None

    def continuations(self, tree, nodes, max_len):
        self.asked = nodes.tolist()
        under, tokens, parents, depth, score = [], [], [], [], []
        for q in self.asked:
            toks, scs = self.chains.get(q, ([], []))
            for d, (t, s) in enumerate(zip(toks[:max_len], scs[:max_len])):
                parents.append(-1 if d == 0 else len(tokens) - 1)
                under.append(q)
                tokens.append(t)
                depth.append(d + 1)
                score.append(s)
        if not tokens:
            return Fragment.empty()
        long = lambda xs: torch.tensor(xs, dtype=torch.long)
        return Fragment(long(under), long(tokens), long(parents), long(depth), torch.tensor(score), retrieved(len(tokens), "cpu"))


CONF = Path(__file__).resolve().parent.parent / "conf" / "graft"
DRAFT = tree_of([1, 5, 6, 7, 8], [-1, 0, 0, 1, 3], [0.0, -0.1, -2.0, -0.3, -0.6])  # best path 1-5-7-8
RETRIEVED = tree_of([1, 5, 9, 6, 4, 3], [-1, 0, 1, 0, 0, 4], [0.0, -0.5, -0.7, -0.9, -1.0, -3.0], Source.RETRIEVED)


# ---- root ------------------------------------------------------------------------------------------
def test_root_keeps_the_draft_and_fills_free_slots_reusing_folded_ones():
    out = graft_root(DRAFT, RETRIEVED, budget=7)
    out.check()
    assert out.size == 7  # retrieved 5 and 6 fold into draft children: their slots go to 9 and 4
    assert int((out.source == Source.DRAFT).sum()) == 4
    kids_of_5 = out.tokens[out.parents == int((out.tokens == 5).nonzero()[0])].tolist()
    assert sorted(kids_of_5) == [7, 9]  # retrieved 9 hangs under the drafted 5
    assert 4 in out.tokens.tolist() and 3 not in out.tokens.tolist()  # best by score, ancestor-closed
    assert graft_root(DRAFT, RETRIEVED, budget=100).size == union_size(DRAFT, RETRIEVED) == 8
    assert torch.equal(graft_root(DRAFT, RETRIEVED, budget=5).tokens, DRAFT.tokens)


@pytest.mark.parametrize("seed", range(20))
def test_every_mode_stays_within_budget_and_fills_it(seed):
    rng = random.Random(seed)
    vocab = rng.choice([4, 8, 50])
    budget = rng.randint(1, 80)
    draft = random_tree(rng, rng.randint(1, budget), vocab, Source.DRAFT)
    retrieved = random_tree(rng, rng.randint(1, 60), vocab, Source.RETRIEVED)
    lookup = RETRIEVERS.build({"name": "recycle", "top_k": 3, "widths": [3, 2]}, vocab_size=vocab, device="cpu")
    prompt = torch.tensor([rng.randrange(vocab) for _ in range(10)])
    tokens, last = Successors.last_positions(prompt)
    lookup.reset(prompt, Successors(tokens, *top_k_logp(torch.randn(10, vocab)[last], 3)))
    for name in ("root", "tail", "match"):
        graft = GRAFTS.build(OmegaConf.create({"name": name}), retriever=lookup)
        out = graft(draft, retrieved, budget)
        out.check()
        assert out.size <= budget
        assert int(out.tokens[0]) == 1
    root = graft_root(draft, retrieved, budget)
    assert root.size == min(budget, union_size(draft, retrieved))  # full whenever candidates exist
    assert torch.equal(root.tokens[: draft.size], draft.tokens)  # the retained draft is never displaced


# ---- tail ------------------------------------------------------------------------------------------
def test_tail_continues_the_deepest_best_draft_node_then_fills_from_the_root():
    lookup = FakeLookup({4: ([9, 10, 11], [-0.2, -0.4, -0.6])})
    out = graft_tail(DRAFT, RETRIEVED, 9, lookup, max_len=8)
    out.check()
    assert lookup.asked == [4]  # node 4 (token 8) ends the best deepest path
    chain = out.tokens[out.depth >= 4].tolist()
    assert chain == [9, 10, 11]
    assert out.size == 9 and int((out.source == Source.RETRIEVED).sum()) == 4  # the chain, then root retrieval
    short = graft_tail(DRAFT, RETRIEVED, 6, lookup, max_len=8)
    assert short.size == 6 and short.tokens[-1].item() == 9  # one free slot: the chain comes first


def test_tail_without_a_draft_is_root_grafting():
    root_only = DraftTree.root(1)
    lookup = FakeLookup({0: ([9], [-0.1])})
    assert torch.equal(graft_tail(root_only, RETRIEVED, 4, lookup, 8).tokens, graft_root(root_only, RETRIEVED, 4).tokens)
    assert lookup.asked is None


# ---- match -----------------------------------------------------------------------------------------
def test_match_ranks_drafted_and_retrieved_candidates_on_one_score():
    # under node 3 (path 1-5-7, score -0.3) a confident continuation; under node 2 (score -2.0) a weak one
    lookup = FakeLookup({3: ([8, 12], [-0.05, -0.1]), 2: ([13], [-0.1])})
    out = graft_match(DRAFT, DraftTree.root(1), 5, lookup, max_len=8)
    out.check()
    assert lookup.asked == [1, 2, 3, 4]
    assert sorted(out.tokens.tolist()) == [1, 5, 7, 8, 12]  # 8 merged with the drafted 8; 12 beats the drafted 6
    assert 13 not in out.tokens.tolist() and 6 not in out.tokens.tolist()
    node12 = int((out.tokens == 12).nonzero()[0])
    assert float(out.score[node12]) == pytest.approx(-0.3 - 0.1)  # anchor score + continuation estimate


def test_match_with_ngram_attaches_where_the_path_matches_the_context():
    r = NgramRetriever(NgramOptions(n_max=3, n_min=2, max_len=2), "cpu")
    r.reset(torch.tensor([20, 21, 22, 23, 24, 30, 31, 20]), None)
    draft = tree_of([20, 21, 40], [-1, 0, 0], [0.0, -0.5, -0.6])
    out = graft_match(draft, r.retrieve(10), 10, r, max_len=2)
    out.check()
    node21 = int((out.tokens == 21).nonzero()[0])
    assert out.tokens[out.parents == node21].tolist() == [22]
    assert 40 in out.tokens.tolist()  # no match under 40: it keeps no continuation, but stays


def test_graft_configs_validate():
    for name in ("root", "tail", "match"):
        node = OmegaConf.load(CONF / f"{name}.yaml")
        assert node.name == name
        GRAFTS.options(node)
    with pytest.raises(ConfigError):
        GRAFTS.options({"name": "match", "max_len": 0})
