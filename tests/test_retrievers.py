"""Retrievers: each against a brute-force reference on small random sequences, plus shapes and updates."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from graft_lab.errors import ConfigError
from graft_lab.models.target import Successors, top_k_logp
from graft_lab.retrievers import RETRIEVERS, NoRetriever
from graft_lab.retrievers.base import Fragment, chain_trie
from graft_lab.retrievers.ngram import NgramOptions, NgramRetriever
from graft_lab.retrievers.recycle import PAPER_WIDTHS, RecycleOptions, RecycleRetriever, adjacency, load_bigrams
from graft_lab.retrievers.sam import SamOptions, SamRetriever, SuffixAutomaton
from graft_lab.tree import DraftTree, Source

V = 50


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def chain(tokens: list[int]) -> DraftTree:
    """A one-path tree: tokens[0] is the root."""
    n = len(tokens)
    return DraftTree(ids(*tokens), torch.arange(-1, n - 1), torch.arange(n), -torch.arange(n).float(),
                     torch.tensor([0] + [1] * (n - 1), dtype=torch.int8))


def successors(prompt: torch.Tensor, logits: torch.Tensor, k: int) -> Successors:
    """What prefill hands reset(): the top-k after each distinct token's last occurrence (logits: [S, V])."""
    tokens, last = Successors.last_positions(prompt)
    return Successors(tokens, *top_k_logp(logits[last], k))


def first_level(tree: DraftTree) -> list[int]:
    return tree.tokens[tree.depth == 1].tolist()


# ---- shared pieces ---------------------------------------------------------------------------------
def test_chain_trie_counts_shared_prefixes_and_keeps_parent_order():
    chains = np.array([[5, 6, 7], [5, 6, 8], [5, 9, -1], [4, -1, -1]])
    frag = chain_trie(np.zeros(4, dtype=np.int64), chains, math.log(0.5), "cpu")
    tree = frag.tree(1, "cpu")
    tree.check()
    assert sorted(first_level(tree)) == [4, 5]
    by_token = {t: s for t, s in zip(tree.tokens.tolist(), tree.score.tolist())}
    assert by_token[5] == pytest.approx(math.log(3 / 4) + math.log(0.5))  # 3 of 4 chains, depth 1
    assert by_token[6] == pytest.approx(math.log(2 / 4) + 2 * math.log(0.5))
    assert tree.size == 1 + 6
    assert bool((tree.score[1:] <= tree.score[tree.parents[1:]]).all())  # non-increasing down a path


def test_chain_trie_separates_anchors():
    frag = chain_trie(np.array([3, 3, 7]), np.array([[5, 6], [5, 2], [5, 6]]), 0.0, "cpu")
    assert frag.under.tolist().count(3) == 3 and frag.under.tolist().count(7) == 2
    anchor7 = frag.score[frag.under == 7]
    assert torch.allclose(anchor7, torch.zeros(2))  # one chain: every share is 1


@pytest.mark.parametrize("name", ["none", "recycle", "ngram", "sam"])
def test_every_retriever_returns_a_valid_tree_within_budget(name):
    rng = random.Random(0)
    r = RETRIEVERS.build({"name": name}, vocab_size=V, device="cpu")
    prompt = torch.tensor([rng.randrange(3, 8) for _ in range(40)])
    r.reset(prompt, successors(prompt, torch.randn(prompt.numel(), V), r.prefill_top_k) if r.prefill_top_k else None)
    root = int(prompt[-1])
    for _ in range(6):
        for budget in (1, 2, 5, 17, 60):
            tree = r.retrieve(budget)
            tree.check()
            assert tree.size <= budget and int(tree.tokens[0]) == root
            assert bool((tree.source[1:] == Source.RETRIEVED).all())
        draft = chain([root] + [rng.randrange(3, 8) for _ in range(3)])
        frag = r.continuations(draft, torch.arange(draft.size), 5)
        assert frag.size == 0 or int(frag.depth.max()) <= 5
        r.observe(draft, torch.randn(draft.size, V))
        new = [rng.randrange(3, 8) for _ in range(rng.randint(1, 3))]
        r.extend(torch.tensor(new))
        root = new[-1]


def test_options_are_validated():
    with pytest.raises(ConfigError):
        NgramOptions(n_min=3, n_max=2)
    with pytest.raises(ConfigError):
        SamOptions(decay=0.0)
    with pytest.raises(ConfigError):
        RecycleOptions(top_k=4, widths=[5])  # the root has only top_k children
    with pytest.raises(ConfigError):
        RecycleOptions(widths=[2, 17], top_k=8)  # 2 parents x 8 ranks < 17
    with pytest.raises(ConfigError):
        RETRIEVERS.build({"name": "ngram", "n_mx": 3}, vocab_size=V, device="cpu")


def test_no_retriever_has_no_continuations():
    r = NoRetriever()
    r.reset(ids(1, 2), None)
    assert r.continuations(chain([2, 3]), ids(0, 1), 4).size == 0


# ---- ngram -----------------------------------------------------------------------------------------
def test_ngram_prefers_the_longest_match():
    r = NgramRetriever(NgramOptions(n_max=3, n_min=1, max_len=2), "cpu")
    # "9" alone was followed by 40; "7 8 9" by 30: the 3-gram wins
    r.reset(ids(7, 8, 9, 30, 31, 5, 9, 40, 41, 6, 7, 8, 9), None)
    assert first_level(r.retrieve(10)) == [30]
    r.extend(ids(11))  # nothing followed 11: no match at any n
    assert r.retrieve(10).size == 1


def test_ngram_merges_occurrences_into_a_trie_ranked_by_count():
    r = NgramRetriever(NgramOptions(n_max=2, n_min=2, max_len=3, decay=1.0), "cpu")
    r.reset(ids(5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7, 3, 5, 6), None)
    tree = r.retrieve(20)
    tree.check()
    kids = dict(zip(first_level(tree), tree.score[tree.depth == 1].tolist()))
    assert kids.keys() == {7, 8}
    assert kids[7] == pytest.approx(math.log(2 / 3)) and kids[8] == pytest.approx(math.log(1 / 3))
    assert r.retrieve(3).tokens[1:].tolist() == [7, 8]  # ties go to the shallower node


def test_ngram_index_grows_incrementally_like_a_full_rebuild():
    rng = random.Random(1)
    seq = [rng.randrange(3, 7) for _ in range(80)]
    inc = NgramRetriever(NgramOptions(), "cpu")
    inc.reset(torch.tensor(seq[:10]), None)
    pos = 10
    while pos < len(seq):
        n = rng.randint(1, 4)
        inc.extend(torch.tensor(seq[pos : pos + n]))
        pos += n
        full = NgramRetriever(NgramOptions(), "cpu")
        full.reset(torch.tensor(seq[:pos]), None)
        assert inc.index == full.index
        a, b = inc.retrieve(30), full.retrieve(30)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)


def test_ngram_matches_context_extended_by_a_draft_path():
    r = NgramRetriever(NgramOptions(n_max=3, n_min=2, max_len=3), "cpu")
    r.reset(ids(10, 11, 12, 13, 14, 15, 20, 21, 10), None)
    draft = chain([10, 11, 12])  # context ... 10 | 11 12 matches "10 11 12" -> 13 14 15
    frag = r.continuations(draft, ids(1, 2), 3)
    under2 = frag.tokens[frag.under == 2].tolist()
    under1 = frag.tokens[frag.under == 1].tolist()
    assert under2 == [13, 14, 15] and under1 == [12, 13, 14]


# ---- suffix automaton ------------------------------------------------------------------------------
def distinct_substrings(seq: list[int]) -> int:
    return len({tuple(seq[i:j]) for i in range(len(seq)) for j in range(i + 1, len(seq) + 1)})


def occurs(seq: list[int], pat: list[int], before: int) -> bool:
    """`pat` ends somewhere at or before position `before` of `seq`."""
    n = len(pat)
    return any(seq[e - n + 1 : e + 1] == pat for e in range(n - 1, before + 1))


@pytest.mark.parametrize("seed", range(4))
def test_suffix_automaton_matches_brute_force(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(3) for _ in range(40)]
    sam = SuffixAutomaton()
    for pos, t in enumerate(seq):
        sam.add(t, pos)
        prefix = seq[: pos + 1]
        states = range(1, len(sam.length))
        assert sum(sam.length[v] - sam.length[sam.link[v]] for v in states) == distinct_substrings(prefix)
        for v in states:  # first occurrence of the class's longest string ends at first[v]
            s = sam.length[v]
            e = sam.first[v]
            assert e >= s - 1 and not occurs(prefix, prefix[e - s + 1 : e + 1], e - 1)
    # matching: step() tracks the longest suffix of a query that occurs in seq
    query = [rng.randrange(4) for _ in range(30)]
    state, length = 0, 0
    for i, t in enumerate(query):
        state, length = sam.step(state, length, t)
        best = max((n for n in range(i + 2) if n == 0 or occurs(seq, query[i - n + 1 : i + 1], len(seq) - 1)))
        assert length == best


@pytest.mark.parametrize("seed", range(6))
def test_sam_retrieves_the_continuation_of_the_longest_earlier_match(seed):
    rng = random.Random(10 + seed)
    seq = [rng.randrange(4) for _ in range(rng.randint(5, 50))]
    r = SamRetriever(SamOptions(max_len=4), "cpu")
    r.reset(torch.tensor(seq), None)
    n = len(seq)
    # brute force: the longest suffix that also ends before the last position
    best = max(m for m in range(n) if m == 0 or occurs(seq, seq[n - m :], n - 2))
    tree = r.retrieve(5)
    tree.check()
    if best == 0:
        assert tree.size == 1
        return
    got = tree.tokens[1:].tolist()
    starts = [e + 1 for e in range(best - 1, n - 1) if seq[e - best + 1 : e + 1] == seq[n - best :]]
    assert any(got == seq[s : s + 4] for s in starts)


def test_sam_continuations_follow_draft_paths():
    r = SamRetriever(SamOptions(max_len=2, min_match=2), "cpu")
    r.reset(ids(10, 11, 12, 13, 14, 20, 10), None)
    frag = r.continuations(chain([10, 11, 12]), ids(0, 1, 2), 2)
    assert frag.tokens[frag.under == 2].tolist() == [13, 14]
    assert frag.tokens[frag.under == 1].tolist() == [12, 13]
    assert (frag.under == 0).sum() == 0  # "20 10": only a 1-token match, below min_match


# ---- token recycling -------------------------------------------------------------------------------
def test_recycle_template_has_the_paper_shape_and_gathers_from_m():
    r = RecycleRetriever(RecycleOptions(), V, "cpu")
    prompt = torch.randint(0, V, (30,))
    r.reset(prompt, successors(prompt, torch.randn(30, V), r.k))
    tree = r.retrieve(100)
    tree.check()
    assert tree.size == 1 + sum(PAPER_WIDTHS) == 53
    assert torch.bincount(tree.depth)[1:].tolist() == PAPER_WIDTHS
    # each node's token is some rank of M at its parent's token, and its score adds that rank's log-prob
    row = r.ids[tree.tokens[tree.parents[1:]]]  # [52, k]
    hit = row == tree.tokens[1:, None]
    assert bool(hit.any(1).all())
    gained = (r.logp[tree.tokens[tree.parents[1:]]] * hit).sum(1)
    assert torch.allclose(tree.score[1:], tree.score[tree.parents[1:]] + gained)
    small = r.retrieve(12)
    small.check()
    assert small.size == 12


def test_recycle_observe_writes_top_k_rows_in_one_scatter():
    r = RecycleRetriever(RecycleOptions(top_k=4, widths=[4, 3]), V, "cpu")
    assert r.ids.shape == (V, 4) and r.logp.shape == (V, 4)
    tree = chain([7, 8, 9])
    logits = torch.randn(3, V)
    r.observe(tree, logits)
    lp = torch.log_softmax(logits, -1)
    for i, tok in enumerate([7, 8, 9]):
        assert r.ids[tok].tolist() == torch.topk(logits[i], 4).indices.tolist()
        assert torch.allclose(r.logp[tok], torch.topk(lp[i], 4).values, atol=1e-5)
    r.extend(ids(8))
    tree = r.retrieve(10)
    assert first_level(tree) == r.ids[8].tolist()  # the root's children: M[root] by rank


def test_recycle_prefill_warm_and_persistence():
    prompt = ids(3, 4, 5)
    logits = torch.randn(3, V)
    kept = RecycleRetriever(RecycleOptions(top_k=2, widths=[2]), V, "cpu")
    kept.reset(prompt, successors(prompt, logits, 2))
    assert kept.ids[4].tolist() == torch.topk(logits[1], 2).indices.tolist()
    kept.reset(ids(9), None)
    assert kept.ids[4].tolist() == torch.topk(logits[1], 2).indices.tolist()  # persists across prompts
    fresh = RecycleRetriever(RecycleOptions(top_k=2, widths=[2], persist=False), V, "cpu")
    fresh.reset(prompt, successors(prompt, logits, 2))
    fresh.reset(ids(9), None)
    assert fresh.ids[4].tolist() == [0, 1]


def test_recycle_warm_from_token_stream_and_counts(tmp_path):
    stream = np.array([3, 5, 3, 5, 3, 6, 4, 7, 4, 7, 4, 7, 4, 1])
    np.save(tmp_path / "stream.npy", stream)
    torch.save(torch.tensor([[3, 5, 2], [3, 6, 1], [4, 7, 3], [4, 1, 1]]), tmp_path / "counts.pt")
    for name in ("stream.npy", "counts.pt"):
        prev, nxt, cnt = load_bigrams(str(tmp_path / name), V)
        m, lp = adjacency(prev, nxt, cnt, V, 3)
        assert m[3].tolist() == [5, 6, 0] and m[4].tolist() == [7, 1, 0]
        assert lp[3, 0] == pytest.approx(math.log(2 / 3)) and lp[4, 0] == pytest.approx(math.log(3 / 4))
        assert lp[3, 2] == pytest.approx(-math.log(V))  # filler at the uniform prior
        assert m[9].tolist() == [0, 1, 2]
    m, _ = adjacency(ids(2, 2), ids(0, 1), ids(1, 1), V, 3)
    assert m[2].tolist() == [0, 1, 2]  # fillers skip observed successors: no duplicate in a row
    r = RecycleRetriever(RecycleOptions(top_k=3, widths=[3], warm_path=str(tmp_path / "stream.npy")), V, "cpu")
    assert r.ids[3].tolist() == [5, 6, 0]
    with pytest.raises(ConfigError):
        load_bigrams(str(tmp_path / "missing.npy"), V)
    np.save(tmp_path / "bad.npy", np.array([1, 2, V]))
    with pytest.raises(ConfigError):
        load_bigrams(str(tmp_path / "bad.npy"), V)


def test_recycle_continuations_follow_the_top_candidate():
    r = RecycleRetriever(RecycleOptions(top_k=2, widths=[2]), V, "cpu")
    r.reset(ids(3), None)
    r.observe(chain([3, 4, 5]), torch.nn.functional.one_hot(ids(4, 5, 6), V).float() * 10)
    frag = r.continuations(chain([3, 4]), ids(0, 1), 2)
    assert isinstance(frag, Fragment)
    assert frag.tokens[frag.under == 0].tolist() == [4, 5] and frag.tokens[frag.under == 1].tolist() == [5, 6]
    assert frag.depth.tolist() == [1, 1, 2, 2]
    assert bool((frag.score[2:] < frag.score[:2]).all())


def test_recycle_warm_up_reads_successors_in_chunks_exactly_as_from_full_logits():
    """Prefill hands recycle the top-k after each distinct prompt token, lm_head chunk by chunk, never the
    [S, V] logits; M comes out identical to the former warm-up that wrote every row from [S, V] logits."""
    from tiny import VOCAB as TINY_VOCAB
    from tiny import tiny_target

    target = tiny_target("llama")
    rng = random.Random(0)
    prompt = torch.tensor([rng.randrange(3, 60) for _ in range(300)])  # 300 positions, fewer distinct tokens
    opts = RecycleOptions(top_k=5, widths=[5, 4])
    before = RecycleRetriever(opts, TINY_VOCAB, "cpu")
    full = target.prefill(prompt, target.new_cache(320), want_aux=False, all_logits=True)  # [S, V]
    before.update(prompt, full.logits)  # later positions overwrite earlier ones of the same token
    with torch.inference_mode():
        hidden = target.model(prompt[None], output_hidden_states=True).hidden_states[-1][0]  # [S, H]
    for chunk in (1, 7, 256):
        succ = target.successors(prompt, hidden, opts.top_k, chunk=chunk)
        after = RecycleRetriever(opts, TINY_VOCAB, "cpu")
        after.reset(prompt, succ)
        assert torch.equal(after.ids, before.ids), chunk
        # a matmul of a few rows may round its last bit differently from one of S rows
        assert torch.allclose(after.logp, before.logp, rtol=0, atol=1e-5), chunk
    r = RecycleRetriever(opts, TINY_VOCAB, "cpu")
    out = target.prefill(prompt, target.new_cache(320), want_aux=False, successors=r.prefill_top_k)
    plain = target.prefill(prompt, target.new_cache(320), want_aux=False)  # what every other method's prefill gives
    assert out.logits.shape == (1, TINY_VOCAB) and torch.equal(out.logits, plain.logits)
    assert out.successors.tokens.tolist() == sorted(set(prompt.tolist()))
    r.reset(prompt, out.successors)
    assert torch.equal(r.ids, before.ids) and torch.equal(r.logp, before.logp)
    assert RecycleRetriever(RecycleOptions(warm_prefill=False), TINY_VOCAB, "cpu").prefill_top_k == 0


def test_the_successor_read_is_capped_to_a_share_of_prefill_most_frequent_tokens_first(monkeypatch):
    """Recycle's warm-up costs lm_head rows; at most SUCCESSOR_SHARE of the layers' FLOPs: a long prompt with
    many distinct tokens gets rows for its most frequent ones (ties: the later last occurrence)."""
    from graft_lab.models import target as target_module
    from tiny import tiny_target

    target = tiny_target("llama")
    layer_params = sum(p.numel() for n, p in target.model.named_parameters() if ".layers." in n)
    assert target.successor_rows(300) == int(0.04 * 300 * layer_params / (target.hidden_size * target.vocab_size))
    monkeypatch.setattr(target_module, "SUCCESSOR_SHARE", 0.002)
    prompt = torch.tensor([5] * 30 + [6] * 20 + [7] * 20 + list(range(10, 80)))  # 73 distinct tokens
    rows = target.successor_rows(prompt.numel())
    assert 3 <= rows < 73
    succ = target.prefill(prompt, target.new_cache(150), want_aux=False, successors=3).successors
    assert succ.tokens.numel() == rows and succ.ids.shape == (rows, 3)
    singles = list(range(80 - (rows - 3), 80))  # after 5, 6, 7: the latest of the tokens seen once
    assert succ.tokens.tolist() == [5, 6, 7, *singles]
    tokens, last = Successors.last_positions(prompt, limit=2)
    assert tokens.tolist() == [5, 7] and last.tolist() == [29, 69]  # 6 and 7 tie on count; 7 occurs later
