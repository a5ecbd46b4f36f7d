"""Seeded tiny random targets and EAGLE-3 drafters, for fast losslessness tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from graft_lab.drafters.eagle3_checkpoint import save_eagle3
from graft_lab.drafters.eagle3_model import Eagle3Model
from graft_lab.models.target import Target

VOCAB = 96
ARCHS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def tiny_config(arch: str = "llama", vocab: int = VOCAB, layers: int = 4):
    return ARCHS[arch](
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def tiny_model(arch: str = "llama", seed: int = 0, vocab: int = VOCAB):
    """A random model whose logits are peaked enough that argmax is never a near-tie."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    return model.eval()


def tiny_target(arch: str = "llama", seed: int = 0, vocab: int = VOCAB) -> Target:
    return Target(tiny_model(arch, seed, vocab), tokenizer=None, aux_layers=(1, 2, 3))


def tiny_eagle3(target: Target, draft_vocab: int | None = None, seed: int = 0) -> Eagle3Model:
    """A random EAGLE-3 network for `target`; a reduced draft vocabulary gets a random d2t map."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        draft_vocab_size=draft_vocab or target.vocab_size,
    )
    net = Eagle3Model(cfg, target_hidden_size=target.hidden_size)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
        if draft_vocab and draft_vocab < target.vocab_size:
            keep = torch.sort(torch.randperm(target.vocab_size)[:draft_vocab]).values
            net.d2t.copy_(keep - torch.arange(draft_vocab))
            net.t2d.zero_()
            net.t2d[keep] = True
    return net.eval()


def write_eagle3(target: Target, out: Path, draft_vocab: int | None = None, seed: int = 0, fmt: str = "safetensors") -> Path:
    return save_eagle3(tiny_eagle3(target, draft_vocab, seed), out, fmt=fmt, dtype=torch.float32)


def hf_greedy(model, prompt: torch.Tensor, max_new_tokens: int, eos: int | None = None) -> list[int]:
    """The reference: transformers' own greedy decoding."""
    out = model.generate(
        prompt[None], max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0,
        attention_mask=torch.ones_like(prompt[None]),
    )
    return out[0, prompt.numel():].tolist()


_TARGETS: dict[str, Target] = {}


def shared_tiny_target(arch: str) -> Target:
    """One tiny target per architecture for a whole test session (seeded by its place in ARCHS)."""
    if arch not in _TARGETS:
        _TARGETS[arch] = tiny_target(arch, seed=list(ARCHS).index(arch))
    return _TARGETS[arch]


def repetitive_prompt(rng) -> torch.Tensor:
    """A random phrase repeated with edits: n-gram, suffix and recycled matches all occur."""
    phrase = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 8))]
    out = [rng.randrange(3, VOCAB) for _ in range(rng.randint(0, 4))]
    for _ in range(rng.randint(1, 4)):
        out += [t if rng.random() > 0.2 else rng.randrange(3, VOCAB) for t in phrase]
    return torch.tensor(out)
