"""What makes every number traceable: the resolved config, its hash, the git commit, package versions.

The config hash covers what was measured: the config (less where results go), the method's name, the content
hash of the questions decoded, and that of a local or shipped drafter checkpoint, so a dataset file edited or a
drafter retrained under the same path is a new run."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .config import method_label

# Keys that say where results go or how they are logged, not what was measured.
NOT_HASHED = ("output_dir", "results_dir", "logger", "force", "tags", "hydra")


def resolved(cfg: DictConfig) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("hydra", None)
    return data


def drafter_hash(config: dict[str, Any]) -> str | None:
    """Content hash of the drafter checkpoint's files when `drafter.path` is `builtin:NAME` or a local directory;
    None otherwise (no drafter, or a hub id: the config names that one, and hashing it would need the network)."""
    from .drafters.eagle3_checkpoint import local_checkpoint

    path = (config.get("drafter") or {}).get("path")
    ckpt = local_checkpoint(path) if isinstance(path, str) else None
    files = sorted(ckpt.glob("*.safetensors")) + sorted(ckpt.glob("*.json")) if ckpt is not None else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def config_hash(config: dict[str, Any], dataset_hash: str | None = None) -> str:
    kept = {k: v for k, v in config.items() if k not in NOT_HASHED}
    kept.update(dataset_hash=dataset_hash, method=method_label(config), drafter_hash=drafter_hash(config))
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit(repo: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo or Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo or Path(__file__).parent,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("graft-lab", "torch", "transformers", "triton", "hydra-core", "wandb"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def metadata(cfg: DictConfig, dataset_hash: str | None = None) -> dict[str, Any]:
    config = resolved(cfg)
    return {"config": config, "config_hash": config_hash(config, dataset_hash), "dataset_hash": dataset_hash,
            "drafter_hash": drafter_hash(config),
            "method": method_label(config), "git_commit": git_commit(), "versions": versions()}
