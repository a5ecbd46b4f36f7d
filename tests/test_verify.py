"""Acceptance rules: greedy picks the longest matching path; sampling reproduces the target's distribution."""

import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import graft_lab.verify as verify
from graft_lab.tree import DraftTree
from graft_lab.verify import SamplingParams, accept_greedy, accept_sampling, target_probs
from tiny import tiny_target


def tree_of(tokens, parents) -> DraftTree:
    n = len(tokens)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth), torch.zeros(n),
                     torch.zeros(n, dtype=torch.int8))


def one_hot_logits(preds, vocab=10):
    logits = torch.full((len(preds), vocab), -5.0)
    logits[torch.arange(len(preds)), torch.tensor(preds)] = 5.0
    return logits


def test_greedy_takes_longest_matching_path_and_bonus():
    # root(0) -> 1 -> 3 ; root -> 2 -> 4 -> 5 ; the target predicts 2 after root, 4 after node 2, 9 after node 4
    tree = tree_of([0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 4])
    acc = accept_greedy(tree, one_hot_logits([2, 0, 4, 0, 9, 0]))
    assert acc.path.tolist() == [0, 2, 4] and acc.bonus == 9
    # nothing matches: the root alone plus the target's token
    acc = accept_greedy(tree, one_hot_logits([7, 0, 0, 0, 0, 0]))
    assert acc.path.tolist() == [0] and acc.bonus == 7


def test_greedy_does_not_accept_a_matching_child_of_a_rejected_node():
    tree = tree_of([0, 1, 2], [-1, 0, 1])
    acc = accept_greedy(tree, one_hot_logits([3, 2, 0]))  # node 2 matches node 1's prediction, node 1 is wrong
    assert acc.path.tolist() == [0] and acc.bonus == 3


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.5, 0.8, 7)])
def test_target_probs_match_transformers_warpers(temperature, top_p, top_k):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ours = target_probs(logits, SamplingParams(temperature, top_p, top_k))
    assert torch.allclose(ours, torch.softmax(ref, -1), atol=1e-6)


def emitted_first_two(tree, logits, params, n, seed):
    g = torch.Generator().manual_seed(seed)
    firsts, pairs = [], []
    for _ in range(n):
        acc = accept_sampling(tree, logits, params, g)
        emitted = tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        firsts.append(emitted[0])
        if len(emitted) > 1:
            pairs.append((emitted[0], emitted[1]))
    return firsts, pairs


def chi2_pvalue(samples, probs):
    counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).float()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token the target gives probability 0"
    expected = probs[support] * counts.sum()
    return chisquare(counts[support].numpy(), expected.numpy()).pvalue


SAMPLING_TREE = tree_of([0, 1, 2, 3, 4, 1, 5], [-1, 0, 0, 0, 1, 1, 3])
PARAMS = SamplingParams(temperature=1.0)


def random_logits() -> torch.Tensor:
    return torch.randn(SAMPLING_TREE.size, 6, generator=torch.Generator().manual_seed(3)) * 1.5


def bf16_target_logits() -> torch.Tensor:
    """A tiny target's own tree-verification logits in bf16 (first 6 vocabulary entries), handed over as bf16:
    rounded values, exact ties possible."""
    target = tiny_target("llama")
    target.model.to(torch.bfloat16)
    cache = target.new_cache(16)
    target.prefill(torch.tensor([5, 6, 7, 8]), cache, want_aux=False)
    return target.verify(SAMPLING_TREE, cache, want_aux=False).logits[:, :6].to(torch.bfloat16)


LOGITS = {"fp32": random_logits, "bf16": bf16_target_logits}


def sampling_pvalues(logits, n=6000, seed=0):
    probs = target_probs(logits, PARAMS)
    firsts, pairs = emitted_first_two(SAMPLING_TREE, logits, PARAMS, n, seed)
    p_first = chi2_pvalue(firsts, probs[0])
    # after emitting child node 1 (token 1), the next token must follow the target's distribution at node 1
    seconds = [b for a, b in pairs if a == 1]
    p_second = chi2_pvalue(seconds, probs[1])
    return p_first, p_second


@pytest.mark.parametrize("dtype", LOGITS)
def test_sampling_reproduces_the_target_distribution(dtype):
    p_first, p_second = sampling_pvalues(LOGITS[dtype]())
    assert p_first > 1e-3 and p_second > 1e-3


@pytest.mark.parametrize("dtype", LOGITS)
def test_the_sampling_test_fails_when_the_rule_is_broken(dtype, monkeypatch):
    # broken on purpose: after rejecting every child, draw the bonus from p instead of the residual
    monkeypatch.setattr(verify, "residual", lambda p, rejected: p)
    p_first, _ = sampling_pvalues(LOGITS[dtype]())
    assert p_first < 1e-6
