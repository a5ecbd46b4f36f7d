"""The EAGLE-3 drafter: the EAGLE-2 dynamic tree grown by the EAGLE-3 network, batched per level.

Level 0 holds the root's `top_k` children. Each later level expands the `top_k` best nodes of the
previous level (one drafter forward for all of them), giving top_k^2 candidates; all of them join the
pool with their cumulative log-probabilities. The pool is finally cut to the best nodes by score.
Tree nodes live in the drafter's cache only while the tree is drafted; the next call crops them.

Nothing is rebuilt per level that can be kept: the pool is preallocated per draft, each frontier node's
attention row over the cache moves with it to its children, the rotary table is computed once per sequence.
The drafter runs in its own dtype (`drafter.dtype`; auto = the target's): verification decides the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError, DrafterMismatchError
from ..models.attention import NAME as ATTN_NAME, register_grouped_sdpa
from ..models.cache import TreeKVCache
from ..models.linear import onednn_supports, pack_linears
from ..models.target import DTYPES, Target
from ..pruners.base import Pruner
from ..tree import DraftTree, Source
from ..verify import check_finite
from .base import DRAFTERS, DraftInput
from .eagle3_checkpoint import aux_layers_from_config, load_eagle3
from .eagle3_model import Eagle3Model


DTYPE_NAMES = ("auto", *DTYPES)  # drafter.dtype: auto is the target's


@dataclass
class Eagle3Options:
    path: str | None = None  # checkpoint directory, hub id, or builtin:NAME (shipped with graft-lab)
    depth: int = 7  # draft levels (deepest node depth)
    top_k: int = 10  # children per expanded node, and nodes expanded per level
    aux_layers: list[int] | None = None  # output_hidden_states indices; default: the checkpoint's, else 2, L//2, L-3
    dtype: str = "auto"  # the drafter's own dtype; auto: the target's. Verification decides, so it never changes output

    def __post_init__(self):
        if not self.path:
            raise ConfigError("drafter=eagle3 needs drafter.path, and no EAGLE-3 checkpoint is known for this model: "
                              "use method=ar (or pld, recycle, sam), or give one with drafter.path=DIR")
        if self.depth < 1:
            raise ConfigError(f"drafter.depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ConfigError(f"drafter.top_k must be >= 1, got {self.top_k}")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"drafter.dtype must be one of {', '.join(DTYPE_NAMES)}; got '{self.dtype}'")

    def torch_dtype(self, target: Target) -> torch.dtype:
        return target.dtype if self.dtype == "auto" else DTYPES[self.dtype]


class Eagle3Drafter:
    needs_features = True

    def __init__(self, net: Eagle3Model, embed: torch.nn.Embedding, depth: int, top_k: int):
        self.net = net
        self.embed = embed  # the target's, or the drafter's own; rows are cast to the drafter's dtype when read
        self.depth = depth
        self.top_k = top_k
        self.dtype = net.fc.weight.dtype  # the drafter's own dtype, which may differ from the target's
        self.to_target = net.to_target_ids(torch.arange(net.draft_vocab_size, device=net.d2t.device))  # [Vd]
        self.cache: TreeKVCache | None = None
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None  # (cos, sin) [1, max_len, D], kept per sequence
        # SDPA (transformers' or graft_sdpa) reads a missing mask over several rows as causal: the prompt's
        # first ingest then needs no [S, S] mask, and the kernel skips the masked half
        self.sdpa = net.config._attn_implementation in ("sdpa", ATTN_NAME)

    def reset(self, max_len: int) -> None:
        self.cache = TreeKVCache(1, max_len + self.depth * self.top_k + 1)
        self.rope = self.net.rope_table(self.cache.max_len, self.dtype)

    def _positions(self, start: int, length: int, rows: int):
        """The rotary input of `rows` queries at positions start..start+length-1 (length 1: all at `start`):
        slices of the kept table, or position ids [1, rows] where the RoPE type has no fixed table."""
        if self.rope is None:
            dev = self.to_target.device
            if length == rows:
                return torch.arange(start, start + length, device=dev)[None]
            return torch.full((1, rows), start, device=dev)
        cos, sin = self.rope
        return cos[:, start : start + length], sin[:, start : start + length]  # [1, length, D] each

    def _forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions, bias: torch.Tensor | None) -> torch.Tensor:
        # tokens: [T]; hidden: [T, 3H_t] target features or [T, H] drafter states; bias: [T, S] additive over
        # the cache after this write, or None: causal over an empty cache (SDPA only); returns [T, H]
        embeds = self.embed(tokens).to(self.dtype)
        mask = None if bias is None else bias[None, None]
        return self.net(embeds[None], hidden.to(self.dtype)[None], positions, mask, self.cache)[0]

    def _top_k(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # hidden: [R, H] -> target token ids [R, k], float32 log-probs [R, k], descending
        logp = torch.log_softmax(self.net.logits(hidden).float(), dim=-1)
        vals, ids = torch.topk(logp, k, dim=-1)
        check_finite(vals, "the EAGLE-3 drafter's logits")  # a NaN or +inf logit turns its whole row NaN
        return self.to_target[ids], vals

    @torch.inference_mode()
    def draft(self, inp: DraftInput, budget: int, pruner: Pruner) -> DraftTree:
        dev, dtype = inp.next_tokens.device, self.dtype
        neg = torch.finfo(dtype).min
        # 1. ingest the committed pairs (permanent cache entries), causal among themselves
        self.cache.crop(inp.start)
        m = inp.next_tokens.numel()
        committed = inp.start + m
        causal = None if inp.start == 0 and self.sdpa else \
            torch.full((m, committed), neg, dtype=dtype, device=dev).triu_(inp.start + 1)  # [m, committed]
        h = self._forward(inp.next_tokens, inp.features, self._positions(inp.start, m, m), causal)[-1:]  # [1, H]
        if budget <= 1:
            return DraftTree.root(inp.root, device=dev)
        k = min(self.top_k, self.net.draft_vocab_size)
        # the pool, preallocated: root, level 0's k nodes, k * k per further level; node id == index
        size = 1 + k + (self.depth - 1) * k * k
        tokens = torch.empty(size, dtype=torch.long, device=dev)
        parents = torch.empty(size, dtype=torch.long, device=dev)
        depth = torch.empty(size, dtype=torch.long, device=dev)
        score = torch.empty(size, dtype=torch.float32, device=dev)  # cumulative log-probability
        # attention rows of the frontier over [committed | tree slots]: the committed part and each node's
        # ancestors' slots are visible (0), the rest masked; a row moves with its node to the next level
        bias = torch.full((k, committed + (self.depth - 1) * k), neg, dtype=dtype, device=dev)  # [k, S_max]
        bias[:, :committed] = 0
        # 2. level 0: the root's k children (nodes 1..k)
        tok, lp = self._top_k(h, k)  # [1, k]
        tokens[:1], parents[:1], depth[:1], score[:1] = inp.next_tokens[-1:], -1, 0, 0.0
        tokens[1 : k + 1], parents[1 : k + 1], depth[1 : k + 1], score[1 : k + 1] = tok[0], 0, 1, lp[0]
        frontier = torch.arange(1, k + 1, device=dev)  # [f] node ids of the level to expand
        frontier_h = h.expand(k, -1)  # [f, H] drafter state fed with each frontier node
        best = lp[0, 0]  # the level's highest score (top-k values are sorted)
        n_nodes, level, written = 1 + k, 0, 0  # written: tree slots in the cache
        while level + 1 < self.depth and pruner.keep_drafting(level, float(best)):
            # 3. one forward for the whole frontier; its nodes become tree slots written .. written + f
            f = frontier.numel()
            rows = bias[:f, : committed + written + f]  # [f, S] over the cache after this write
            rows[:, committed + written :].fill_diagonal_(0)  # each node sees its own slot
            out = self._forward(tokens[frontier], frontier_h, self._positions(committed + level, 1, f), rows)  # [f, H]
            # 4. k children per frontier node, cumulative log-probabilities; all join the pool
            child_tok, child_lp = self._top_k(out, k)  # [f, k]
            child_score = (score[frontier][:, None] + child_lp).flatten()  # [f * k]
            lo, hi = n_nodes, n_nodes + f * k
            tokens[lo:hi], score[lo:hi], depth[lo:hi] = child_tok.flatten(), child_score, level + 2
            parents[lo:hi].view(f, k)[:] = frontier[:, None]
            # 5. the next frontier: the k best children of this level; their rows follow their parents'
            top = torch.topk(child_score, k)
            src = top.indices // k  # [f'] the frontier row each new node came from
            frontier, frontier_h, best = lo + top.indices, out[src], top.values[0]
            bias[: src.numel()] = bias[src]
            n_nodes, written, level = hi, written + f, level + 1
        self.cache.crop(committed)
        source = torch.full((n_nodes,), int(Source.DRAFT), dtype=torch.int8, device=dev)
        source[0] = int(Source.ROOT)
        tree = DraftTree(tokens[:n_nodes], parents[:n_nodes], depth[:n_nodes], score[:n_nodes], source)
        return tree.cut(pruner.draft_budget(budget, level))


def check_compatible(net: Eagle3Model, target: Target) -> None:
    fc_in = net.fc.in_features
    if fc_in != 3 * target.hidden_size:
        raise DrafterMismatchError(
            f"the drafter's fc expects 3 x {fc_in // 3} target features but the target's hidden size is "
            f"{target.hidden_size}: this drafter was trained for another target"
        )
    if net.t2d.numel() != target.vocab_size or net.config.vocab_size != target.vocab_size:
        raise DrafterMismatchError(
            f"the drafter's vocabulary ({net.config.vocab_size}) differs from the target's ({target.vocab_size}): "
            "this drafter was trained for another target"
        )
    target_ids = net.to_target_ids(torch.arange(net.draft_vocab_size, device=net.d2t.device))
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= target.vocab_size:
        raise DrafterMismatchError(
            f"the drafter's d2t map sends draft tokens outside the target's vocabulary (0..{target.vocab_size - 1}): "
            "a corrupt checkpoint"
        )
    if net.embed_tokens is None and net.config.hidden_size != target.hidden_size:
        raise DrafterMismatchError(
            f"the drafter (hidden {net.config.hidden_size}) has no embeddings of its own and cannot share the "
            f"target's (hidden {target.hidden_size})"
        )


@DRAFTERS.register("eagle3", Eagle3Options)
def build_eagle3(opts: Eagle3Options, target: Target) -> Eagle3Drafter:
    net, raw = load_eagle3(opts.path, dtype=opts.torch_dtype(target), device=target.device)
    check_compatible(net, target)
    aux = opts.aux_layers or aux_layers_from_config(raw)
    if aux:
        target.aux_layers = tuple(aux)
    embed = net.embed_tokens if net.embed_tokens is not None else target.model.get_input_embeddings()
    if target.linear == "onednn" and onednn_supports(net.fc.weight.dtype, target.device):
        pack_linears(net)  # the target's kernel choice, where oneDNN packs the drafter's own dtype
    if target.attn == "sdpa":  # as the target's: query heads folded onto their key/value head, no cache copy
        net.config._attn_implementation = register_grouped_sdpa()
    return Eagle3Drafter(net, embed, opts.depth, opts.top_k)
