"""The target model: loading from a hub id, a local directory or the embedded GGUF, and the two forwards
speculative decoding needs (prefill, tree verification) over a `TreeKVCache`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..errors import DecodingError, ModelLoadError
from ..tree import DraftTree
from .cache import TreeKVCache
from .embedded import embedded_dir
from .random_model import PREFIX as RANDOM
from .random_model import load_random

EMBEDDED = "embedded:smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


SUCCESSOR_CHUNK = 256  # positions per lm_head call when prefill reads top-k successors
SUCCESSOR_SHARE = 0.04  # the successor read's lm_head FLOPs, at most this share of the prefill's layer FLOPs


def top_k_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] and log-probabilities [T, k] (float32) of the k likeliest next tokens; logits: [T, V]."""
    vals, ids = torch.topk(logits, k, dim=-1)
    return ids, (vals - torch.logsumexp(logits, dim=-1, keepdim=True)).float()


@dataclass(frozen=True)
class Successors:
    """The target's top-k next tokens after each distinct prompt token, at its last occurrence in the prompt."""

    tokens: torch.Tensor  # [U] distinct prompt tokens
    ids: torch.Tensor  # [U, k] int64
    logp: torch.Tensor  # [U, k] float32 log-probabilities

    @staticmethod
    def last_positions(ids: torch.Tensor, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(distinct tokens [U], the position of each one's last occurrence [U]) of ids [S], ascending by token;
        with `limit`, only the `limit` most frequent ones (ties: the later last occurrence first)."""
        tokens, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        pos = torch.arange(ids.numel(), device=ids.device)
        last = torch.full((tokens.numel(),), -1, dtype=torch.long, device=ids.device)
        last = last.scatter_reduce(0, inverse, pos, reduce="amax")
        if limit is not None and limit < tokens.numel():
            keep = torch.topk(counts * (ids.numel() + 1) + last, limit).indices.sort().values
            tokens, last = tokens[keep], last[keep]
        return tokens, last


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [T, V] next-token logits per input position (float32)
    aux: torch.Tensor | None  # [T, n_aux * H] low/mid/high hidden states for the drafter, or None
    successors: Successors | None = None  # prefill only, when asked for


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high features, in `output_hidden_states` numbering (0 is the embedding)."""
    return (2, num_layers // 2, num_layers - 3)


def resolve_source(path: str) -> tuple[str, bool]:
    """Return (what to pass to from_pretrained, is_local). Local-looking paths must exist."""
    if path == EMBEDDED:
        return str(embedded_dir()), True
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} exists but has no config.json: not a Hugging Face model directory")
        return str(p), True
    looks_local = path.startswith(("/", "./", "../", "~")) or path.count("/") != 1
    if looks_local:
        raise ModelLoadError(f"model path {path} does not exist")
    return path, False


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers; checked once up front so offline runs fail at once
    instead of after transformers' retries."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_model(
    path: str, dtype: str = "float32", device: str = "cpu", device_map: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; hub ids fail with a message saying how to get the weights."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}")
    if path.startswith(RANDOM):
        return load_random(path, DTYPES[dtype], device)
    source, local = resolve_source(path)
    kwargs = {"dtype": DTYPES[dtype], "local_files_only": local or not hub_reachable()}
    if device_map:
        kwargs["device_map"] = device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=kwargs["local_files_only"])
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:
        if local or not isinstance(exc, OSError):
            raise ModelLoadError(f"could not load the model in {source}: {str(exc).splitlines()[0]}") from None
        raise ModelLoadError(
            f"could not load '{path}' from the Hugging Face hub (offline, gated, or not cached): {exc}\n"
            f"Download it where you have a network (huggingface-cli download {path} --local-dir DIR), then run "
            f"with model=local model.path=DIR, or set HF_HOME to a cache that holds it."
        ) from None
    if not device_map:
        model = model.to(device)
    model.eval()
    return model, tokenizer


class Target:
    """A causal LM plus the aux-layer choice; stateless apart from the cache passed in."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, aux_layers=None,
                 max_context: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.max_context = min(max_context or self.config.max_position_embeddings, self.config.max_position_embeddings)
        layers = self.config.num_hidden_layers
        self.aux_layers = tuple(aux_layers) if aux_layers else default_aux_layers(layers)
        if any(not 0 <= i <= layers for i in self.aux_layers):
            raise ModelLoadError(f"aux layers {self.aux_layers} out of range 0..{layers}")
        self.use_attention("sdpa")  # transformers' SDPA, grouped-query folded under a tree mask (models/attention.py)
        self.linear = "torch"
        self.linear_timing = None  # use_linear('auto'): what it timed, when it timed (models/linear.py)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def new_cache(self, max_len: int) -> TreeKVCache:
        return TreeKVCache(self.config.num_hidden_layers, max_len)

    def use_attention(self, attn: str) -> None:
        """Pick the verification attention: 'sdpa' (transformers' SDPA, query heads folded onto their key/value
        head under a tree mask: models/attention.py), 'eager' (transformers'), or 'triton' (our kernel)."""
        if attn == "triton":
            from graft_lab.kernels import register_tree_attention

            self.model.set_attn_implementation(register_tree_attention())
        elif attn == "sdpa":
            from .attention import register_grouped_sdpa

            self.model.set_attn_implementation(register_grouped_sdpa())
        elif attn == "eager":
            self.model.set_attn_implementation(attn)
        else:
            raise ValueError(f"unknown verify.attn '{attn}'; valid: triton, sdpa, eager")
        self.attn = attn

    def use_linear(self, linear: str) -> None:
        """Pick the linear layers' kernel: 'onednn' (weights packed once), 'torch', or 'auto': where this CPU
        supports the dtype, the faster of the two timed now over the model's linear layers (its timing kept in
        `linear_timing`); see models/linear.py."""
        from .linear import pack_linears, resolve_linear, time_linears

        try:
            chosen = resolve_linear(linear, self.dtype, self.device)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        packed = None
        if linear == "auto" and chosen == "onednn" and self.linear != "onednn":
            self.linear_timing, packed = time_linears(self.model)
            chosen = self.linear_timing.faster
        if chosen == "onednn" and self.linear != "onednn":
            pack_linears(self.model, packed)
        elif chosen == "torch" and self.linear == "onednn":
            raise ModelLoadError("the target's linear layers are packed already; load it again for linear=torch")
        self.linear = chosen

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: TreeKVCache,
        tree_mask: torch.Tensor | None = None,
        want_aux: bool = False,
        last_only: bool = False,
        successors: int = 0,
    ) -> TargetOutput:
        # ids, positions: [T]; tree_mask: [T, T] bool ancestor mask, None for a causal (prefill) forward
        kwargs = {}
        if tree_mask is not None:
            if self.attn == "triton":
                from graft_lab.kernels import pack_tree_mask

                kwargs["tree_mask"] = pack_tree_mask(tree_mask[None])  # [1, T, words]: bits, packed once per step
            else:
                kwargs["attention_mask"] = self.tree_attention_mask(tree_mask, cache.length)
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            cache=cache,
            use_cache=True,
            output_hidden_states=want_aux or successors > 0,
            logits_to_keep=1 if last_only else 0,
            **kwargs,
        )
        aux = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1) if want_aux else None
        succ = self.successors(ids, out.hidden_states[-1][0], successors) if successors > 0 else None
        return TargetOutput(logits=out.logits[0].float(), aux=aux, successors=succ)

    def successor_rows(self, positions: int) -> int:
        """How many lm_head rows a prefill of `positions` tokens may add for successors: SUCCESSOR_SHARE of the
        layers' FLOPs (2 x their parameters per token) over one row's (2 x hidden x vocab)."""
        layer_params = sum(p.numel() for name, p in self.model.named_parameters() if ".layers." in name)
        return int(SUCCESSOR_SHARE * positions * layer_params / (self.hidden_size * self.vocab_size))

    def successors(self, ids: torch.Tensor, hidden: torch.Tensor, k: int, chunk: int = SUCCESSOR_CHUNK) -> Successors:
        """Top-k next tokens after the distinct tokens of `ids` ([T]) at their last occurrence, from the final
        hidden states ([T, H], what lm_head reads) through lm_head `chunk` positions at a time: never [T, V].
        Its cost is capped at `successor_rows(T)` rows: the most frequent tokens first, the rest are left out."""
        tokens, last = Successors.last_positions(ids, self.successor_rows(ids.numel()))
        head = self.model.get_output_embeddings()
        parts = [top_k_logp(head(hidden[last[i : i + chunk]]).float(), k) for i in range(0, last.numel(), chunk)]
        if not parts:  # a prompt too short to pay for one row
            return Successors(tokens, tokens.new_zeros(0, k), torch.zeros(0, k, device=tokens.device))
        return Successors(tokens, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))

    def tree_attention_mask(self, tree_mask: torch.Tensor, prefix: int) -> torch.Tensor:
        """[1, 1, T, prefix + T] additive mask: the whole prefix, then the node's ancestors and itself."""
        t = tree_mask.shape[0]
        mask = torch.zeros(1, 1, t, prefix + t, dtype=self.dtype, device=self.device)
        mask[0, 0, :, prefix:].masked_fill_(~tree_mask, torch.finfo(self.dtype).min)
        return mask

    def prefill(self, ids: torch.Tensor, cache: TreeKVCache, want_aux: bool, all_logits: bool = False,
                successors: int = 0) -> TargetOutput:
        # ids: [S] prompt tokens, written to the cache from position cache.length; logits: [S or 1, V]
        # successors > 0: also the top-k next tokens of each distinct prompt token (see `successors`)
        positions = torch.arange(cache.length, cache.length + ids.numel(), device=self.device)
        return self.forward(ids, positions, cache, want_aux=want_aux, last_only=not all_logits, successors=successors)

    def verify(self, tree: DraftTree, cache: TreeKVCache, want_aux: bool) -> TargetOutput:
        """One forward over every node of `tree` on top of the cache; the nodes' KV stay until `commit`.
        A token id outside the vocabulary (a broken drafter or retriever) is refused, never verified."""
        bad = (tree.tokens < 0) | (tree.tokens >= self.vocab_size)  # [N]
        if bool(bad.any()):
            raise DecodingError(f"tree token ids {tree.tokens[bad].tolist()} are outside the target's vocabulary "
                                f"(0..{self.vocab_size - 1}): a broken drafter or retriever")
        return self.forward(tree.tokens, tree.position_ids(cache.length), cache, tree.ancestor_mask, want_aux)

    @staticmethod
    def commit(cache: TreeKVCache, start: int, path: torch.Tensor) -> None:
        """Keep the accepted nodes' KV (path: [M] ascending node indices) right after the prefix."""
        cache.compact(start, path)
