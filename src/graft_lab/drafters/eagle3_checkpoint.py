"""Reading and writing the official EAGLE-3 checkpoint format, unchanged.

A checkpoint is a directory with `config.json` (a Llama config with `draft_vocab_size`, one hidden layer)
and `model.safetensors` or `pytorch_model.bin` holding `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t`, `t2d` and optionally `embed_tokens.weight`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from ..errors import ModelLoadError
from .eagle3_model import Eagle3Model

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "vocab_size", "draft_vocab_size", "max_position_embeddings", "attention_bias",
    "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id",
)


BUILTIN = "builtin:"
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "drafters"


def local_checkpoint(path: str) -> Path | None:
    """The directory of a `builtin:NAME` or local checkpoint, without touching the network; None for a hub id or
    a builtin name that is not shipped."""
    if path.startswith(BUILTIN):
        p = ASSETS / path.removeprefix(BUILTIN)
        return p if (p / "config.json").is_file() else None
    p = Path(path).expanduser()
    return p if p.is_dir() else None


def resolve_checkpoint(path: str) -> Path:
    """`builtin:NAME` (shipped with the package), a local directory, or a hub id fetched when reachable."""
    if (local := local_checkpoint(path)) is not None:
        return local
    if path.startswith(BUILTIN):
        known = sorted(d.name for d in ASSETS.iterdir()) if ASSETS.is_dir() else []
        raise ModelLoadError(f"no shipped drafter '{path}'; shipped: {', '.join(known) or 'none'}")
    if path.startswith(("/", "./", "../", "~")) or path.count("/") != 1:
        raise ModelLoadError(f"drafter checkpoint {path} does not exist")
    try:
        from huggingface_hub import snapshot_download

        from ..models.target import hub_reachable

        return Path(snapshot_download(path, allow_patterns=["config.json", "*.safetensors", "*.bin"],
                                      local_files_only=not hub_reachable()))
    except Exception as exc:  # the hub client raises many network/auth error types
        raise ModelLoadError(
            f"could not fetch the EAGLE-3 drafter '{path}' from the Hugging Face hub: {exc}\n"
            f"Download it where you have a network (huggingface-cli download {path} --local-dir DIR) and run "
            f"with drafter.path=DIR."
        ) from None


def read_state(ckpt: Path) -> dict[str, torch.Tensor]:
    if (ckpt / "model.safetensors").is_file():
        return load_file(str(ckpt / "model.safetensors"))
    if (ckpt / "pytorch_model.bin").is_file():
        return torch.load(ckpt / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{ckpt} has neither model.safetensors nor pytorch_model.bin")


def read_config(ckpt: Path) -> dict:
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{ckpt} has no config.json: not an EAGLE-3 checkpoint")
    return json.loads(cfg_path.read_text())


def aux_layers_from_config(cfg: dict) -> tuple[int, ...] | None:
    """Aux layers in `output_hidden_states` numbering, when the checkpoint records them
    (SpecForge's `eagle_config.eagle_aux_hidden_state_layer_ids` name decoder layers whose *output* is used)."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return tuple(i + 1 for i in ids) if ids else None


def load_eagle3(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> tuple[Eagle3Model, dict]:
    """Load a checkpoint; returns the model and its raw config dict."""
    ckpt = resolve_checkpoint(path)
    raw = read_config(ckpt)
    state = read_state(ckpt)
    if "fc.weight" not in state:
        raise ModelLoadError(f"{ckpt}: no 'fc.weight' key; keys found: {', '.join(sorted(state)[:8])} ...")
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "eagle_config")})
    config.num_hidden_layers = 1
    model = Eagle3Model(config, target_hidden_size=state["fc.weight"].shape[1] // 3,
                        with_embeddings="embed_tokens.weight" in state)
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k not in ("d2t", "t2d")]
    if missing or result.unexpected_keys:
        raise ModelLoadError(f"{ckpt} is not in the EAGLE-3 format: missing {missing}, unexpected {result.unexpected_keys}")
    if "d2t" not in state and model.draft_vocab_size != config.vocab_size:
        raise ModelLoadError(f"{ckpt}: draft vocabulary is reduced but the checkpoint has no d2t map")
    return model.to(device=device, dtype=dtype).eval(), raw


def save_eagle3(model: Eagle3Model, out_dir: str | Path, fmt: str = "safetensors",
                dtype: torch.dtype = torch.bfloat16, extra_config: dict | None = None) -> Path:
    """Write `model` in the official format (what `load_eagle3` and upstream EAGLE-3 code read)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    full = model.config.to_dict()
    cfg = {k: full[k] for k in CONFIG_KEYS if full.get(k) is not None}
    rope = full.get("rope_parameters") or {}
    cfg.update(
        architectures=[ARCHITECTURE], model_type="llama", num_hidden_layers=1,
        draft_vocab_size=model.draft_vocab_size, rope_theta=rope.get("rope_theta", 10000.0),
        torch_dtype=str(dtype).removeprefix("torch."), tie_word_embeddings=False,
    )
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    cfg.update(extra_config or {})
    state = {}
    for k, v in model.state_dict().items():
        state[k] = (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
    if fmt == "safetensors":
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    elif fmt == "bin":
        torch.save(state, out / "pytorch_model.bin")
    else:
        raise ValueError(f"unknown checkpoint format '{fmt}'; valid: safetensors, bin")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
