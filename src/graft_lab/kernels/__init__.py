"""Triton kernels for verification: tree attention and its transformers integration."""

from .hf_attention import ATTENTION_NAME, graft_tree_attention, register_tree_attention
from .reference import tree_attention_reference
from .tree_attention_kernel import tree_attention
from .tree_mask import TreeMaskBits, pack_tree_mask

__all__ = [
    "ATTENTION_NAME",
    "TreeMaskBits",
    "graft_tree_attention",
    "pack_tree_mask",
    "register_tree_attention",
    "tree_attention",
    "tree_attention_reference",
]
