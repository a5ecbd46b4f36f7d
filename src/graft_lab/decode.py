"""The decode loop: draft -> retrieve -> graft -> plan -> verify -> accept -> commit, one screen long.

Every method (AR, dense EAGLE-3, pruned, grafted, any retriever) is this loop with other parts; AR is
the case where the tree is the root alone. The plan stage passes a fixed tree through, or (tree=auto)
keeps the nodes worth verifying on this machine. Output is the target's own, token for token (greedy) or in
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
from .planner import FixedPlanner, Planner
from .pruners.base import Pruner
from .retrievers.base import Retriever
from .stopping import StopRule
from .verify import SamplingParams, accept, check_finite, target_probs


@dataclass
class Method:
    """The parts that make one decoding method; `budget` is K, the verified nodes per step (root included),
    a cap when the planner chooses (tree=auto)."""

    drafter: Drafter
    pruner: Pruner
    retriever: Retriever
    graft: Graft
    budget: int
    planner: Planner = field(default_factory=FixedPlanner)


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
) -> Generation:
    """Generate from `prompt` ([S] ids) until a stop rule fires; a step that overshoots one is cut where AR stops."""
    if prompt.numel() + 1 > target.max_context:
        raise ContextLimitError(f"the prompt has {prompt.numel()} tokens; the target's context is {target.max_context}")
    limit = min(prompt.numel() + stop.max_new_tokens + method.budget, target.max_context)
    cache = target.new_cache(limit)  # KV: [B, H, limit, D] per layer, compacted in place each step
    method.drafter.reset(limit)
    timer = PhaseTimer(target.device)
    want_aux = method.drafter.needs_features
    with timer.phase("prefill"):
        out = target.prefill(prompt, cache, want_aux, successors=method.retriever.prefill_top_k)
        method.retriever.reset(prompt, out.successors)
        root = first_token(out.logits[-1], params, generator)
        method.retriever.extend(prompt.new_tensor([root]))
    gen = Generation(tokens=[root], prefill_s=timer.total("prefill"))
    context = prompt.tolist() if stop.stop_strings else []  # a stop string may start inside the prompt
    pairs = DraftInput(out.aux, torch.cat([prompt[1:], prompt.new_tensor([root])]), start=0)
    hit = stop.first_stop(context, gen.tokens, 1)
    while hit is None and cache.length + method.budget <= limit:
        timer.reset()
        start = cache.length  # position of the root
        with timer.phase("draft"):
            draft = method.drafter.draft(pairs, method.budget, method.pruner)
        with timer.phase("retrieve"):
            retrieved = method.retriever.retrieve(method.budget)  # over-retrieve: grafting folds duplicates, then cuts to K
        with timer.phase("graft"):
            tree = method.graft(draft, retrieved, method.budget)  # DraftTree, at most K nodes
        with timer.phase("plan"):
            plan = method.planner.plan(tree, start, timer.elapsed())  # tree=auto: the best N <= K; else as is
        tree = plan.tree
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
        with timer.phase("plan"):
            method.planner.observe(plan, acc.path, timer.times)  # calibrate acceptance and step cost
        pairs = DraftInput(out.aux[acc.path] if want_aux else None, new, start=start)
        gen.tokens.extend(new.tolist())
        gen.steps.append(StepRecord.of(tree, acc.path, timer, plan))
        hit = stop.first_stop(context, gen.tokens, new.numel())  # EOS, length or a stop string inside the step
    gen.tokens, gen.stop_reason = (gen.tokens[: hit.length], hit.reason) if hit else (gen.tokens, "context")
    return gen
