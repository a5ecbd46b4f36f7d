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
from .tree import DraftTree

Graft = Callable[[DraftTree, DraftTree, int], DraftTree]
GRAFTS: Registry[Graft] = Registry("graft")


def attach(tree: DraftTree, *fragments: Fragment) -> DraftTree:
    """Hang fragments under their anchors in one fold pass; a node's score becomes its anchor's score
    plus its own estimate, its source the fragment's. Folding keeps earlier nodes, so `tree`'s nodes keep
    their indices and sources, and among fragments the earlier one's node wins."""
    frag = Fragment.concat(list(fragments), tree.device)
    if not frag.size:
        return tree
    return tree.add_subtree(frag.under, frag.tokens, frag.parents, tree.score[frag.under] + frag.score, frag.source)


def fill(merged: DraftTree, kept: int, budget: int) -> DraftTree:
    """Keep the first `kept` nodes of `merged` (the tree grafted onto: folding never moves them) and the
    best of the others by score, up to `budget` nodes."""
    rank = merged.score.clone()
    rank[:kept] = math.inf
    return merged.cut(budget, rank)


def graft_root(draft: DraftTree, retrieved: DraftTree, budget: int) -> DraftTree:
    """The paper's mode: the whole retained draft, then the best retrieved nodes in the free slots."""
    return fill(attach(draft, Fragment.below_root(retrieved)), draft.size, budget)


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
    continued = retriever.continuations(draft, nodes, min(max_len, budget - 1))
    merged = attach(draft, continued, Fragment.below_root(retrieved))
    return merged.cut(budget)


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
