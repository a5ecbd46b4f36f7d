"""Grafting: merge the retained draft tree and a retrieved tree into one tree of at most K nodes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .registry import Registry
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


def graft_root(draft: DraftTree, retrieved: DraftTree, budget: int) -> DraftTree:
    """The paper's mode: the retrieved subtree shares the root with the retained draft tree."""
    merged = hang(draft, retrieved, 0)
    return merged if merged.size <= budget else merged.select(torch.arange(budget, device=merged.device))


@GRAFTS.register("root")
def build_root() -> Graft:
    return graft_root
