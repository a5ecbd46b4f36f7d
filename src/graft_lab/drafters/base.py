"""What the decode loop hands a drafter, and what every drafter provides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..pruners.base import Pruner
from ..registry import Registry
from ..tree import DraftTree


@dataclass
class DraftInput:
    """The positions committed since the last step, as (feature, next token) pairs.

    Pair i is the target's feature at position `start + i` and the token that followed it; the last
    pair's token is the current root (emitted, not yet verified)."""

    features: torch.Tensor | None  # [M, F] target aux hidden states, None for drafters that need none
    next_tokens: torch.Tensor  # [M] int64
    start: int  # absolute position of pair 0 == number of pairs committed before

    @property
    def root(self) -> int:
        return int(self.next_tokens[-1])


class Drafter(Protocol):
    needs_features: bool  # whether the target must return aux hidden states

    def reset(self, max_len: int) -> None:
        """Start a new sequence; `max_len` bounds the positions it will see."""

    def draft(self, inp: DraftInput, budget: int, pruner: Pruner) -> DraftTree:
        """Ingest the new pairs, then grow a tree of at most `budget` nodes rooted at `inp.root`."""


DRAFTERS: Registry[Drafter] = Registry("drafter")
