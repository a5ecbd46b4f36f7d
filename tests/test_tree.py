"""DraftTree: derived tensors against brute force, and the invariants every operation keeps."""

import pytest
import torch

from graft_lab.tree import MAX_RETRIEVERS, DraftTree, Source, is_retrieved, retrieved_by, retriever_index


def random_tree(n: int, vocab: int = 7, seed: int = 0) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    return DraftTree(
        tokens=torch.randint(0, vocab, (n,), generator=g),
        parents=parents,
        depth=depth,
        score=-torch.rand(n, generator=g).cumsum(0),
        source=torch.full((n,), int(Source.DRAFT), dtype=torch.int8),
    )


def brute_ancestors(tree: DraftTree) -> torch.Tensor:
    n = tree.size
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = int(tree.parents[j])
    return mask


@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (9, 2), (40, 3), (80, 4)])
def test_ancestor_mask_paths_positions(n, seed):
    tree = random_tree(n, seed=seed)
    anc = tree.ancestor_mask
    assert torch.equal(anc, brute_ancestors(tree))
    assert torch.equal(tree.position_ids(17), tree.depth + 17)
    paths = tree.paths()
    leaves = set(range(n)) - set(tree.parents[1:].tolist())
    assert paths.shape[0] == len(leaves)
    for row in paths:
        nodes = row[row >= 0]
        assert int(nodes[0]) == 0 and int(nodes[-1]) in leaves
        assert all(int(tree.parents[b]) == int(a) for a, b in zip(nodes[:-1], nodes[1:]))


def test_fold_duplicates_merges_children_and_adopts_grandchildren():
    # root -> a(5), b(5) duplicate; b has child c(3); a has child d(3) duplicate of c after folding
    tree = DraftTree(
        tokens=torch.tensor([0, 5, 5, 3, 3, 4]),
        parents=torch.tensor([-1, 0, 0, 2, 1, 2]),
        depth=torch.tensor([0, 1, 1, 2, 2, 2]),
        score=torch.tensor([0.0, -1.0, -0.5, -2.0, -3.0, -1.5]),
        source=torch.tensor([0, 1, 2, 2, 1, 2], dtype=torch.int8),
    )
    folded = tree.fold_duplicates()
    folded.check()
    assert folded.tokens.tolist() == [0, 5, 3, 4]
    assert folded.parents.tolist() == [-1, 0, 1, 1]
    assert folded.score.tolist() == [0.0, -0.5, -2.0, -1.5]  # the merged node keeps the best score


def test_add_subtree_attaches_and_folds():
    tree = random_tree(6, vocab=50, seed=5).fold_duplicates()
    base = tree.size
    # fragment: chain x -> y under node 0, and z under node 2; x duplicates an existing child of root
    child_of_root = int((tree.parents == 0).nonzero()[0])
    frag_tokens = torch.tensor([int(tree.tokens[child_of_root]), 77, 78])
    merged = tree.add_subtree(
        under=torch.tensor([0, 0, 2]), tokens=frag_tokens, parents=torch.tensor([-1, 0, -1]),
        score=torch.tensor([-0.1, -0.2, -0.3]), source=Source.RETRIEVED,
    )
    merged.check()
    assert merged.size == base + 2  # the duplicate folded into the existing child; its slot is reused
    y = int((merged.tokens == 77).nonzero())
    assert int(merged.parents[y]) == child_of_root and int(merged.depth[y]) == int(tree.depth[child_of_root]) + 1


def test_the_retriever_of_a_node_is_part_of_its_source():
    """A pool's i-th source tags its nodes RETRIEVED + i; a method's one retriever is index 0 (RETRIEVED)."""
    src = torch.tensor([int(Source.ROOT), int(Source.DRAFT), retrieved_by(0), retrieved_by(3)], dtype=torch.int8)
    assert retrieved_by(0) == int(Source.RETRIEVED)
    assert is_retrieved(src).tolist() == [False, False, True, True]
    assert retriever_index(src).tolist() == [-1, -1, 0, 3]
    assert retriever_index(src.long().numpy()).tolist() == [-1, -1, 0, 3]  # the acceptance model's host arrays
    assert retrieved_by(MAX_RETRIEVERS - 1) <= torch.iinfo(torch.int8).max
    with pytest.raises(ValueError):
        retrieved_by(MAX_RETRIEVERS)


def test_sources_survive_add_subtree_fold_select_and_cut():
    """Per-node sources go in with add_subtree; folding keeps the earlier node's source; select and cut carry them."""
    tree = DraftTree.root(1)
    merged = tree.add_subtree(
        under=torch.zeros(6, dtype=torch.long), tokens=torch.tensor([5, 6, 5, 7, 8, 9]),
        parents=torch.tensor([-1, 0, -1, 2, -1, 4]), score=torch.tensor([-0.5, -0.6, -0.1, -0.7, -0.2, -0.3]),
        source=torch.tensor([retrieved_by(0)] * 2 + [retrieved_by(1)] * 2 + [retrieved_by(2)] * 2, dtype=torch.int8),
    )
    merged.check()
    by_token = dict(zip(merged.tokens.tolist(), merged.source.tolist()))
    # 5 was proposed by sources 0 and 1: the earlier keeps it, with the better score; 7 (source 1) hangs under it
    assert by_token == {1: int(Source.ROOT), 5: retrieved_by(0), 6: retrieved_by(0), 7: retrieved_by(1),
                        8: retrieved_by(2), 9: retrieved_by(2)}
    assert float(merged.score[merged.tokens == 5]) == pytest.approx(-0.1)
    assert int(merged.parents[merged.tokens == 7]) == int((merged.tokens == 5).nonzero())
    kept = merged.cut(4)  # root, 5 (-0.1), 8 (-0.2), 9 (-0.3)
    assert dict(zip(kept.tokens.tolist(), kept.source.tolist())) == {1: 0, 5: retrieved_by(0), 8: retrieved_by(2),
                                                                       9: retrieved_by(2)}
    assert merged.add_subtree(torch.zeros(1, dtype=torch.long), torch.tensor([4]), torch.tensor([-1]),
                              torch.tensor([-1.0]), Source.DRAFT).source.tolist()[-1] == int(Source.DRAFT)


@pytest.mark.parametrize("budget", [1, 2, 5, 17, 100])
def test_cut_is_ancestor_closed_and_keeps_the_best(budget):
    tree = random_tree(60, vocab=1000, seed=budget)
    cut = tree.cut(budget)
    cut.check()
    assert cut.size == min(budget, tree.size)
    # with cumulative (monotone) scores the cut is exactly the top-scoring nodes
    mono = DraftTree(tree.tokens, tree.parents, tree.depth, -tree.depth.float() - torch.arange(60) * 1e-3, tree.source)
    kept = mono.cut(budget)
    expected = torch.sort(torch.topk(mono.score, min(budget, 60)).indices).values
    assert torch.equal(kept.tokens, mono.tokens[expected])


def test_cut_rejects_nonpositive_budget():
    with pytest.raises(ValueError, match="budget"):
        random_tree(5).cut(0)


def test_check_catches_broken_invariants():
    tree = random_tree(5, vocab=100, seed=1)
    bad = DraftTree(tree.tokens, torch.tensor([-1, 0, 3, 1, 2]), tree.depth, tree.score, tree.source)
    with pytest.raises(AssertionError, match="parents"):
        bad.check()
    dup = DraftTree(torch.tensor([0, 4, 4]), torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]),
                    torch.zeros(3), torch.zeros(3, dtype=torch.int8))
    with pytest.raises(AssertionError, match="duplicate"):
        dup.check()
