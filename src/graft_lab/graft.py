"""Grafting: merge the retained draft tree and retrieved candidates into one tree of at most K nodes.

Three modes, built bound to the retriever (tail and match ask it for continuations of draft paths):
  root   the retrieved subtree shares the root with the retained draft tree (the paper's mode);
  tail   a retrieved continuation of the best draft path hangs under its deepest node, then root retrieval;
  match  continuations hang under every draft node whose path matches the context, and drafted and
         retrieved candidates compete on one score (both are log-probability estimates).
A retrieved token equal to an existing child folds into it (`DraftTree.add_subtree`), and its slot goes
to the next candidate: the tree is cut to K only after every candidate is merged, so it is full whenever
enough candidates exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from .errors import ConfigError
from .registry import Registry
from .retrievers.base import Fragment, Retriever
from .tree import DraftTree, Source

Graft = Callable[[DraftTree, DraftTree, int], DraftTree]
GRAFTS: Registry[Graft] = Registry("graft")


def hang(tree: DraftTree, fragment: DraftTree, under: int) -> DraftTree:
    """Hang `fragment`'s non-root nodes under node `under` of `tree`; duplicate children fold."""
    if fragment.size <= 1:
        return tree
    local_parents = fragment.parents[1:] - 1  # -1 now means "under `under`"
    return tree.add_subtree(
        under=torch.full_like(local_parents, under),
        tokens=fragment.tokens[1:],
        parents=local_parents,
        score=fragment.score[1:],
        source=Source.RETRIEVED,
    )


def attach(tree: DraftTree, frag: Fragment) -> DraftTree:
    """Hang continuations under their anchors; a node's score becomes its anchor's score plus its own."""
    if frag.size == 0:
        return tree
    return tree.add_subtree(frag.under, frag.tokens, frag.parents, tree.score[frag.under] + frag.score, Source.RETRIEVED)


def keep_best(tree: DraftTree, rank: torch.Tensor, budget: int) -> DraftTree:
    """`DraftTree.cut` by an explicit rank ([N], higher first): a node ranks by the minimum on its path,
    found by pointer doubling (log2 depth steps, for long retrieved chains); ties go shallow, then early."""
    if tree.size <= budget:
        return tree
    path_min = rank.clone()
    path_min[0] = math.inf
    anc = tree.parents.clamp(min=0)
    for _ in range(max(1, tree.max_depth).bit_length()):
        path_min = torch.minimum(path_min, path_min[anc])
        anc = anc[anc]
    order = torch.sort(tree.depth, stable=True).indices
    order = order[torch.sort(-path_min[order], stable=True).indices]
    return tree.select(torch.sort(order[:budget]).values)


def fill(merged: DraftTree, kept: int, budget: int) -> DraftTree:
    """Keep the first `kept` nodes of `merged` (the tree grafted onto: folding never moves them) and the
    best of the others by score, up to `budget` nodes."""
    rank = merged.score.clone()
    rank[:kept] = math.inf
    return keep_best(merged, rank, budget)


def graft_root(draft: DraftTree, retrieved: DraftTree, budget: int) -> DraftTree:
    """The paper's mode: the whole retained draft, then the best retrieved nodes in the free slots."""
    return fill(hang(draft, retrieved, 0), draft.size, budget)


def graft_tail(draft: DraftTree, retrieved: DraftTree, budget: int, retriever: Retriever, max_len: int) -> DraftTree:
    """The best draft path is extended by retrieval from its deepest node; root retrieval fills the rest."""
    deepest = draft.depth == draft.max_depth
    best = torch.where(deepest, draft.score, torch.full_like(draft.score, -math.inf)).argmax()  # the deepest-best node
    free = budget - draft.size
    if int(best) == 0 or free < 1:
        return graft_root(draft, retrieved, budget)
    tail = fill(attach(draft, retriever.continuations(draft, best[None], min(max_len, free))), draft.size, budget)
    return graft_root(tail, retrieved, budget)


def graft_match(draft: DraftTree, retrieved: DraftTree, budget: int, retriever: Retriever, max_len: int) -> DraftTree:
    """Continuations under every draft node with a context match, then root retrieval; one score ranks all."""
    nodes = torch.arange(1, draft.size, device=draft.device)
    merged = hang(attach(draft, retriever.continuations(draft, nodes, min(max_len, budget - 1))), retrieved, 0)
    return keep_best(merged, merged.score, budget)


@dataclass
class ContinuationOptions:
    max_len: int = 8  # deepest retrieved continuation under a draft node

    def __post_init__(self):
        if self.max_len < 1:
            raise ConfigError(f"graft.max_len must be >= 1, got {self.max_len}")


@GRAFTS.register("root")
def build_root(retriever: Retriever | None = None) -> Graft:
    return graft_root


@GRAFTS.register("tail", ContinuationOptions)
def build_tail(opts: ContinuationOptions, retriever: Retriever) -> Graft:
    return partial(graft_tail, retriever=retriever, max_len=opts.max_len)


@GRAFTS.register("match", ContinuationOptions)
def build_match(opts: ContinuationOptions, retriever: Retriever) -> Graft:
    return partial(graft_match, retriever=retriever, max_len=opts.max_len)
