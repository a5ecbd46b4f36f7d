"""Stop strings inside multi-token steps: every method stops exactly where transformers' `generate(stop_strings=...)`
stops, token for token, also when the stop string is completed in the middle of an accepted step.

Tiny random targets with the real SmolLM2 tokenizer (byte-level BPE, so stop strings span token boundaries),
an oracle retriever that proposes the true continuation (long accepted steps), and stop strings cut at random
from the target's own continuation: inside one token, across several, and across the end of the prompt."""

from __future__ import annotations

import random

import pytest
import torch

from graft_lab.decode import Method, generate
from graft_lab.drafters.none import NoDrafter
from graft_lab.errors import ConfigError
from graft_lab.graft import graft_root
from graft_lab.models.random_model import load_random
from graft_lab.models.target import Target
from graft_lab.pruners import NoPruner
from graft_lab.retrievers import NoRetriever
from graft_lab.stopping import StopRule, StopStrings
from graft_lab.verify import SamplingParams
from oracle import OracleRetriever

NEW = 40
TARGETS: dict[str, Target] = {}


def target_for(arch: str) -> Target:
    if arch not in TARGETS:
        model, tok = load_random(f"random:{arch}?seed=1&hidden=64&layers=4", torch.float32, "cpu")
        TARGETS[arch] = Target(model, tok)
    return TARGETS[arch]


def hf_reference(target: Target, prompt: torch.Tensor, strings: list[str] | None) -> list[int]:
    out = target.model.generate(
        prompt[None], max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt[None]),
        eos_token_id=target.tokenizer.eos_token_id, pad_token_id=0, stop_strings=strings, tokenizer=target.tokenizer,
    )
    return out[0, prompt.numel():].tolist()


def pick_stop_strings(rng: random.Random, tok, prompt: list[int], free: list[int]) -> list[str]:
    """1 to 3 printable substrings of the continuation's text (or of the prompt's tail joined to it)."""
    text = tok.decode(free[rng.randint(0, len(free) // 2):])
    if rng.random() < 0.25:  # a stop string that starts in the prompt
        text = tok.decode(prompt[-2:] + free[:3])
    spans = []
    for _ in range(rng.randint(1, 3)):
        n = rng.randint(1, 8)
        i = rng.randint(0, max(0, len(text) - n))
        s = text[i:i + n]
        if s and s.isprintable() and "\ufffd" not in s:
            spans.append(s)
    return spans or [text[:1] or "e"]


def oracle_method(free: list[int], vocab: int, rng: random.Random) -> Method:
    oracle = OracleRetriever(free, vocab, seed=rng.randrange(1000), error_rate=rng.choice([0.0, 0.1, 0.3]), branch=1)
    return Method(NoDrafter(), NoPruner(), oracle, graft_root, budget=rng.randint(4, 24))


def case(arch: str, seed: int):
    """A random prompt, its free continuation, stop strings cut from it, and generate()'s output with them."""
    rng = random.Random(seed * 7 + len(arch))
    target = target_for(arch)
    tok = target.tokenizer
    prompt = torch.tensor([rng.randrange(100, 20000) for _ in range(rng.randint(2, 16))])
    free = hf_reference(target, prompt, None)
    strings = pick_stop_strings(rng, tok, prompt.tolist(), free)
    ref = hf_reference(target, prompt, strings)
    return target, prompt, free, strings, ref, StopRule(NEW, (tok.eos_token_id,), StopStrings(tok, tuple(strings))), rng


CASES = [(arch, seed) for arch in ("llama", "qwen2", "qwen3") for seed in range(6)]


@pytest.mark.parametrize("arch,seed", CASES)
def test_stop_strings_cut_inside_an_accepted_step(arch, seed):
    target, prompt, free, strings, ref, stop, rng = case(arch, seed)
    ar = generate(target, Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, 1), prompt, SamplingParams(), stop)
    spec = generate(target, oracle_method(free, target.vocab_size, rng), prompt, SamplingParams(), stop)
    assert ar.tokens == ref, strings
    assert spec.tokens == ref, strings
    if len(ref) < len(free):
        assert spec.stop_reason == ar.stop_reason == "stop_string"


def test_the_stop_string_check_can_fail(monkeypatch):
    """Checking stop strings only after a step's last token (the old behaviour) must break equality somewhere."""
    def last_token_only(self, prompt, tokens, n_new):
        hit = original(self, prompt, tokens, 1)
        return hit if hit is None or hit.reason != "stop_string" else hit._replace(length=len(tokens))

    original = StopRule.first_stop
    broken = 0
    for arch, seed in CASES[::2]:
        target, prompt, free, strings, ref, stop, rng = case(arch, seed)
        monkeypatch.setattr(StopRule, "first_stop", last_token_only)
        out = generate(target, oracle_method(free, target.vocab_size, rng), prompt, SamplingParams(), stop)
        monkeypatch.setattr(StopRule, "first_stop", original)
        broken += out.tokens != ref
    assert broken >= 3


def test_first_stop_orders_eos_length_and_strings():
    tok = target_for("llama").tokenizer
    ids = tok.encode("one two three four")
    rule = StopRule(max_new_tokens=10, eos_ids=(ids[2],), stop_strings=StopStrings(tok, (" two",)))
    assert rule.first_stop([], ids, len(ids)) == (2, "stop_string")  # " two" completes with the second token
    assert StopRule(10, (ids[1],), rule.stop_strings).first_stop([], ids, len(ids)) == (2, "eos")  # EOS wins a tie
    assert StopRule(1, (), rule.stop_strings).first_stop([], ids, len(ids)) == (1, "length")
    assert rule.first_stop([], ids[:1], 1) is None


@pytest.mark.parametrize("bad", [("",), ("ok", "")])
def test_empty_stop_string_is_rejected(bad):
    with pytest.raises(ConfigError, match="stop_strings"):
        StopStrings(target_for("llama").tokenizer, bad)
