"""Where a run's weights are, found without loading them: so a run that cannot start says so (every
missing checkpoint at once, with how to get it) before minutes of loading, and so checks that need the
model's config (vocabulary, context) and datasets that need its tokenizer can run early."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from .drafters.eagle3_checkpoint import BUILTIN, resolve_checkpoint
from .errors import ModelLoadError
from .models.embedded import embedded_dir, gguf_path
from .models.random_model import PREFIX as RANDOM
from .models.random_model import random_config, random_tokenizer
from .models.target import EMBEDDED, hub_reachable, resolve_source

TARGET, DRAFTER = "target model", "EAGLE-3 drafter"


@dataclass(frozen=True)
class Weights:
    role: str  # TARGET or DRAFTER
    path: str  # as configured
    key: str  # the config field that sets it

    @property
    def is_hub_id(self) -> bool:
        p = self.path
        special = p.startswith((RANDOM, BUILTIN)) or p == EMBEDDED
        looks_local = p.startswith(("/", "./", "../", "~")) or p.count("/") != 1
        return not special and not looks_local and not Path(p).expanduser().exists()


def hub_cached(repo_id: str) -> bool:
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def broken_safetensors(folder: Path) -> str | None:
    """Why a *.safetensors file in `folder` cannot be read (a truncated download), or None."""
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            return f"{f} is unreadable ({exc}): a truncated or corrupt download?"
    return None


def local_dir_problem(w: Weights, folder: Path) -> str | None:
    """A local checkpoint directory: whole weight files, a readable config, and a tokenizer for a target."""
    if problem := broken_safetensors(folder):
        return problem
    if w.role == DRAFTER:
        return None
    try:
        AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        return f"{folder}/config.json is unreadable ({str(exc).splitlines()[0]})"
    try:
        AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError):
        return f"{folder} has no usable tokenizer (tokenizer.json, tokenizer_config.json missing or broken)"
    return None


def local_problem(w: Weights) -> str | None:
    """Why weights that need no network are unusable, or None."""
    if w.path.startswith(RANDOM):
        return None
    try:
        if w.path == EMBEDDED:
            gguf_path()
            return None
        if w.role == DRAFTER:
            folder = resolve_checkpoint(w.path)
        else:
            folder = Path(resolve_source(w.path)[0])
    except ModelLoadError as exc:
        return str(exc)
    return local_dir_problem(w, folder) if folder.is_dir() else None


def check_weights(needed: list[Weights]) -> None:
    """Raise ModelLoadError naming every checkpoint that is neither local, cached nor downloadable."""
    problems = [f"  {w.role} ({w.key}={w.path}): {p}" for w in needed if not w.is_hub_id and (p := local_problem(w))]
    remote = [w for w in needed if w.is_hub_id and not hub_cached(w.path)]
    if remote and not hub_reachable():
        for w in remote:
            local = f"models/{w.path.split('/')[-1]}"
            problems.append(
                f"  {w.role} '{w.path}' is not in the Hugging Face cache and the hub is unreachable: run "
                f"`hf download {w.path} --local-dir {local}` where you have a network, then add {w.key}={local}"
            )
    if len(problems) == 1:
        raise ModelLoadError(f"missing weights, nothing was loaded: {problems[0].strip()}")
    if problems:
        raise ModelLoadError("missing weights, nothing was loaded:\n" + "\n".join(problems))


def model_config(path: str) -> PretrainedConfig | None:
    """The target's config without its weights; None for a hub model not in the cache."""
    if path.startswith(RANDOM):
        return random_config(path)
    if path == EMBEDDED:
        return AutoConfig.from_pretrained(embedded_dir())
    try:
        return AutoConfig.from_pretrained(resolve_source(path)[0], local_files_only=True)
    except (OSError, ValueError):
        return None


def local_tokenizer(path: str):
    """The target's tokenizer when it is on disk (random, embedded, a local dir, the hub cache), else None."""
    try:
        if path.startswith(RANDOM):
            return random_tokenizer()
        return AutoTokenizer.from_pretrained(resolve_source(path)[0], local_files_only=True)
    except (OSError, ValueError, TypeError, ModelLoadError):
        return None


def model_tokenizer(path: str):
    """The target's tokenizer (datasets measured in tokens need it before the model loads)."""
    if path.startswith(RANDOM):
        return random_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(resolve_source(path)[0])
    except OSError as exc:
        raise ModelLoadError(f"could not load the tokenizer of '{path}': {exc}") from None
