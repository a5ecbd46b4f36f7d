"""A test-only retriever that knows the reference continuation and proposes it with deliberate errors,
so the engine sees long accepted paths, partial matches and EOS inside an accepted path."""

from __future__ import annotations

import torch

from graft_lab.tree import DraftTree, Source


class OracleRetriever:
    prefill_top_k = 0

    def __init__(self, reference: list[int], vocab: int, seed: int = 0, error_rate: float = 0.15, branch: int = 2):
        self.reference = reference
        self.vocab = vocab
        self.g = torch.Generator().manual_seed(seed)
        self.error_rate = error_rate
        self.branch = branch
        self.emitted = 0

    def reset(self, prompt, successors) -> None:
        self.emitted = 0

    def extend(self, tokens: torch.Tensor) -> None:
        self.emitted += tokens.numel()

    def retrieve(self, budget: int) -> DraftTree:
        """A chain of the true next tokens (sometimes corrupted) plus random side branches."""
        root = self.reference[self.emitted - 1] if self.emitted <= len(self.reference) else 0
        tree = DraftTree.root(root)
        truth = self.reference[self.emitted : self.emitted + budget]
        if budget <= 1 or not truth:
            return tree
        chain = torch.tensor(truth)
        wrong = torch.rand(chain.numel(), generator=self.g) < self.error_rate
        chain = torch.where(wrong, torch.randint(0, self.vocab, chain.shape, generator=self.g), chain)
        n = chain.numel()
        tokens = [chain]
        parents = [torch.arange(-1, n - 1)]
        under = [torch.zeros(n, dtype=torch.long)]
        if self.branch:
            side = torch.randint(0, self.vocab, (self.branch * n,), generator=self.g)
            tokens.append(side)
            parents.append(torch.arange(n).repeat(self.branch) - 1)  # hang under chain nodes (or the root)
            under.append(torch.zeros(self.branch * n, dtype=torch.long))
        tree = tree.add_subtree(torch.cat(under), torch.cat(tokens), torch.cat(parents),
                                -torch.arange(sum(t.numel() for t in tokens), dtype=torch.float32), Source.RETRIEVED)
        return tree.cut(budget)

    def observe(self, tree, logits) -> None:
        pass
