"""Target features for training, computed on the fly (one prefill per sequence, no gradient)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.target import Target


@dataclass
class Features:
    """One sequence's features ([T, ...]), or a right-padded batch's ([B, T, ...]), on the target's device."""

    ids: torch.Tensor  # [(B,) T] token ids
    aux: torch.Tensor  # [(B,) T, 3H] float32: hidden_states[aux layers] at every position
    draft_logits: torch.Tensor  # [(B,) T, D] float32: the target's next-token logits restricted to the draft vocab
    embeds: torch.Tensor  # [(B,) T, H] float32: the target's input embeddings of ids
    top_in_vocab: torch.Tensor | None = None  # [(B,) T] bool: the target's full-vocabulary argmax is a draft token


@torch.no_grad()
def target_features(target: Target, ids: torch.Tensor, draft_ids: torch.Tensor, full: bool = False) -> Features:
    """One causal prefill of `ids` ([T], or [B, T] right-padded: with no attention mask, a causal prefill leaves
    every position before a row's padding as it is alone); the head is applied to the draft-vocab rows only (saves
    ~20%). `full`: also apply the whole head, to say where the target's own next token is outside the draft vocab
    (held-out accuracy counts those positions as misses, as decoding does)."""
    batch = ids.to(target.device) if ids.dim() == 2 else ids[None].to(target.device)  # [B, T]
    out = target.model.model(input_ids=batch, output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i] for i in target.aux_layers], dim=-1).float()  # [B, T, 3H]
    head = target.model.get_output_embeddings().weight[draft_ids.to(target.device)]  # [D, H]
    logits = (out.last_hidden_state @ head.T).float()  # [B, T, D]
    embeds = target.model.get_input_embeddings()(batch).float()  # [B, T, H]
    top_in_vocab = None
    if full:
        in_vocab = torch.zeros(target.vocab_size, dtype=torch.bool, device=target.device)
        in_vocab[draft_ids.to(target.device)] = True
        top_in_vocab = in_vocab[target.model.get_output_embeddings()(out.last_hidden_state).argmax(-1)]  # [B, T]
    if ids.dim() == 1:
        aux, logits, embeds = aux[0], logits[0], embeds[0]
        top_in_vocab = None if top_in_vocab is None else top_in_vocab[0]
    return Features(ids, aux, logits, embeds, top_in_vocab)
