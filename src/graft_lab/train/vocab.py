"""The draft vocabulary: the most frequent label tokens, and the official d2t / t2d maps."""

from __future__ import annotations

import torch


def count_labels(label_batches, vocab_size: int) -> torch.Tensor:
    """Frequency [V] of the label tokens in an iterable of (ids [T], mask [T])."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in label_batches:
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def draft_vocab(counts: torch.Tensor, size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """Sorted target ids [size]: `always` first (special tokens), then by frequency (ties by id)."""
    size = min(size, counts.numel())
    score = counts.double().clone()
    score[list(always)] = float("inf")
    order = torch.sort(-score, stable=True).indices[:size]
    return torch.sort(order).values


def maps(keep: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t [D] (target id - draft id) and t2d [V] bool, as in the official checkpoints."""
    d2t = keep - torch.arange(keep.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[keep] = True
    return d2t, t2d


def coverage(counts: torch.Tensor, keep: torch.Tensor) -> float:
    return float(counts[keep].sum()) / max(1, int(counts.sum()))
