"""Acceptance rules. Given a tree and the target's logits at every node, pick the accepted root-to-node
path and the bonus token. Both rules make the output exactly what the target alone would produce."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import NonFiniteLogitsError
from .tree import DraftTree


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k filter

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Acceptance:
    path: torch.Tensor  # [M] accepted node indices, root first, ascending
    bonus: int  # the token after the last accepted node


def check_finite(logits: torch.Tensor, what: str) -> None:
    """Raise rather than decide on NaN or inf logits: argmax would silently pick the NaN."""
    if not bool(torch.isfinite(logits).all()):
        kind = "NaN" if bool(torch.isnan(logits).any()) else "inf"
        raise NonFiniteLogitsError(f"{kind} in {what}: the weights are broken or the dtype overflows "
                                   "(try model.dtype=float32)")


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] the distribution the target samples from: temperature, then top-k, then top-p."""
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the first always stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """Longest path whose every token equals the target's argmax at its parent, plus that argmax after it."""
    # logits: [N, V]
    pred = logits.argmax(-1)  # [N]
    ok = tree.tokens == pred[tree.parents.clamp(min=0)]  # [N] the node matches its parent's prediction
    ok[0] = True
    anc = tree.ancestor_mask  # [N, N]
    accepted = ~(anc & ~ok[None, :]).any(-1)  # [N] every node on the path is ok
    depth = torch.where(accepted, tree.depth, torch.full_like(tree.depth, -1))
    best = int(depth.argmax())  # siblings hold distinct tokens, so the deepest accepted node is unique
    path = anc[best].nonzero().squeeze(1)
    return Acceptance(path=path, bonus=int(pred[best]))


def residual(p: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """p with every rejected deterministic candidate removed (unnormalised): max(p - q, 0) for one-hot q."""
    out = p.clone()
    out[rejected] = 0.0
    return out


def accept_sampling(
    tree: DraftTree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Acceptance:
    """Multi-candidate recursive rejection for deterministic (top-k) drafts, as in SpecInfer / EAGLE.

    At a node with target distribution p and children c_1..c_m: accept c_i with probability
    p(c_i) / (1 - p(c_1) - ... - p(c_{i-1})), i.e. sample from p restricted to the children not yet
    rejected; if all are rejected the bonus is drawn from p with those children removed. Every emitted
    token is therefore distributed exactly as p. One loop step per accepted depth, never per node."""
    probs = target_probs(logits, params)  # [N, V]
    node = 0
    path = [0]
    while True:
        children = (tree.parents == node).nonzero().squeeze(1)  # [m]
        p = probs[node]
        if children.numel():
            pc = p[tree.tokens[children]]  # [m]
            left = (1.0 - (pc.cumsum(0) - pc)).clamp(min=1e-12)  # [m] mass not yet rejected before c_i
            u = torch.rand(children.numel(), generator=generator, device=p.device)
            hit = (u * left < pc).nonzero()
            if hit.numel():
                node = int(children[hit[0, 0]])
                path.append(node)
                continue
            p = residual(p, tree.tokens[children])
        bonus = int(torch.multinomial(p / p.sum(), 1, generator=generator))
        return Acceptance(path=torch.tensor(path, device=tree.device), bonus=bonus)


def accept(
    tree: DraftTree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> Acceptance:
    if params.greedy:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, params, generator)
