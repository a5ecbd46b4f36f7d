"""The EAGLE-3 drafter: the EAGLE-2 dynamic tree grown by the EAGLE-3 network, batched per level.

Level 0 holds the root's `top_k` children. Each later level expands the `top_k` best nodes of the
previous level (one drafter forward for all of them), giving top_k^2 candidates; all of them join the
pool with their cumulative log-probabilities. The pool is finally cut to the best nodes by score.
Tree nodes live in the drafter's cache only while the tree is drafted; the next call crops them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError, DrafterMismatchError
from ..models.cache import TreeKVCache
from ..models.target import Target
from ..pruners.base import Pruner
from ..tree import DraftTree, Source
from ..verify import check_finite
from .base import DRAFTERS, DraftInput
from .eagle3_checkpoint import aux_layers_from_config, load_eagle3
from .eagle3_model import Eagle3Model


@dataclass
class Eagle3Options:
    path: str | None = None  # checkpoint directory, hub id, or builtin:NAME (shipped with graft-lab)
    depth: int = 7  # draft levels (deepest node depth)
    top_k: int = 10  # children per expanded node, and nodes expanded per level
    aux_layers: list[int] | None = None  # output_hidden_states indices; default: the checkpoint's, else 2, L//2, L-3

    def __post_init__(self):
        if not self.path:
            raise ConfigError("drafter=eagle3 needs drafter.path, and no EAGLE-3 checkpoint is known for this model: "
                              "use method=ar (or pld, recycle, sam), or give one with drafter.path=DIR")
        if self.depth < 1:
            raise ConfigError(f"drafter.depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ConfigError(f"drafter.top_k must be >= 1, got {self.top_k}")


class Eagle3Drafter:
    needs_features = True

    def __init__(self, net: Eagle3Model, embed: torch.nn.Embedding, depth: int, top_k: int):
        self.net = net
        self.embed = embed
        self.depth = depth
        self.top_k = top_k
        self.cache: TreeKVCache | None = None

    def reset(self, max_len: int) -> None:
        self.cache = TreeKVCache(1, max_len + self.depth * self.top_k + 1)

    def _step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # tokens: [T]; hidden: [T, F]; positions: [T]; mask: [T, S] bool over the cache after this write
        dtype = self.net.fc.weight.dtype
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
        out = self.net(self.embed(tokens)[None].to(dtype), hidden[None].to(dtype), positions[None], additive[None, None], self.cache)
        return out[0]  # [T, H]

    def _top_k(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # hidden: [R, H] -> target token ids [R, k], log-probs [R, k]
        logits = self.net.logits(hidden).float()
        check_finite(logits, "the EAGLE-3 drafter's logits")
        logp = torch.log_softmax(logits, dim=-1)
        vals, ids = torch.topk(logp, k, dim=-1)
        return self.net.to_target_ids(ids), vals

    @torch.inference_mode()
    def draft(self, inp: DraftInput, budget: int, pruner: Pruner) -> DraftTree:
        dev = inp.next_tokens.device
        # 1. ingest the committed pairs (permanent cache entries), causal among themselves
        self.cache.crop(inp.start)
        m = inp.next_tokens.numel()
        committed = inp.start + m
        causal = torch.ones(m, committed, dtype=torch.bool, device=dev).tril(inp.start)
        positions = torch.arange(inp.start, committed, device=dev)
        h = self._step(inp.next_tokens, inp.features, positions, causal)[-1:]  # [1, H] state after the root
        if budget <= 1:
            return DraftTree.root(inp.root, device=dev)
        k = min(self.top_k, self.net.draft_vocab_size)
        # 2. level 0: the root's k children (pool node ids 1..k; node i sits at flat index i - 1)
        tok, lp = self._top_k(h, k)  # [1, k]
        pool_tok, pool_score = [tok[0]], [lp[0]]
        pool_par = [torch.zeros(k, dtype=torch.long, device=dev)]
        pool_depth = [torch.ones(k, dtype=torch.long, device=dev)]
        frontier = torch.arange(1, k + 1, device=dev)  # [f] pool ids of the level to expand
        frontier_h = h.expand(k, -1)  # [f, H] drafter state fed with each frontier node
        frontier_anc = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # [f, W] ancestors among written tree slots
        n_nodes, level = 1 + k, 0
        while level + 1 < self.depth and pruner.keep_drafting(level, float(pool_score[-1].max())):
            # 3. one forward for the whole frontier; its nodes become tree slots in the cache
            f = frontier.numel()
            anc = torch.cat([frontier_anc, torch.eye(f, dtype=torch.bool, device=dev)], dim=1)  # [f, W + f]
            mask = torch.cat([torch.ones(f, committed, dtype=torch.bool, device=dev), anc], dim=1)
            flat_tok, flat_score = torch.cat(pool_tok), torch.cat(pool_score)
            out = self._step(flat_tok[frontier - 1], frontier_h, torch.full((f,), committed + level, device=dev), mask)
            # 4. k children per frontier node, cumulative log-probabilities; all join the pool
            child_tok, child_lp = self._top_k(out, k)  # [f, k]
            child_score = (flat_score[frontier - 1][:, None] + child_lp).flatten()  # [f * k]
            pool_tok.append(child_tok.flatten())
            pool_score.append(child_score)
            pool_par.append(frontier.repeat_interleave(k))
            pool_depth.append(torch.full((f * k,), level + 2, dtype=torch.long, device=dev))
            # 5. the next frontier: the k best children of this level
            best = torch.topk(child_score, min(k, child_score.numel())).indices
            frontier, frontier_h, frontier_anc = n_nodes + best, out[best // k], anc[best // k]
            n_nodes += child_score.numel()
            level += 1
        self.cache.crop(committed)
        source = torch.full((n_nodes,), int(Source.DRAFT), dtype=torch.int8, device=dev)
        source[0] = int(Source.ROOT)
        tree = DraftTree(
            tokens=torch.cat([torch.tensor([inp.root], device=dev), *pool_tok]),
            parents=torch.cat([torch.tensor([-1], device=dev), *pool_par]),
            depth=torch.cat([torch.zeros(1, dtype=torch.long, device=dev), *pool_depth]),
            score=torch.cat([torch.zeros(1, device=dev), *pool_score]).float(),
            source=source,
        )
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
    net, raw = load_eagle3(opts.path, dtype=target.dtype, device=target.device)
    check_compatible(net, target)
    aux = opts.aux_layers or aux_layers_from_config(raw)
    if aux:
        target.aux_layers = tuple(aux)
    embed = net.embed_tokens if net.embed_tokens is not None else target.model.get_input_embeddings()
    return Eagle3Drafter(net, embed, opts.depth, opts.top_k)
