"""When a turn ends, decided per emitted token exactly as one-token-at-a-time decoding would decide it.

A speculative step emits several tokens at once, and EOS, `max_new_tokens` or a stop string may fall inside
them. `StopRule.first_stop` walks the step's tokens in order and returns the first length at which AR would
have stopped, so the loop cuts the step there and the output stays the target's own, token for token.

Stop strings use transformers' own `StopStringCriteria` (the rule `generate(stop_strings=...)` applies after
every token: a stop string that ends in the newest token, overlapping tokens and even the prompt), evaluated
at every end position of the step in one batched call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers.generation.stopping_criteria import StopStringCriteria

from .errors import ConfigError


class StopStrings:
    """transformers' stop-string rule for one tokenizer, asked at many end positions at once."""

    def __init__(self, tokenizer, strings: tuple[str, ...]):
        if not strings or any(not isinstance(s, str) or not s for s in strings):
            raise ConfigError(f"gen.stop_strings must be non-empty strings, got {list(strings)}")
        self.strings = tuple(strings)
        self.criteria = StopStringCriteria(tokenizer, list(strings))
        self.window = self.criteria.maximum_token_len  # at most one token per character
        self.pad = int(self.criteria.embedding_vec.size(0))  # out of vocabulary: clamped to a row that never matches

    def hits(self, ids: list[int], ends: range) -> list[bool]:
        """Whether a stop string completes at ids[:end] for each end in `ends` (ids: prompt + generated)."""
        rows = [ids[max(0, e - self.window): e] for e in ends]
        batch = torch.tensor([[self.pad] * (self.window - len(r)) + r for r in rows], dtype=torch.long)  # [E, W]
        return self.criteria(batch, None).tolist()


class Stop(NamedTuple):
    length: int  # generated tokens to keep, the stopping token included
    reason: str  # eos | length | stop_string


@dataclass
class StopRule:
    max_new_tokens: int = 128
    eos_ids: tuple[int, ...] = ()
    stop_strings: StopStrings | None = None

    def first_stop(self, prompt: list[int], tokens: list[int], n_new: int) -> Stop | None:
        """The first of the last `n_new` generated tokens after which AR would stop, or None."""
        first = len(tokens) - n_new + 1
        ends = range(first, len(tokens) + 1)  # candidate generated lengths, in order
        strings = self.stop_strings.hits(prompt + tokens, range(len(prompt) + first, len(prompt) + len(tokens) + 1)) \
            if self.stop_strings else [False] * n_new
        for end, string_hit in zip(ends, strings):
            if tokens[end - 1] in self.eos_ids:
                return Stop(end, "eos")
            if end >= self.max_new_tokens:
                return Stop(end, "length")
            if string_hit:
                return Stop(end, "stop_string")
        return None
