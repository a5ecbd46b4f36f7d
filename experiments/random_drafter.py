"""Write a random EAGLE-3 checkpoint for a random target, so drafter-based methods (dense, dyn_depth,
Graft) can run end to end before a trained drafter exists. Its acceptance is near zero: pipeline checks only.

    python experiments/random_drafter.py OUT_DIR ["random:llama?seed=0&hidden=64&layers=4"]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig

from graft_lab.drafters.eagle3_checkpoint import save_eagle3
from graft_lab.drafters.eagle3_model import Eagle3Model
from graft_lab.models.target import load_model

TINY = "random:llama?seed=0&hidden=64&layers=4"


def random_drafter(out: Path, target_path: str = TINY, seed: int = 0) -> Path:
    model, _ = load_model(target_path)
    c = model.config
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=2 * c.hidden_size,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      head_dim=c.hidden_size // c.num_attention_heads, max_position_embeddings=c.max_position_embeddings,
                      draft_vocab_size=c.vocab_size)
    net = Eagle3Model(cfg, target_hidden_size=c.hidden_size)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    return save_eagle3(net.eval(), out, dtype=torch.float32)


if __name__ == "__main__":
    print(random_drafter(Path(sys.argv[1]), *sys.argv[2:3]))
