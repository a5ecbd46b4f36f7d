"""Target features for training, computed on the fly (one prefill per sequence, no gradient)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.target import Target


@dataclass
class Features:
    ids: torch.Tensor  # [T] token ids
    aux: torch.Tensor  # [T, 3H] float32: hidden_states[aux layers] at every position
    draft_logits: torch.Tensor  # [T, D] float32: the target's next-token logits restricted to the draft vocab
    embeds: torch.Tensor  # [T, H] float32: the target's input embeddings of ids
    top_in_vocab: torch.Tensor | None = None  # [T] bool: the target's full-vocabulary argmax is a draft token


@torch.no_grad()
def target_features(target: Target, ids: torch.Tensor, draft_ids: torch.Tensor, full: bool = False) -> Features:
    """One causal prefill of `ids` ([T]); the head is applied to the draft-vocab rows only (saves ~20%).
    `full`: also apply the whole head, to say where the target's own next token is outside the draft vocab
    (held-out accuracy counts those positions as misses, as decoding does)."""
    out = target.model.model(input_ids=ids[None].to(target.device), output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i][0] for i in target.aux_layers], dim=-1).float()
    head = target.model.get_output_embeddings().weight[draft_ids.to(target.device)]  # [D, H]
    logits = (out.last_hidden_state[0] @ head.T).float()
    embeds = target.model.get_input_embeddings()(ids.to(target.device)).float()
    top_in_vocab = None
    if full:
        in_vocab = torch.zeros(target.vocab_size, dtype=torch.bool, device=target.device)
        in_vocab[draft_ids.to(target.device)] = True
        top_in_vocab = in_vocab[target.model.get_output_embeddings()(out.last_hidden_state[0]).argmax(-1)].cpu()
    return Features(ids, aux, logits, embeds, top_in_vocab)
