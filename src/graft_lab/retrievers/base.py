"""Retrievers propose continuations of the current context without a model, as a tree fragment rooted
at the current token, and learn online from what the target verified."""

from __future__ import annotations

from typing import Protocol

import torch

from ..registry import Registry
from ..tree import DraftTree


class Retriever(Protocol):
    needs_prefill_logits: bool  # whether reset() wants the target's logits at every prompt position

    def reset(self, prompt: torch.Tensor, prefill_logits: torch.Tensor | None) -> None:
        """Start a new sequence. prompt: [S]; prefill_logits: [S, V] or None."""

    def extend(self, tokens: torch.Tensor) -> None:
        """Append emitted tokens [n] to the context; the last one is the next tree's root."""

    def retrieve(self, budget: int) -> DraftTree:
        """A tree of at most `budget` nodes rooted at the last context token."""

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """Learn from a verified tree and the target's logits at its nodes ([N, V])."""


RETRIEVERS: Registry[Retriever] = Registry("retriever")


class NoRetriever:
    """Retrieves nothing: the root alone."""

    needs_prefill_logits = False

    def __init__(self):
        self.root = 0

    def reset(self, prompt: torch.Tensor, prefill_logits: torch.Tensor | None) -> None:
        self.root = int(prompt[-1])

    def extend(self, tokens: torch.Tensor) -> None:
        self.root = int(tokens[-1])

    def retrieve(self, budget: int) -> DraftTree:
        return DraftTree.root(self.root)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        pass


@RETRIEVERS.register("none")
def build_none(vocab_size: int, device: torch.device) -> NoRetriever:
    return NoRetriever()
