"""The official EAGLE-3 checkpoint format: exact keys and shapes, d2t/t2d, .bin and .safetensors, and
clear errors for a drafter built for another target."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from graft_lab.drafters import DRAFTERS
from graft_lab.drafters.eagle3_checkpoint import load_eagle3, save_eagle3
from graft_lab.errors import DrafterMismatchError, ModelLoadError
from tiny import tiny_eagle3, tiny_target

H, V, DV = 64, 96, 40
OFFICIAL_KEYS = {
    "fc.weight": (H, 3 * H),
    "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,),
    "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (4 * 16, 2 * H),
    "midlayer.self_attn.k_proj.weight": (2 * 16, 2 * H),
    "midlayer.self_attn.v_proj.weight": (2 * 16, 2 * H),
    "midlayer.self_attn.o_proj.weight": (H, 4 * 16),
    "midlayer.mlp.gate_proj.weight": (96, H),
    "midlayer.mlp.up_proj.weight": (96, H),
    "midlayer.mlp.down_proj.weight": (H, 96),
    "norm.weight": (H,),
    "lm_head.weight": (DV, H),
    "d2t": (DV,),
    "t2d": (V,),
}


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_round_trip_exact_keys_shapes_and_vocab_maps(tmp_path, target, fmt):
    net = tiny_eagle3(target, draft_vocab=DV, seed=1)
    save_eagle3(net, tmp_path, fmt=fmt, dtype=torch.float32)
    state = load_file(tmp_path / "model.safetensors") if fmt == "safetensors" else torch.load(
        tmp_path / "pytorch_model.bin", weights_only=True)
    assert {k: tuple(v.shape) for k, v in state.items()} == OFFICIAL_KEYS
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == DV and config["vocab_size"] == V and config["num_hidden_layers"] == 1
    loaded, _ = load_eagle3(str(tmp_path))
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # d2t maps draft id d to target id d + d2t[d]; t2d marks exactly those target ids
    target_ids = loaded.to_target_ids(torch.arange(DV))
    assert torch.equal(torch.nonzero(loaded.t2d).squeeze(1), torch.sort(target_ids).values)


def test_official_layout_written_by_hand_loads(tmp_path, target):
    """A checkpoint written key by key as upstream EAGLE-3 training does (fp16 .bin, no embed_tokens)."""
    torch.manual_seed(0)
    state = {k: torch.randn(s).half() for k, s in OFFICIAL_KEYS.items() if k not in ("d2t", "t2d")}
    keep = torch.arange(0, 2 * DV, 2)
    state["d2t"] = keep - torch.arange(DV)
    state["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, keep, True)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "vocab_size": V, "draft_vocab_size": DV, "rope_theta": 10000.0,
        "max_position_embeddings": 512, "torch_dtype": "float16", "tie_word_embeddings": False,
    }))
    drafter = DRAFTERS.build({"name": "eagle3", "path": str(tmp_path), "depth": 3, "top_k": 4}, target=target)
    assert torch.equal(drafter.net.to_target_ids(torch.arange(DV)), keep)
    assert drafter.net.fc.weight.dtype == target.dtype


def test_drafter_for_another_target_is_rejected(tmp_path, target):
    other = tiny_target("llama", vocab=128)
    save_eagle3(tiny_eagle3(other, draft_vocab=DV), tmp_path, dtype=torch.float32)
    with pytest.raises(DrafterMismatchError, match="vocabulary"):
        DRAFTERS.build({"name": "eagle3", "path": str(tmp_path)}, target=target)


def test_hidden_size_mismatch_is_rejected(tmp_path, target):
    net = tiny_eagle3(target, draft_vocab=DV)
    net.fc = torch.nn.Linear(3 * 32, H, bias=False)
    save_eagle3(net, tmp_path, dtype=torch.float32)
    with pytest.raises(DrafterMismatchError, match="hidden size"):
        DRAFTERS.build({"name": "eagle3", "path": str(tmp_path)}, target=target)


def test_missing_and_malformed_checkpoints(tmp_path, target):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_eagle3(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="neither"):
        load_eagle3(str(tmp_path))
    with pytest.raises(ModelLoadError, match="no shipped drafter"):
        load_eagle3("builtin:does-not-exist")
