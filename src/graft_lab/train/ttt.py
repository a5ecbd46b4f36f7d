"""Training-time test (TTT), batched over all anchors of a sequence.

Anchor i is pair i: the target feature f_i and the token x_{i+1}, at position i. Step 0 reads (fc(f_i),
embed(x_{i+1})) and its output h0_i predicts x_{i+2}. Step j >= 1 reads (h_{j-1,i}, embed(x_{i+j+1})) at
position i+j and predicts x_{i+j+2}. Attention of step j at anchor i sees the step-0 keys of anchors <= i
(the committed prefix, causal) and the anchor's own keys of steps 1..j (its ancestors in the draft tree,
and itself): a causal block over step 0 and a diagonal per later step, exactly what `drafters.eagle3`
sees at inference. Keys of later steps are kept as lists and scored with a dot product per anchor, so
the cost is O(T^2 + T*j) per step, not O((T*j)^2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from ..drafters.eagle3_model import Eagle3Model


def ttt_forward(net: Eagle3Model, aux: torch.Tensor, embeds: torch.Tensor, steps: int,
                sel: torch.Tensor | None = None) -> list[torch.Tensor]:
    """aux: [B, N, 3H] features of anchors 0..N-1; embeds: [B, N + steps - 1, H] embeddings of x_1..;
    returns `steps` pre-norm outputs; output j at anchor i predicts x_{i+j+2}. Step 0 runs on every anchor
    ([B, N, H]: its keys are everyone's prefix); steps >= 1 only on the anchors `sel` ([M] ascending,
    default all), giving [B, M, H] (a chain depends only on its own anchor and the step-0 keys)."""
    layer = net.midlayer
    attn = layer.self_attn
    b, n, _ = aux.shape
    nh, nkv, d = net.config.num_attention_heads, net.config.num_key_value_heads, attn.head_dim
    groups = nh // nkv
    h = net.fc(aux)
    base = torch.arange(n, device=aux.device)[None].expand(b, -1)
    causal = torch.ones(n, n, dtype=torch.bool, device=aux.device).tril()
    rows = torch.arange(n, device=aux.device) if sel is None else sel
    k0 = v0 = None
    ks, vs, outs = [], [], []
    for j in range(steps):
        if j == 1 and sel is not None:
            h, base, causal, n = h[:, sel], base[:, sel], causal[sel], sel.numel()
        cos, sin = net.rotary_emb(h, position_ids=base + j)
        emb = embeds[:, j : j + aux.shape[1]] if j == 0 else embeds[:, rows + j]
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(h)], dim=-1)
        q = attn.q_proj(x).view(b, n, nh, d).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, nkv, d).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, nkv, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # [B, nh, N, d]
        if j == 0:
            k0, v0 = k, v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)
        else:
            ks.append(k)
            vs.append(v)
            s0 = (q @ k0.transpose(-1, -2)) * attn.scaling  # [B, nh, N, N]
            s0 = s0.masked_fill(~causal, torch.finfo(s0.dtype).min)
            sd = torch.stack([(q * kk).sum(-1) for kk in ks], dim=-1) * attn.scaling  # [B, nh, N, j]
            p = torch.softmax(torch.cat([s0, sd], dim=-1).float(), dim=-1).to(q.dtype)
            o = p[..., : k0.shape[2]] @ v0 + (p[..., k0.shape[2] :, None] * torch.stack(vs, dim=-2)).sum(-2)
        o = attn.o_proj(o.transpose(1, 2).reshape(b, n, nh * d))
        x = h + o
        h = x + layer.mlp(layer.post_attention_layernorm(x))
        outs.append(h)
    return outs


def step_targets(ids: torch.Tensor, mask: torch.Tensor, tgt_logits: torch.Tensor, n: int, j: int,
                 t2d_index: torch.Tensor):
    """For step j over anchors 0..n-1 of each row: (soft target logits [B, n, D], hard draft labels [B, n] (-1 when
    the token is outside the draft vocab), valid [B, n], the position [n] whose target prediction is the soft
    label). ids, mask: [B, T]; tgt_logits: [B, T, D]."""
    t = ids.shape[1]
    lab_pos = torch.arange(n, device=ids.device) + j + 2  # position of the predicted token
    ok = lab_pos < t
    lab_pos = lab_pos.clamp(max=t - 1)
    valid = ok & mask[:, lab_pos]
    hard = t2d_index[ids[:, lab_pos]]
    soft = tgt_logits[:, lab_pos - 1]  # the target's prediction at position i+j+1
    return soft, hard, valid, lab_pos - 1


def ttt_loss(net: Eagle3Model, ids: torch.Tensor, mask: torch.Tensor, aux: torch.Tensor, embeds: torch.Tensor,
             tgt_logits: torch.Tensor, t2d_index: torch.Tensor, steps: int, labels: str = "soft",
             decay: float = 0.8, autocast: bool = False, anchor_frac: float = 1.0,
             generator: torch.Generator | None = None, top_in_vocab: torch.Tensor | None = None):
    """Weighted TTT loss for one sequence, or a batch of right-padded ones (a sum over valid anchors,
    sum_j decay^j * loss_j / sum_j decay^j over the steps with a valid anchor; the caller divides by its token
    count) and per-step stats.

    ids, mask: [T] or [B, T] (mask False on padding); aux: [(B,) T, 3H]; embeds: [(B,) T, H]; tgt_logits:
    [(B,) T, D]; t2d_index: [V] draft id or -1. Everything runs on aux's device. Steps >= 1 run only from anchors
    whose step-0 label is trained, a random `anchor_frac` of them (drawn in row-major order), on the columns where
    any row has one. Padding after a row's end changes nothing before it: step 0 is causal and later steps read
    their own anchor. Returns (loss, stats) where stats[j] = (loss sum, correct vs the target's top-1 within the
    draft vocab, correct vs the data token, counted, correct vs the target's full-vocabulary top-1) over valid
    anchors of step j. The last needs `top_in_vocab` ([(B,) T] bool, Features.top_in_vocab); without it, it is the
    second."""
    if ids.dim() == 1:
        ids, mask, aux, embeds, tgt_logits = ids[None], mask[None], aux[None], embeds[None], tgt_logits[None]
        top_in_vocab = None if top_in_vocab is None else top_in_vocab[None]
    dev = aux.device
    ids, mask, t2d_index = ids.to(dev), mask.to(dev), t2d_index.to(dev)
    top_in_vocab = None if top_in_vocab is None else top_in_vocab.to(dev)
    b, t = ids.shape
    n = t - 2  # anchors with at least the step-0 label inside the sequence
    if n < 1:
        return None, None
    pad = embeds.new_zeros(b, steps, embeds.shape[-1])
    emb = torch.cat([embeds[:, 1:], pad], dim=1)[:, : n + steps - 1]
    chosen = mask[:, 2:].clone()  # [B, n] anchors that run steps >= 1
    trained = int(chosen.sum())
    if anchor_frac < 1.0 and trained > 1:
        pick = torch.rand(trained, generator=generator).to(dev) < anchor_frac
        if not pick.any():
            pick[0] = True
        chosen[chosen.clone()] = pick
    sel = torch.nonzero(chosen.any(0)).flatten()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        outs = ttt_forward(net, aux[:, :n], emb, steps, sel)
    total = 0.0
    weight = 0.0
    stats = []
    for j, h in enumerate(outs):
        soft, hard, valid, src = step_targets(ids, mask, tgt_logits, n, j, t2d_index)
        if j > 0:
            soft, hard, valid, src = soft[:, sel], hard[:, sel], valid[:, sel] & chosen[:, sel], src[sel]
        cnt = int(valid.sum())
        if cnt == 0:
            stats.append((0.0, 0, 0, 0, 0))
            continue
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = net.logits(h[valid])
        logp = torch.log_softmax(logits.float(), dim=-1)
        tsoft = soft[valid]
        thard = hard[valid]
        if labels == "soft":
            lj = -(torch.softmax(tsoft, dim=-1) * logp).sum()
        else:
            inv = thard >= 0
            lj = F.nll_loss(logp[inv], thard[inv], reduction="sum") if inv.any() else logp.sum() * 0
        pred = logp.argmax(-1)
        w = decay**j
        total = total + w * lj
        weight += w
        agree = pred == tsoft.argmax(-1)
        full = agree if top_in_vocab is None else agree & top_in_vocab[:, src][valid]
        stats.append((float(lj.detach()), int(agree.sum()), int((pred == thard).sum()), cnt, int(full.sum())))
    return total / max(weight, 1e-9), stats
