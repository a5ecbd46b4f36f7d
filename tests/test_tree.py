"""DraftTree: derived tensors against brute force, and the invariants every operation keeps."""

import pytest
import torch

from graft_lab.tree import DraftTree, Source


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
