"""Teacher-forced chain acceptance: the chain tau that training's own forward predicts, with no decode loop.

Along the target's greedy continuation s (prompt + continuation), TTT step j at anchor i reads the true tokens
s[i+1..i+j+1] and predicts s[i+j+2] (train/ttt.py). On the path that greedy acceptance follows, that is what
EAGLE-3's chain (top-1 per level) drafts at inference: a chain drafted from anchor p matches s up to its first
miss, and its levels up to the miss read the same tokens as the teacher-forced steps. So a decode step from
anchor p accepts the longest run of steps j = 0, 1, .. whose top-1 is s[p+j+2], emits it and the bonus, and the
next step's anchor is the last token it accepted.

`forced_chain` plays the decode loop's steps that way, with its stop rule (EOS and length, as `decode.generate`
checks them) and its context limit, from one causal forward of the target (`target_features`, the trainer's) and
one `ttt_forward`. Its accept lengths equal the real loop's step for step, but for float rounding of the features
at a near-tie: a difference is a mismatch between what training optimises and what inference drafts (a feature
paired with the wrong token, a stale cache entry, a draft id mapped wrongly), which costs acceptance without
breaking losslessness, so no output test sees it. `tests/test_forced.py` holds the two equal on tiny targets;
`evaluate --forced` measures a drafter with it in `evaluate`'s format, so `compare` pairs it with a real chain
run prompt by prompt. It also gives two things the loop does not: the share of anchors whose true token is within
the drafter's top 1 and top 10 at each step (`recall`, training's held-out accuracy measured on the evaluation's
own greedy text), and the tau of the widest tree of the chain's depth over the drafter's top 10 children
(`wide`, which `compare` pairs like a tree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..drafters.eagle3_model import Eagle3Model
from ..models.target import Target
from ..stopping import StopRule
from .features import target_features
from .ttt import ttt_forward

RECALL_AT = (1, 10)  # the ranks `recall` reports: a chain's, and a dense 60-node tree's children per node


@dataclass
class ForcedChain:
    accept_lengths: list[int]  # per decode step, bonus included (StepRecord.accept_length)
    tokens: list[int]  # what the loop emits, cut where the stop rule fires (Generation.tokens)
    stop_reason: str  # "eos", "length" or "context" (Generation.stop_reason)
    hits: torch.Tensor  # [depth, len(RECALL_AT)] anchors whose true token is within the top r at step j
    anchors: int  # anchors counted in `hits`: one per emitted token (its feature's position)
    wide: list[int]  # accept lengths of a tree holding every node's top 10 children to the same depth (about 10^depth nodes)


def _play(ok: list[list[bool]], s: list[int], prompt_len: int, depth: int, stop: StopRule,
          max_context: int) -> tuple[list[int], list[int], str]:
    """The decode loop's steps when step j from the anchor prompt_len - 1 + a is accepted iff ok[j][a] (s: prompt +
    continuation): (accept lengths, emitted tokens cut at the stop, stop reason), as `decode.generate` gives them."""
    first, budget = prompt_len - 1, depth + 1  # the first anchor; the chain's nodes, root included (the context
    # limit below binds only within a tree's budget of the target's context, so the wide tree shares the chain's)
    limit = min(prompt_len + stop.max_new_tokens + budget, max_context)  # as decode.generate sizes its cache
    tokens, lengths, p = [s[first + 1]], [], first
    hit = stop.first_stop([], tokens, 1)
    while hit is None and prompt_len + len(tokens) - 1 + budget <= limit:  # cache.length + budget <= limit
        k = 0
        while k < depth and ok[k][p - first]:
            k += 1
        tokens += s[p + 2 : p + k + 3]  # k drafts and the bonus
        lengths.append(k + 1)
        p += k + 1
        hit = stop.first_stop([], tokens, k + 1)
    return (lengths, tokens[: hit.length], hit.reason) if hit else (lengths, tokens, "context")


@torch.inference_mode()
def forced_chain(target: Target, net: Eagle3Model, prompt: torch.Tensor, continuation: list[int], depth: int,
                 stop: StopRule) -> ForcedChain:
    """The chain decode of `prompt` ([S] ids) replayed on the target's greedy `continuation` (at least
    stop.max_new_tokens + depth + 1 tokens, as `replay.references` gives): see the module."""
    if stop.stop_strings is not None:
        raise ValueError("forced_chain plays the EOS and length stops only: a stop string needs the decoded text")
    n_new = stop.max_new_tokens
    if len(continuation) < n_new + depth + 1:
        raise ValueError(f"the continuation has {len(continuation)} tokens; a chain of depth {depth} over "
                         f"{n_new} new tokens reads {n_new + depth + 1}")
    dev = net.fc.weight.device
    dtype = net.fc.weight.dtype
    seq = torch.cat([prompt.cpu(), torch.tensor(continuation)]).to(dev)  # [L]
    first = prompt.numel() - 1  # the first step's anchor: the last prompt feature with the first generated token
    n = seq.numel() - 2  # anchors whose step-0 label lies in seq
    to_target = net.to_target_ids(torch.arange(net.draft_vocab_size, device=dev))  # [Vd] draft id -> target id
    feats = target_features(target, seq, to_target)
    emb = torch.cat([feats.embeds[1:], feats.embeds.new_zeros(depth, feats.embeds.shape[-1])])[: n + depth - 1]
    rows = torch.arange(first, first + n_new, device=dev)  # [A] the anchors a decode of n_new tokens can reach
    outs = ttt_forward(net, feats.aux[None, :n].to(dtype), emb[None].to(dtype), depth, rows)  # depth x [1, *, H]
    ranked, truth = [], []
    for j, h in enumerate(outs):
        h = h[0, rows] if j == 0 else h[0]  # [A, H]; step 0 ran over every anchor
        logp = torch.log_softmax(net.logits(h).float(), dim=-1)  # [A, Vd], as Eagle3Drafter._top_k ranks
        ranked.append(to_target[torch.topk(logp, min(max(RECALL_AT), logp.shape[-1]), dim=-1).indices])  # [A, 10] best first
        truth.append(seq[rows + j + 2])  # [A] the token step j predicts
    s = seq.tolist()
    chain = [(r[:, 0] == t).tolist() for r, t in zip(ranked, truth)]  # [depth][A] the top-1 is the true token
    lengths, tokens, reason = _play(chain, s, prompt.numel(), depth, stop, target.max_context)
    within = [(r == t[:, None]).any(-1).tolist() for r, t in zip(ranked, truth)]  # ... one of the top 10 is
    wide, _, _ = _play(within, s, prompt.numel(), depth, stop, target.max_context)
    a = len(tokens)  # anchors first .. first + a - 1: those whose input token the loop emitted
    hits = torch.tensor([[int((r[:a, :at] == t[:a, None]).any(-1).sum()) for at in RECALL_AT]
                         for r, t in zip(ranked, truth)])  # [depth, len(RECALL_AT)]
    return ForcedChain(lengths, tokens, reason, hits, a, wide)


def forced_tau(target: Target, net: Eagle3Model, prompts, continuations, depth: int, max_new: int, eos_ids=(),
               log=None) -> dict:
    """`evaluate.tau_of`'s summary for the chain, from `forced_chain` over every prompt, with `recall`: for each
    r in RECALL_AT, the share of anchors per step whose true token is within the drafter's top r; and `wide`: the
    same summary, with [tokens, verifications] per prompt, for a tree of the chain's depth that holds every node's
    top 10 children (about 10^depth nodes), which no tree of those children and that depth beats at any anchor: what a
    bigger budget could still win with this drafter."""
    emitted = steps = anchors = 0
    hits = torch.zeros(depth, len(RECALL_AT), dtype=torch.long)
    wide = []
    t0 = time.perf_counter()
    for i, (p, cont) in enumerate(zip(prompts, continuations)):
        run = forced_chain(target, net, p, cont, depth, StopRule(max_new, tuple(eos_ids)))
        emitted += sum(run.accept_lengths)
        steps += len(run.accept_lengths)
        hits += run.hits
        anchors += run.anchors
        wide.append([sum(run.wide), len(run.wide)])
        if log is not None:
            log(i, sum(run.accept_lengths), len(run.accept_lengths))
    recall = {f"top{r}": [round(int(h) / max(anchors, 1), 4) for h in hits[:, c]] for c, r in enumerate(RECALL_AT)}
    w_tokens, w_steps = sum(t for t, _ in wide), sum(n for _, n in wide)
    return {"tau": emitted / max(steps, 1), "steps": steps, "tokens": emitted, "seconds": time.perf_counter() - t0,
            "recall": recall,
            "wide": {"tau": w_tokens / max(w_steps, 1), "steps": w_steps, "tokens": w_tokens, "per_prompt": wide}}
