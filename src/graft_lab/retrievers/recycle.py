"""Token recycling (Luo et al. 2024), the retriever Graft uses: reuse the target's own top-k candidates.

An adjacency matrix M [V, k] on the device holds, per token x, the top-k tokens the target predicted
after x the last time it verified x. Every verified node updates its row in one batched scatter, so the
candidates the target computed but did not accept are recycled for later steps. Retrieval expands a
static rank-path template (widths per depth) with one batched gather per depth.

Score of a retrieved node: the sum, along its path, of the log-probabilities the target gave each token
when the row was written (a first-order estimate on the target's own scale); unseen rows hold arbitrary
tokens at the uniform prior log(1/V).
"""

from __future__ import annotations

import math
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..models.target import top_k_logp
from ..tree import DraftTree, Source
from .base import RETRIEVERS, Fragment, Successors, retrieved

PAPER_WIDTHS = [8, 10, 8, 6, 5, 4, 4, 4, 3]  # 52 nodes over 9 depths


@dataclass
class RecycleOptions:
    top_k: int = 8  # candidates kept per token: the columns of M
    widths: list[int] = field(default_factory=lambda: list(PAPER_WIDTHS))  # template nodes per depth
    warm_prefill: bool = True  # write M rows from prefill: the target's top-k after the prompt's most frequent tokens (<= 4% of its FLOPs)
    warm_path: str | None = None  # .npy/.pt: a 1-D token stream, or [n, 3] rows (prev, next, count)
    persist: bool = True  # keep M across sequences, as token recycling does

    def __post_init__(self):
        if self.top_k < 1:
            raise ConfigError(f"retriever.top_k must be >= 1, got {self.top_k}")
        if not self.widths or any(w < 1 for w in self.widths):
            raise ConfigError(f"retriever.widths must be a non-empty list of positive ints, got {self.widths}")
        caps = [self.top_k] + [w * self.top_k for w in self.widths[:-1]]
        if any(w > cap for w, cap in zip(self.widths, caps)):
            raise ConfigError(f"retriever.widths {self.widths}: a depth can hold at most top_k x the previous width")


@dataclass(frozen=True)
class Template:
    """A static tree of (parent, rank) slots; node 0 is the root, depths are contiguous in index order."""

    levels: list[tuple[torch.Tensor, torch.Tensor]]  # per depth: parent within previous depth [w], rank [w]
    parents: torch.Tensor  # [T] int64
    depth: torch.Tensor  # [T] int64
    source: torch.Tensor  # [T] int8: the root, then retrieved nodes

    @staticmethod
    def rank_path(widths: list[int], k: int, device: torch.device) -> "Template":
        """Each depth takes the slots with the smallest rank sum along their path: ties to earlier parents,
        then lower ranks. Built once, so the Python loops here are off the hot path."""
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)
        cost, levels, parents, depth, offset = [0], [], [-1], [0], 0
        for d, w in enumerate(widths, start=1):
            slots = sorted((cost[p] + r, p, r) for p in range(len(cost)) for r in range(k))[:w]
            levels.append((as_long([s[1] for s in slots]), as_long([s[2] for s in slots])))
            parents += [offset + s[1] for s in slots]
            depth += [d] * w
            offset += len(cost)
            cost = [s[0] for s in slots]
        source = torch.full((len(parents),), int(Source.RETRIEVED), dtype=torch.int8, device=device)
        source[0] = int(Source.ROOT)
        return Template(levels, as_long(parents), as_long(depth), source)


def adjacency(prev: torch.Tensor, nxt: torch.Tensor, count: torch.Tensor, vocab: int, k: int):
    """Top-k successors per token from bigram counts: ids [V, k] int64, log-probs [V, k] float32.

    Rows with fewer than k observed successors are filled with tokens 0, 1, ... at the uniform prior."""
    dev = prev.device
    key, inverse = torch.unique(prev * vocab + nxt, return_inverse=True)
    cnt = torch.zeros(key.numel(), device=dev).index_add_(0, inverse, count.float())
    rows, cols = key // vocab, key % vocab
    total = torch.zeros(vocab, device=dev).index_add_(0, rows, cnt)
    lp = torch.log(cnt / total[rows])
    fill_rows = torch.arange(vocab, device=dev).repeat_interleave(k)
    fill_cols = torch.arange(k, device=dev).repeat(vocab)
    new = ~torch.isin(fill_rows * vocab + fill_cols, key)  # fillers that are not observed successors
    n_fill = int(new.sum())
    rows = torch.cat([rows, fill_rows[new]])
    cols = torch.cat([cols, fill_cols[new]])
    lp = torch.cat([lp, torch.full((n_fill,), -math.log(vocab), device=dev)])
    filler = torch.cat([torch.zeros(key.numel(), dtype=torch.uint8, device=dev), torch.ones(n_fill, dtype=torch.uint8, device=dev)])
    # order: row asc, observed before filler, log-prob desc (three stable sorts, least significant first)
    order = torch.sort(-lp, stable=True).indices
    order = order[torch.sort(filler[order], stable=True).indices]
    order = order[torch.sort(rows[order], stable=True).indices]
    r = rows[order]
    rank = torch.arange(r.numel(), device=dev) - torch.searchsorted(r, r)  # position within the row
    top = rank < k
    ids = torch.empty(vocab, k, dtype=torch.long, device=dev)
    logp = torch.empty(vocab, k, device=dev)
    ids[r[top], rank[top]] = cols[order][top]
    logp[r[top], rank[top]] = lp[order][top]
    return ids, logp


def load_bigrams(path: str, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prev, next, count) from a .npy/.pt file: a 1-D token stream or [n, 3] count rows."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"retriever.warm_path {path} does not exist")
    if p.suffix not in (".npy", ".pt"):
        raise ConfigError(f"retriever.warm_path must be a .npy or .pt file, got {path}")
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then rejects
            warnings.simplefilter("ignore")
            raw = np.load(p) if p.suffix == ".npy" else torch.load(p, map_location="cpu", weights_only=True)
        data = (torch.from_numpy(raw) if isinstance(raw, np.ndarray) else torch.as_tensor(raw)).long()
    except (OSError, ValueError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise ConfigError(f"retriever.warm_path {path} is not a token array ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if data.dim() == 1:
        prev, nxt, count = data[:-1], data[1:], torch.ones(max(data.numel() - 1, 0), dtype=torch.long)
    elif data.dim() == 2 and data.shape[1] == 3:
        prev, nxt, count = data.unbind(1)
    else:
        raise ConfigError(f"retriever.warm_path: expected a 1-D token stream or [n, 3] rows, got shape {list(data.shape)}")
    if prev.numel() and (int(torch.minimum(prev, nxt).min()) < 0 or int(torch.maximum(prev, nxt).max()) >= vocab):
        raise ConfigError(f"retriever.warm_path {path} holds token ids outside 0..{vocab - 1}")
    return prev, nxt, count


class RecycleRetriever:
    def __init__(self, opts: RecycleOptions, vocab_size: int, device: torch.device | str):
        if opts.top_k > vocab_size:
            raise ConfigError(f"retriever.top_k ({opts.top_k}) exceeds the vocabulary ({vocab_size})")
        self.k = opts.top_k
        self.device = torch.device(device)
        self.persist = opts.persist
        self.prefill_top_k = self.k if opts.warm_prefill else 0
        self.template = Template.rank_path(opts.widths, self.k, self.device)
        empty = torch.zeros(0, dtype=torch.long)
        warm = load_bigrams(opts.warm_path, vocab_size) if opts.warm_path else (empty, empty, empty)
        ids, logp = adjacency(*warm, vocab_size, self.k)
        self.initial = (ids.to(self.device), logp.to(self.device))
        self.ids, self.logp = (t.clone() for t in self.initial)  # M: [V, k] token ids, [V, k] log-probs
        self.root = torch.zeros(1, dtype=torch.long, device=self.device)

    def reset(self, prompt: torch.Tensor, successors: Successors | None) -> None:
        if not self.persist:
            self.ids, self.logp = (t.clone() for t in self.initial)
        if successors is not None:  # M[x] = the target's top-k after the prompt's last x
            self.write(successors.tokens, successors.ids, successors.logp)
        self.root = prompt[-1:].to(self.device)

    def extend(self, tokens: torch.Tensor) -> None:
        self.root = tokens[-1:].to(self.device)

    def update(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """M[x_i] = top-k of the target's logits at position i, for all i at once."""
        # tokens: [N]; logits: [N, V]
        self.write(tokens, *top_k_logp(logits, self.k))

    def write(self, tokens: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> None:
        # tokens: [N]; ids, logp: [N, k]; a repeated token keeps its last row
        self.ids.index_copy_(0, tokens, ids)
        self.logp.index_copy_(0, tokens, logp)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        self.update(tree.tokens, logits)

    def retrieve(self, budget: int) -> DraftTree:
        if budget <= 1:
            return DraftTree.root(self.root, self.device)
        tok, score = self.root, torch.zeros(1, device=self.device)
        tokens, scores = [tok], [score]
        for par, rank in self.template.levels:  # one gather per depth: [w] = M[parent tokens, ranks]
            flat = tok[par] * self.k + rank
            tok, score = self.ids.view(-1)[flat], score[par] + self.logp.view(-1)[flat]
            tokens.append(tok)
            scores.append(score)
        tree = DraftTree(torch.cat(tokens), self.template.parents, self.template.depth, torch.cat(scores), self.template.source)
        return tree.cut(budget)

    def continuations(self, tree: DraftTree, nodes: torch.Tensor, max_len: int) -> Fragment:
        """The top-1 chain of M under each node: one gather per depth for all nodes."""
        q = nodes.numel()
        if q == 0 or max_len < 1:
            return Fragment.empty(tree.device)
        tok, score = tree.tokens[nodes], torch.zeros(q, device=tree.device)
        tokens, scores = [], []
        for _ in range(max_len):
            tok, score = self.ids[tok, 0], score + self.logp[tok, 0]
            tokens.append(tok)
            scores.append(score)
        idx = torch.arange(max_len * q, device=tree.device)  # node (d, i) sits at d * q + i
        return Fragment(
            under=nodes.repeat(max_len),
            tokens=torch.cat(tokens),
            parents=torch.where(idx < q, -1, idx - q),
            depth=idx // q + 1,
            score=torch.cat(scores),
            source=retrieved(max_len * q, tree.device),
        )


@RETRIEVERS.register("recycle", RecycleOptions)
def build_recycle(opts: RecycleOptions, vocab_size: int, device: torch.device) -> RecycleRetriever:
    return RecycleRetriever(opts, vocab_size, device)
