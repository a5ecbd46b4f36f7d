"""Tree attention behind transformers' attention-function interface.

Registering a function (instead of forking modelling code) lets stock Llama/Qwen2/Qwen3 models verify
a draft tree: the model forward passes unknown kwargs such as `tree_mask` through to the attention
function of every layer. Without `tree_mask` the function is plain SDPA, so prefill and ordinary
decoding are unchanged.
"""

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .tree_attention_kernel import tree_attention
from .tree_mask import TreeMaskBits

ATTENTION_NAME = "graft_tree"


def graft_tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # query: [B, Hq, T, D]
    key: torch.Tensor,  # key: [B, Hkv, S, D], cache prefix followed by the T tree nodes
    value: torch.Tensor,  # value: [B, Hkv, S, D]
    attention_mask: torch.Tensor | None,  # [B, 1, T, S] causal mask from sdpa_mask; ignored for trees
    dropout: float = 0.0,
    scaling: float | None = None,
    tree_mask: torch.Tensor | TreeMaskBits | None = None,  # tree_mask: [B, T, T] bool or packed bits
    **kwargs,
) -> tuple[torch.Tensor, None]:  # attn_output: [B, T, Hq, D]
    """Tree attention when the forward carries `tree_mask`, transformers' SDPA otherwise.

    With a tree the whole prefix is visible to every node (no padding), which is what verification needs.
    """
    if tree_mask is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise ValueError(f"{ATTENTION_NAME} does not support attention dropout (got {dropout}); call model.eval()")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{ATTENTION_NAME} does not support sliding-window layers with a tree_mask")
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[1] != key.shape[1] * groups:
        raise ValueError(
            f"query heads ({query.shape[1]}) != kv heads ({key.shape[1]}) x module.num_key_value_groups ({groups})"
        )
    batch, heads, nodes, head_dim = query.shape
    attn_output = query.new_empty(batch, nodes, heads, head_dim)
    tree_attention(query, key, value, tree_mask, scaling, out=attn_output.transpose(1, 2))
    return attn_output, None


def register_tree_attention() -> str:
    """Register "graft_tree" with transformers (idempotent); pass the name to model.set_attn_implementation."""
    AttentionInterface.register(ATTENTION_NAME, graft_tree_attention)
    # The mask registry decides whether a causal mask is built at all; SDPA's keeps prefill exact.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
