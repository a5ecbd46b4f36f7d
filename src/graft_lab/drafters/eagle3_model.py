"""The EAGLE-3 draft network, with parameter names exactly as in the official checkpoints.

    fc        : [3H_target] -> [H]      fuses the target's low/mid/high hidden states
    midlayer  : one Llama decoder layer whose q/k/v read [embed_norm(x) ; hidden_norm(h)] (2H)
    norm      : final RMSNorm
    lm_head   : [H] -> [draft_vocab]; d2t[d] + d is the target id of draft id d, t2d marks draft tokens

Inference and training share `forward`; the drafter and the trainer differ only in the mask and cache.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn = self.self_attn
        bias = config.attention_bias
        attn.q_proj = nn.Linear(2 * h, config.num_attention_heads * attn.head_dim, bias=bias)
        attn.k_proj = nn.Linear(2 * h, config.num_key_value_heads * attn.head_dim, bias=bias)
        attn.v_proj = nn.Linear(2 * h, config.num_key_value_heads * attn.head_dim, bias=bias)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, embeds, hidden, position_embeddings, attention_mask, cache):
        # embeds, hidden: [B, T, H]; attention_mask: [B, 1, T, S] additive; returns [B, T, H]
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask, cache=cache)
        x = residual + x
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Model(nn.Module):
    def __init__(self, config: LlamaConfig, target_hidden_size: int | None = None, with_embeddings: bool = False):
        super().__init__()
        config._attn_implementation = config._attn_implementation or "sdpa"
        self.config = config
        h = config.hidden_size
        self.draft_vocab_size = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.fc = nn.Linear(3 * (target_hidden_size or h), h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool)
                             if self.draft_vocab_size == config.vocab_size
                             else torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embeddings else None
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, embeds, hidden, positions, attention_mask, cache=None) -> torch.Tensor:
        """One draft step. `hidden` is either fused target features [B, T, 3H_t] (fed through fc) or the
        drafter's own previous output [B, T, H]. `positions` is position ids [B, T], or their rotary
        (cos, sin), each [B, T or 1, D], read from `rope_table`. Returns the pre-norm hidden state [B, T, H]."""
        # embeds: [B, T, H]; attention_mask: [B, 1, T, S] additive
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden)
        pos = positions if isinstance(positions, tuple) else self.rotary_emb(hidden, position_ids=positions)
        return self.midlayer(embeds, hidden, pos, attention_mask, cache)

    def rope_table(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin), each [1, length, D], for positions 0..length-1: the values `rotary_emb` gives position
        by position (it is elementwise), computed once. None for RoPE types whose tables change with the
        sequence length (dynamic, longrope): those are computed per step."""
        kind = self.rotary_emb.rope_type
        if "dynamic" in kind or kind == "longrope":
            return None
        probe = self.fc.weight.new_empty(1, dtype=dtype)
        return self.rotary_emb(probe, position_ids=torch.arange(length, device=probe.device)[None])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [..., H] -> [..., draft_vocab]
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
