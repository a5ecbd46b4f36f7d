"""Seeded tiny random targets, built offline from a path like `random:llama?seed=0&hidden=64&layers=4`.

They exist so that the whole pipeline (chat template, decode loop, results table, sweeps) can be tested
in seconds: the embedded SmolLM2 tokenizer supplies the vocabulary and chat template, the weights are
random but peaked enough that greedy argmax is never a near-tie. `random_model` builds one without a
tokenizer, at any shape (benchmarks/gpu_check.py times 8B shapes), drawing the weights on the device in
the dtype asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from urllib.parse import parse_qsl, urlsplit

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from ..errors import ModelLoadError
from .embedded import embedded_dir

PREFIX = "random:"


@dataclass(frozen=True)
class RandomSpec:
    arch: str = "llama"  # any transformers model_type with a causal-LM head
    seed: int = 0
    vocab: int | None = None  # default: the tokenizer's size
    hidden: int = 64
    layers: int = 4  # >= 4: the default EAGLE-3 aux layers (2, L//2, L-3) must exist
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None  # MLP width; default 2 * hidden
    head_dim: int | None = None  # default hidden // heads
    ctx: int = 4096  # max_position_embeddings
    std: float = 0.15  # init scale of every matrix: peaked logits, no argmax near-ties

    @staticmethod
    def parse(path: str) -> "RandomSpec":
        parts = urlsplit(path.removeprefix(PREFIX))
        known = {f.name: f.type for f in fields(RandomSpec)}
        kwargs: dict = {"arch": parts.path or "llama"}
        for key, value in parse_qsl(parts.query):
            if key not in known:
                raise ModelLoadError(f"unknown option '{key}' in model path '{path}'; valid: {', '.join(known)}")
            cast = float if key == "std" else int
            try:
                kwargs[key] = cast(value)
            except ValueError:
                raise ModelLoadError(f"model path '{path}': {key}={value} is not a number") from None
        return RandomSpec(**kwargs)

    def config(self, tokenizer=None) -> PretrainedConfig:
        """The transformers config; without a tokenizer, `vocab` must be given (and no special tokens are set)."""
        if tokenizer is None and self.vocab is None:
            raise ModelLoadError("random model without a tokenizer needs vocab=N")
        vocab = self.vocab or len(tokenizer)
        if tokenizer is not None and vocab < len(tokenizer):
            raise ModelLoadError(f"random model vocab={vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
        special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad")}
        try:
            return AutoConfig.for_model(
                self.arch, vocab_size=vocab, hidden_size=self.hidden,
                intermediate_size=self.intermediate or 2 * self.hidden, num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                head_dim=self.head_dim or self.hidden // self.heads, max_position_embeddings=self.ctx,
                tie_word_embeddings=False, **special,
            )
        except ValueError as exc:
            raise ModelLoadError(f"random model: {exc}") from None


def random_tokenizer():
    """The embedded SmolLM2 tokenizer (49152 tokens, ChatML template)."""
    return AutoTokenizer.from_pretrained(embedded_dir())


def random_config(path: str) -> PretrainedConfig:
    """The config of `random:...` without building weights (for validation)."""
    return RandomSpec.parse(path).config(random_tokenizer())


def random_model(spec: RandomSpec, dtype: torch.dtype, device: torch.device | str, tokenizer=None):
    """The seeded model, built on `device` in `dtype` directly: an 8B shape initialises in seconds on a GPU,
    with no float32 copy on the host."""
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(spec.config(tokenizer), dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, spec.std)
    if tokenizer is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def load_random(path: str, dtype: torch.dtype, device: str):
    spec = RandomSpec.parse(path)
    tokenizer = random_tokenizer()
    return random_model(spec, dtype, device, tokenizer), tokenizer
