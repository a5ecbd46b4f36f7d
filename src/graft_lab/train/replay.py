"""Replayed verification: a drafter's greedy tau without the target's tree forwards.

Under greedy decoding the tokens every method emits are the target's own greedy continuation, fixed before any
drafter is chosen. So a drafter's acceptance at each step depends only on (a) the target's features at the
committed positions and (b) whether its tree holds the continuation's next tokens. `ReplayTarget` plays the
target in the unchanged decode loop (`decode.generate`): it reads the greedy continuation (`references`, computed
once per prompt with plain 1-token forwards and cached on disk) and the target's features over prompt +
continuation (one causal forward per prompt), and answers each `verify` with them instead of a forward over the
tree. A tree node on the continuation gets a logit row whose argmax is the continuation's next token; any other
node is never reached by greedy acceptance, so its row does not matter. The loop's cost is then the drafter's.

It differs from a real decode only in the numerics of the features: one causal forward over the whole sequence
instead of the tree forwards that accepted each position (float rounding, no other difference), which can move
a drafter's top-k at a near-tie. `evaluate --replay` measures with it; `tests/test_replay.py` checks it against
the real loop step by step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..models.embedded import cache_root
from ..models.target import Target, TargetOutput
from ..tree import DraftTree

LOOKAHEAD = 16  # continuation tokens past max_new: a step that ends the turn may accept up to a tree's depth past it


@torch.inference_mode()
def greedy_continuation(target: Target, prompt: torch.Tensor, n: int) -> list[int]:
    """The target's n greedy next tokens after `prompt` ([S]), one 1-token forward each, as AR decoding computes
    them (an EOS does not stop it: a real step may verify past the EOS it accepts)."""
    cache = target.new_cache(prompt.numel() + n)
    logits = target.prefill(prompt.to(target.device), cache, want_aux=False).logits[-1]  # [V]
    tokens = []
    while True:
        tokens.append(int(logits.argmax()))
        if len(tokens) == n:
            return tokens
        pos = torch.tensor([cache.length], device=target.device)
        logits = target.forward(torch.tensor([tokens[-1]], device=target.device), pos, cache).logits[-1]


def reference_dir() -> Path:
    return cache_root() / "replay"


def weights_digest(model: torch.nn.Module, sample: int = 4096) -> str:
    """A digest of a strided sample (`sample` values) of every weight: a reference cached for other weights under
    the same name (a local checkpoint trained on) is not read back."""
    digest = hashlib.sha1()
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        digest.update(name.encode() + flat[:: max(1, flat.numel() // sample)].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def references(target: Target, name: str, prompts: list[torch.Tensor], max_new: int,
               cache: Path | None = None) -> list[list[int]]:
    """Each prompt's greedy continuation (max_new + LOOKAHEAD tokens), read from `cache` (default: replay/ under
    graft-lab's cache) where an earlier run wrote it for the same target `name`, weights, dtype and prompt, else
    computed and written there: a long run resumes where it stopped."""
    cache = cache or reference_dir()
    cache.mkdir(parents=True, exist_ok=True)
    n = max_new + LOOKAHEAD
    weights = weights_digest(target.model)
    out = []
    for p in tqdm(prompts, desc="greedy references", unit="prompt"):
        key = json.dumps([name, weights, str(target.dtype), p.tolist()])
        path = cache / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"
        try:
            tokens = json.loads(path.read_text())["tokens"]
        except (OSError, ValueError, KeyError):
            tokens = []
        if len(tokens) < n:
            tokens = greedy_continuation(target, p, n)
            path.write_text(json.dumps({"target": name, "dtype": str(target.dtype), "tokens": tokens}))
        out.append(tokens[:n])
    return out


@dataclass
class ReplayCache:
    """What a `ReplayTarget` knows of the sequence being decoded; `length` as a KV cache's."""

    max_len: int
    length: int = 0
    sequence: torch.Tensor | None = None  # [L] prompt + greedy continuation
    aux: torch.Tensor | None = None  # [L, F] the target's features over it, one causal forward


class ReplayTarget:
    """The decode loop's target for prompts whose greedy continuation is known (`references`); see the module."""

    def __init__(self, target: Target, prompts: list[torch.Tensor], continuations: list[list[int]]):
        self.target = target
        self.max_context = target.max_context
        self.vocab_size = target.vocab_size
        self._known = {tuple(p.tolist()): c for p, c in zip(prompts, continuations)}
        self._aux: dict[tuple, torch.Tensor] = {}  # features per prompt, kept for the next tree shape

    @property
    def device(self) -> torch.device:
        return self.target.device

    def new_cache(self, max_len: int) -> ReplayCache:
        return ReplayCache(max_len)

    def prefill(self, ids: torch.Tensor, cache: ReplayCache, want_aux: bool, successors: int = 0) -> TargetOutput:
        # ids: [S] prompt; logits: [1, V] whose argmax is the first continuation token
        key = tuple(ids.tolist())
        if key not in self._known:
            raise KeyError("ReplayTarget has no greedy continuation for this prompt: pass it to the constructor")
        if successors:
            raise ValueError("ReplayTarget serves drafter-only methods: a retriever's prefill successors need the real target")
        cache.sequence = torch.cat([ids.cpu(), torch.tensor(self._known[key])]).to(self.device)
        if want_aux and key not in self._aux:
            real = self.target.new_cache(cache.sequence.numel())
            self._aux[key] = self.target.prefill(cache.sequence, real, want_aux=True).aux  # [L, F]
        cache.aux = self._aux.get(key)
        cache.length = ids.numel()
        return TargetOutput(logits=self._one_hot(cache.sequence[ids.numel()].view(1)),
                            aux=cache.aux[: ids.numel()] if want_aux else None)

    def verify(self, tree: DraftTree, cache: ReplayCache, want_aux: bool) -> TargetOutput:
        # logits: [N, V], one-hot at the continuation's next token on the nodes that lie on it, zero elsewhere
        seq, start = cache.sequence, cache.length
        pos = tree.position_ids(start)  # [N] absolute position of each node
        if int(pos.max()) + 1 >= seq.numel():
            raise ValueError(f"the tree reaches position {int(pos.max()) + 1}, past the {seq.numel()}-token reference "
                             f"(LOOKAHEAD {LOOKAHEAD} is below the tree's depth {tree.max_depth})")
        if int(tree.tokens[0]) != int(seq[start]):
            raise ValueError("the root is not the continuation's token: the loop emitted a token the reference lacks")
        ok = tree.tokens == seq[pos]  # [N] the node's token is the continuation's at its position
        on = ~(tree.ancestor_mask & ~ok[None, :]).any(-1)  # [N] every node from the root to it is
        logits = self._one_hot(torch.where(on, seq[(pos + 1).clamp(max=seq.numel() - 1)], -1))
        aux = None
        if want_aux:
            aux = cache.aux.new_zeros(tree.size, cache.aux.shape[1])
            aux[on] = cache.aux[pos[on]]
        return TargetOutput(logits=logits, aux=aux)

    def _one_hot(self, nxt: torch.Tensor) -> torch.Tensor:
        # nxt: [N] the token each row's argmax must be, -1 for a row that greedy acceptance never reads (all zero)
        logits = torch.zeros(nxt.numel(), self.vocab_size, device=self.device)
        rows = (nxt >= 0).nonzero().squeeze(1)
        logits[rows, nxt[rows]] = 1.0
        return logits

    @staticmethod
    def commit(cache: ReplayCache, start: int, path: torch.Tensor) -> None:
        cache.length = start + path.numel()
