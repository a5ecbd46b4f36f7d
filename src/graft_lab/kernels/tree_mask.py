"""Tree masks packed into bits, the form the tree-attention kernel reads.

A bool mask of T x T bytes per tree would be re-read by every program and every layer;
bits are 8x smaller and packing them once per verification step lets all layers share them.
"""

from dataclasses import dataclass

import torch

WORD_BITS = 32


@dataclass(frozen=True)
class TreeMaskBits:
    """Ancestor mask packed row-wise: bit j % 32 of word j // 32 in row i says node i sees node j."""

    words: torch.Tensor  # words: [B, T, cdiv(T, 32)] int32

    @property
    def num_nodes(self) -> int:
        return self.words.shape[1]


def pack_tree_mask(tree_mask: torch.Tensor) -> TreeMaskBits:
    """Pack a bool ancestor mask into int32 words; the diagonal is set (every node sees itself)."""
    if not isinstance(tree_mask, torch.Tensor) or tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be a bool tensor, got {getattr(tree_mask, 'dtype', type(tree_mask))}")
    if tree_mask.dim() != 3 or tree_mask.shape[1] != tree_mask.shape[2]:
        raise ValueError(f"tree_mask must have shape [B, T, T], got {tuple(tree_mask.shape)}")
    batch, nodes, _ = tree_mask.shape
    num_words = -(-nodes // WORD_BITS)
    eye = torch.eye(nodes, dtype=torch.bool, device=tree_mask.device)
    bits = torch.zeros(batch, nodes, num_words * WORD_BITS, dtype=torch.int64, device=tree_mask.device)
    bits[:, :, :nodes] = tree_mask | eye
    weights = torch.ones(WORD_BITS, dtype=torch.int64, device=tree_mask.device) << torch.arange(
        WORD_BITS, device=tree_mask.device
    )
    words = (bits.view(batch, nodes, num_words, WORD_BITS) * weights).sum(-1)
    # Values >= 2**31 wrap to the negative int32 with the same bit pattern.
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return TreeMaskBits(words.contiguous())
