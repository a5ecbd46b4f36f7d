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


def grow(keep: torch.Tensor, counts: torch.Tensor, size: int) -> torch.Tensor:
    """Sorted target ids [size]: every id of `keep`, then the most frequent others (ties by id)."""
    if not keep.numel() <= size <= counts.numel():
        raise ValueError(f"cannot grow a {keep.numel()}-token draft vocab to {size} tokens: give a size from "
                         f"{keep.numel()} to the target's {counts.numel()}")
    score = counts.double().clone()
    score[keep] = float("inf")
    return draft_vocab(score, size)


def grow_head(state: dict, keep: torch.Tensor, new_keep: torch.Tensor, target_head: torch.Tensor,
              ridge: float = 1.0) -> dict:
    """A drafter state dict over `keep` rewritten for the superset `new_keep`; d2t / t2d follow.

    The trained lm_head rows stay with their tokens. A trained drafter's rows are not the target's (their
    cosine is about 0 for the shipped one), so each new token's row is the target's own output row
    (target_head [V, H]) sent through the affine map that best turns the target's rows of `keep` into the
    trained rows (ridge least squares). Such rows lower the loss at once and never win an argmax untrained."""
    old = state["lm_head.weight"]  # [D, H]
    x = torch.cat([target_head[keep].double(), target_head.new_ones(keep.numel(), 1).double()], 1)  # [D, H+1]
    w = torch.linalg.solve(x.T @ x + ridge * torch.eye(x.shape[1], dtype=x.dtype), x.T @ old.double())  # [H+1, H]
    pos = torch.searchsorted(new_keep, keep)
    fresh = torch.ones(new_keep.numel(), dtype=torch.bool)
    fresh[pos] = False
    rows = torch.empty(new_keep.numel(), old.shape[1], dtype=old.dtype)
    rows[pos] = old
    new = target_head[new_keep[fresh]].double()
    rows[fresh] = (torch.cat([new, new.new_ones(new.shape[0], 1)], 1) @ w).to(old.dtype)
    d2t, t2d = maps(new_keep, target_head.shape[0])
    return {**state, "lm_head.weight": rows, "d2t": d2t, "t2d": t2d}
