"""The divergence audit: every greedy turn whose output differs from the same-dtype AR baseline is explained
by the numerics, or counted as unexplained.

In bf16 or fp16 a batched forward (a verified tree, a prefill) does not round like a 1-token forward, so a
speculative method can flip the target's argmax where its top two logits nearly tie. fp32 is the exact mode:
there every method equals AR, and any divergence is unexplained. After the run, `Auditor.summarise`:

1. measures the **noise bound**: the largest |logit difference| between a batched forward and the 1-token
   forwards over the same tokens, on the run's own prompts. The batched side prefills the prompt as the
   method does, then feeds the AR continuation as chains of K tokens (K: the method's budget), one forward
   per chain, each kept in the cache as an accepted path is; the 1-token side is the AR baseline's own
   forwards. It covers the first BOUND_TURNS turns (BOUND_TOKENS positions each) and every differing turn up
   to its divergence. These forwards get an explicit causal mask and positions, not DraftTree's, so a bug in
   the engine's tree code cannot widen the bound that is meant to excuse it.
2. replays each differing turn up to its first divergent position p:
   - AR: prefill + 1-token forwards over the common prefix: the baseline's very forwards, so its logits at p
     are the ones it decided on (the replay must pick the baseline's token, or the turn stays unexplained);
   - the method: prefill + one chain tree per recorded decoding step (the step's root and accepted tokens,
     from accept_lengths), through the engine's own DraftTree, Target.verify and Target.commit. The rejected
     nodes of each step's real tree are not recorded, so this forward batches the accepted path only; its
     top-2 gap is reported and not used in the verdict.
3. gives a verdict: a flip from AR's token a to the method's token b needs logit(a) - logit(b) (AR's margin;
   its top-2 gap when b was AR's runner-up) to change sign, and each logit moves by at most the bound, so a
   numeric flip needs margin <= 2 x bound: `numeric_tie`. Anything else is `unexplained`: a bug until shown
   otherwise. Only a and b's logits matter, so when b is among AR's TOP_BOUND_K best tokens at the divergence
   (a is AR's best) the bound is the tighter `noise_bound_top`: the largest deviation over each measured
   row's TOP_BOUND_K best reference tokens. The whole-vocabulary bound (about twice as loose) applies otherwise.

Turns identical to AR cost one list comparison; the replays run once, after the last turn.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from .decode import Generation, Method
from .models.target import Target
from .tree import DraftTree, Source

BOUND_TURNS = 3  # first turns whose AR continuation measures the noise bound
BOUND_TOKENS = 32  # positions measured per such turn
TOP_BOUND_K = 10  # reference tokens per row that the tighter bound, noise_bound_top, covers
TIE, UNEXPLAINED = "numeric_tie", "unexplained"


@dataclass(frozen=True)
class Turn:
    """What the audit keeps of one decoded turn."""

    question_id: int | str  # as in answers.jsonl
    turn: int
    prompt: torch.Tensor  # [S] prompt ids
    tokens: list[int]  # the method's output
    ar_tokens: list[int]  # the AR baseline's output
    accept_lengths: list[int]  # tokens emitted per decoding step of the method
    sampled: bool  # one of the first BOUND_TURNS turns: measures the noise bound


@dataclass(frozen=True)
class Divergence:
    question_id: int | str
    turn: int
    position: int  # index of the first generated token that differs (or where the shorter output ends)
    ar_token: int | None  # None: one output stops where the other goes on, no token flipped
    spec_token: int | None
    ar_gap: float | None  # AR's top-1 minus top-2 logit at `position`
    ar_margin: float | None  # AR's logit of ar_token minus that of spec_token (= ar_gap when spec_token is AR's #2)
    spec_gap: float | None  # top-1 minus top-2 logit of the method's replayed forward at `position`
    bound: float | None  # the noise bound the verdict used: noise_bound_top when spec_token is in AR's top TOP_BOUND_K
    verdict: str  # numeric_tie | unexplained


@dataclass(frozen=True)
class Deviation:
    """The largest |logit difference| between batched and 1-token forwards."""

    all: float  # over the whole vocabulary
    top: float  # over each row's TOP_BOUND_K best reference tokens

    def __or__(self, other: "Deviation") -> "Deviation":
        return Deviation(max(self.all, other.all), max(self.top, other.top))

    @staticmethod
    def of(out: torch.Tensor, reference: torch.Tensor) -> "Deviation":
        # out, reference: [R, V]
        diff = (out.float() - reference.float()).abs()  # [R, V]
        top = reference.topk(min(TOP_BOUND_K, reference.shape[-1]), dim=-1).indices  # [R, k]
        return Deviation(float(diff.max()), float(diff.gather(-1, top).max()))


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where the outputs differ, the shorter length if one is a prefix of the other, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(logits: torch.Tensor) -> float:
    # logits: [V]
    top = logits.topk(2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def ar_logits(target: Target, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """[len(tokens) + 1, V] the AR baseline's logits: prefill, then one 1-token forward per token (row i
    predicts generated token i), the same forwards as `generate` with a one-node tree."""
    dev = target.device
    cache = target.new_cache(prompt.numel() + len(tokens) + 1)
    rows = [target.prefill(prompt, cache, want_aux=False).logits[-1]]
    self_only = torch.ones(1, 1, dtype=torch.bool, device=dev)  # a one-node tree's ancestor mask
    for tok in tokens:
        pos = torch.tensor([cache.length], device=dev)
        rows.append(target.forward(torch.tensor([tok], device=dev), pos, cache, self_only).logits[0])
    return torch.stack(rows)


@torch.inference_mode()
def batched_deviation(target: Target, prompt: torch.Tensor, tokens: list[int], reference: torch.Tensor,
                      chain: int) -> Deviation:
    """Largest |logit difference| between `reference` (ar_logits over `tokens`) and the batched forwards over the
    same tokens: the prefill as the method runs it, then chains of `chain` tokens, one forward each."""
    # reference: [len(tokens) + 1, V]
    dev = target.device
    cache = target.new_cache(prompt.numel() + len(tokens) + 1)
    first = target.prefill(prompt, cache, want_aux=False).logits[-1]
    worst = Deviation.of(first[None], reference[:1])
    ids = torch.tensor(tokens, dtype=torch.long, device=dev)
    for s in range(0, len(tokens), chain):
        chunk = ids[s : s + chain]  # [c] inputs; their logits predict generated tokens s+1 .. s+c
        c = chunk.numel()
        pos = torch.arange(cache.length, cache.length + c, device=dev)
        causal = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
        out = target.forward(chunk, pos, cache, causal).logits  # [c, V]; the chain stays in the cache
        worst = worst | Deviation.of(out, reference[s + 1 : s + 1 + c])
    return worst


def chain_tree(tokens: list[int], device: torch.device) -> DraftTree:
    """A root followed by a single path: one decoding step's accepted nodes."""
    n = len(tokens)
    source = torch.full((n,), int(Source.DRAFT), dtype=torch.int8, device=device)
    source[0] = int(Source.ROOT)
    return DraftTree(torch.tensor(tokens, dtype=torch.long, device=device), torch.arange(-1, n - 1, device=device),
                     torch.arange(n, device=device), torch.zeros(n, device=device), source)


@torch.inference_mode()
def method_logits(target: Target, method: Method, prompt: torch.Tensor, tokens: list[int], accept_lengths: list[int],
                  p: int) -> torch.Tensor:
    """[V] the method's logits for generated token p, replayed through the engine's tree path: the prefill, then
    per decoding step a chain of its root and accepted tokens, verified and committed."""
    want_aux = method.drafter.needs_features
    cache = target.new_cache(prompt.numel() + p + max(accept_lengths, default=1) + 1)
    out = target.prefill(prompt, cache, want_aux, successors=method.retriever.prefill_top_k)
    if p == 0:
        return out.logits[-1]
    e = 1  # index of the first token the step emits; its root is tokens[e - 1]
    for a in accept_lengths:
        start = cache.length
        tree = chain_tree(tokens[e - 1 : e - 1 + a], target.device)
        logits = target.verify(tree, cache, want_aux).logits  # [a, V]: node d predicts tokens[e + d]
        if p < e + a:
            return logits[p - e]
        target.commit(cache, start, torch.arange(a, device=target.device))
        e += a
    raise ValueError(f"position {p} is past the {e} tokens the recorded steps emitted")


class Auditor:
    """Collects a run's greedy turns with their AR baseline; `summarise` explains the differing ones."""

    def __init__(self, target: Target, method: Method):
        self.target = target
        self.method = method
        self.n_turns = 0
        self.kept: list[Turn] = []  # the sampled turns and the differing ones
        self.n_sampled = 0

    def add(self, question_id, turn: int, prompt: torch.Tensor, gen: Generation, ar: Generation) -> None:
        """Record one greedy turn; an identical turn past the first BOUND_TURNS costs the comparison only."""
        self.n_turns += 1
        sampled = self.n_sampled < BOUND_TURNS
        if gen.tokens == ar.tokens and not sampled:
            return
        self.n_sampled += sampled
        self.kept.append(Turn(question_id, turn, prompt, list(gen.tokens), list(ar.tokens),
                              [s.accept_length for s in gen.steps], sampled))

    def summarise(self) -> dict:
        """summary.json's audit fields; all None when no greedy turn had an AR baseline."""
        if not self.n_turns:
            return {"match_share": None, "audited_turns": 0, "noise_bound": None, "noise_bound_top": None, "divergences": [],
                    "unexplained_divergences": None, "audit_time_s": 0.0}
        t0 = time.perf_counter()
        bound, pending = Deviation(0.0, 0.0), []
        differing = sum(t.tokens != t.ar_tokens for t in self.kept)
        for t in tqdm(self.kept, desc="audit", unit="turn", disable=not differing):
            p = first_divergence(t.tokens, t.ar_tokens)
            flip = p is not None and p < min(len(t.tokens), len(t.ar_tokens))
            n = max(min(len(t.ar_tokens), BOUND_TOKENS) if t.sampled else 0, p if flip else 0)
            ref = ar_logits(self.target, t.prompt, t.ar_tokens[:n])  # [n + 1, V]
            bound = bound | batched_deviation(self.target, t.prompt, t.ar_tokens[:n], ref, self.method.budget)
            if p is not None:
                pending.append((t, p, ref[p] if flip else None))
        divergences = [self.explain(t, p, row, bound) for t, p, row in pending]
        return {
            "match_share": (self.n_turns - differing) / self.n_turns,
            "audited_turns": self.n_turns,
            "noise_bound": bound.all,
            "noise_bound_top": bound.top,
            "divergences": [asdict(d) for d in divergences],
            "unexplained_divergences": sum(d.verdict == UNEXPLAINED for d in divergences),
            "audit_time_s": time.perf_counter() - t0,
        }

    def explain(self, t: Turn, p: int, ar_row: torch.Tensor | None, bound: Deviation) -> Divergence:
        # ar_row: [V] AR's logits for generated token p, None when no token flipped there
        if ar_row is None:
            return Divergence(t.question_id, t.turn, p, None, None, None, None, None, None, UNEXPLAINED)
        a, b = t.ar_tokens[p], t.tokens[p]
        margin = float(ar_row[a] - ar_row[b])
        faithful = int(ar_row.argmax()) == a  # the replay decided as the baseline did
        near = b in ar_row.topk(min(TOP_BOUND_K, ar_row.numel())).indices.tolist()  # only a's and b's logits matter
        applied = bound.top if near else bound.all
        spec_gap = top2_gap(method_logits(self.target, self.method, t.prompt, t.tokens, t.accept_lengths, p))
        verdict = TIE if faithful and margin <= 2 * applied else UNEXPLAINED
        return Divergence(t.question_id, t.turn, p, a, b, top2_gap(ar_row), margin, spec_gap, applied, verdict)
