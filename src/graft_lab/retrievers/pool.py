"""A pool of retrievers: query several at once and merge their candidates into one retrieved tree.

Each source retrieves on its own; their trees fold into one trie under the shared root, so a prefix that
several sources propose is one node. Every node remembers which source proposed it (`tree.retrieved_by`:
the source's index in the pool): on a duplicate the earlier source in the pool's order keeps the node,
with the best score any source gave it. The acceptance model calibrates each source apart from what
verification accepts, so under tree=auto the planner keeps the candidates of the sources that have been
right lately. Continuations (graft=tail/match) are every source's, tagged the same way. Everything else
(reset with the prefill's top-k successors, extend, observe) is forwarded to every source.

Scores. Each source keeps its own estimate (see its module); the pool cuts the merged trie to the budget
by them, as grafting then does against the draft. The scales differ between sources (shares of n-gram
matches, the target's recorded log-probs), so that cut is a heuristic; under tree=auto the planner then
ranks what is left by the acceptance model's per-source probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..errors import ConfigError
from ..tree import MAX_RETRIEVERS, DraftTree, retrieved_by
from .base import RETRIEVERS, Fragment, Retriever, Successors

NOT_POOLED = ("none", "pool")  # retriever names a pool cannot hold


def source_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The retriever config nodes a retriever config stands for: a pool's sources, else the node itself.
    A source is a name (`ngram`) or a node with a name and its options (`{name: ngram, n_max: 3}`)."""
    if node.get("name") != "pool":
        return [node]
    return [dict(s) if isinstance(s, dict) else {"name": s} for s in node.get("sources") or []]


@dataclass
class PoolOptions:
    sources: list[Any] = field(default_factory=lambda: ["ngram", "recycle", "sam"])  # names or {name, options}

    def __post_init__(self):
        if not self.sources:
            raise ConfigError("retriever.sources must list at least one retriever (e.g. [ngram, recycle, sam])")
        if len(self.sources) > MAX_RETRIEVERS:
            raise ConfigError(f"retriever.sources holds {len(self.sources)} retrievers; a pool tells at most {MAX_RETRIEVERS} apart")
        valid = [n for n in RETRIEVERS.names if n not in NOT_POOLED]
        for i, src in enumerate(source_nodes({"name": "pool", "sources": self.sources})):
            name = src.get("name")
            if not isinstance(name, str) or name not in valid:
                raise ConfigError(f"retriever.sources[{i}]: {name!r} is not a retriever a pool can hold; valid names: "
                                  f"{', '.join(valid)}")
            try:
                RETRIEVERS.options(src)  # the source's own options, checked by its entry
            except ConfigError as exc:
                raise ConfigError(f"retriever.sources[{i}]: {exc}") from None


class PoolRetriever:
    def __init__(self, sources: list[Retriever], device: torch.device | str):
        self.sources = sources
        self.device = torch.device(device)
        self.prefill_top_k = max(s.prefill_top_k for s in sources)  # the widest warm-up any source asks for
        self.root = 0

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        for s in self.sources:  # each source gets the top-k it asked for (ids and logp are sorted by rank)
            k = s.prefill_top_k
            mine = Successors(successors.tokens, successors.ids[:, :k], successors.logp[:, :k]) if successors and k else None
            s.reset(prompt, mine)
        self.root = int(prompt[-1])

    def extend(self, tokens: torch.Tensor) -> None:
        for s in self.sources:
            s.extend(tokens)
        self.root = int(tokens[-1])

    def retrieve(self, budget: int) -> DraftTree:
        if budget <= 1:
            return DraftTree.root(self.root, self.device)
        frags = [tagged(Fragment.below_root(s.retrieve(budget)), i) for i, s in enumerate(self.sources)]
        return Fragment.concat(frags, self.device).tree(self.root, self.device).fold_duplicates().cut(budget)

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        frags = [tagged(s.continuations(tree, nodes, max_len), i) for i, s in enumerate(self.sources)]
        return Fragment.concat(frags, tree.device)  # grafting folds what several sources share

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        for s in self.sources:
            s.observe(tree, logits)


def tagged(frag: Fragment, index: int) -> Fragment:
    """The fragment's nodes marked as proposed by the pool's `index`-th source."""
    return replace(frag, source=torch.full_like(frag.source, retrieved_by(index)))


@RETRIEVERS.register("pool", PoolOptions)
def build_pool(opts: PoolOptions, vocab_size: int, device: torch.device) -> PoolRetriever:
    nodes = source_nodes({"name": "pool", "sources": opts.sources})
    return PoolRetriever([RETRIEVERS.build(n, vocab_size=vocab_size, device=device) for n in nodes], device)
