"""No drafter: the tree is the root alone, so the shared engine decodes autoregressively (the baseline)."""

from __future__ import annotations

from ..pruners.base import Pruner
from ..tree import DraftTree
from .base import DRAFTERS, DraftInput


class NoDrafter:
    needs_features = False

    def reset(self, max_len: int) -> None:
        pass

    def draft(self, inp: DraftInput, budget: int, pruner: Pruner) -> DraftTree:
        return DraftTree.root(inp.root, device=inp.next_tokens.device)


@DRAFTERS.register("none")
def build_none(target) -> NoDrafter:
    return NoDrafter()
