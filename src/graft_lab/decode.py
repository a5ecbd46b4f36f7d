"""The decode loop: draft -> retrieve -> graft -> verify -> accept -> commit, one screen long.

Every method (AR, dense EAGLE-3, pruned, grafted, any retriever) is this loop with other parts; AR is
the case where the tree is the root alone. Output is the target's own, token for token (greedy) or in
distribution (sampling), because only `verify.accept` decides what is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .drafters.base import DraftInput, Drafter
from .errors import ContextLimitError
from .graft import Graft
from .metrics import PhaseTimer, StepRecord
from .models.target import Target
from .pruners.base import Pruner
from .retrievers.base import Retriever
from .verify import SamplingParams, accept, check_finite, target_probs


@dataclass
class Method:
    """The parts that make one decoding method; `budget` is K, the verified nodes per step (root included)."""

    drafter: Drafter
    pruner: Pruner
    retriever: Retriever
    graft: Graft
    budget: int


@dataclass
class StopRule:
    max_new_tokens: int = 128
    eos_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


@dataclass
class Generation:
    tokens: list[int]  # generated ids, EOS included when it ended the turn
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    stop_reason: str = "length"


def first_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    # logits: [V] at the last prompt position
    check_finite(logits, "the target's logits at the last prompt position (step 0)")
    if params.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits[None], params)[0], 1, generator=generator))


@torch.inference_mode()
def generate(
    target: Target,
    method: Method,
    prompt: torch.Tensor,
    params: SamplingParams,
    stop: StopRule,
    generator: torch.Generator | None = None,
    decode_text=None,
) -> Generation:
    """Generate from `prompt` ([S] ids) until a stop rule fires. `decode_text(ids) -> str` enables stop strings."""
    if prompt.numel() + 1 > target.max_context:
        raise ContextLimitError(f"the prompt has {prompt.numel()} tokens; the target's context is {target.max_context}")
    limit = min(prompt.numel() + stop.max_new_tokens + method.budget, target.max_context)
    cache = target.new_cache(limit)  # KV: [B, H, limit, D] per layer, compacted in place each step
    method.drafter.reset(limit)
    timer = PhaseTimer(target.device)
    want_aux = method.drafter.needs_features
    with timer.phase("prefill"):
        out = target.prefill(prompt, cache, want_aux, all_logits=method.retriever.needs_prefill_logits)
        method.retriever.reset(prompt, out.logits if method.retriever.needs_prefill_logits else None)
        root = first_token(out.logits[-1], params, generator)
        method.retriever.extend(prompt.new_tensor([root]))
    gen = Generation(tokens=[root], prefill_s=timer.total("prefill"))
    pairs = DraftInput(out.aux, torch.cat([prompt[1:], prompt.new_tensor([root])]), start=0)
    while (reason := stop_reason(gen.tokens, len(pairs.next_tokens), stop, decode_text, cache.length + method.budget, limit)) is None:
        timer.reset()
        start = cache.length  # position of the root
        with timer.phase("draft"):
            draft = method.drafter.draft(pairs, method.budget, method.pruner)
        with timer.phase("retrieve"):
            retrieved = method.retriever.retrieve(method.budget)  # over-retrieve: grafting folds duplicates, then cuts to K
        with timer.phase("graft"):
            tree = method.graft(draft, retrieved, method.budget)  # DraftTree, at most K nodes
        with timer.phase("verify"):
            out = target.verify(tree, cache, want_aux)  # logits: [N, V], aux: [N, 3H]
        check_finite(out.logits, f"the target's logits at decode step {len(gen.steps) + 1}")
        with timer.phase("accept"):
            acc = accept(tree, out.logits, params, generator)  # path: [M] node ids, root first
        new = torch.cat([tree.tokens[acc.path[1:]], tree.tokens.new_tensor([acc.bonus])])  # [M] emitted
        with timer.phase("update"):
            target.commit(cache, start, acc.path)
            method.retriever.observe(tree, out.logits)
            method.retriever.extend(new)
        pairs = DraftInput(out.aux[acc.path] if want_aux else None, new, start=start)
        gen.tokens.extend(new.tolist())
        gen.steps.append(StepRecord.of(tree, acc.path, timer))
    gen.stop_reason = reason
    gen.tokens = truncate(gen.tokens, stop)
    return gen


def stop_reason(tokens: list[int], n_new: int, stop: StopRule, decode_text, needed: int, limit: int) -> str | None:
    """Why generation ends now, or None; `n_new` is how many tokens the last step emitted."""
    if any(t in stop.eos_ids for t in tokens[-n_new:]):
        return "eos"
    if len(tokens) >= stop.max_new_tokens:
        return "length"
    if stop.stop_strings and decode_text is not None:
        tail = decode_text(tokens[-64:])
        if any(s in tail for s in stop.stop_strings):
            return "stop_string"
    if needed > limit:
        return "context"
    return None


def truncate(tokens: list[int], stop: StopRule) -> list[int]:
    """Drop anything past the first EOS (kept) and past max_new_tokens: a step may overshoot both."""
    for i, t in enumerate(tokens):
        if t in stop.eos_ids:
            tokens = tokens[: i + 1]
            break
    return tokens[: stop.max_new_tokens]

