"""verify.attn=sdpa: grouped-query SDPA that folds the query heads onto their key/value head under a tree
mask (models/attention.py) against transformers' own SDPA path, which copies every key/value head per query
head (`repeat_kv`)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from graft_lab.models.attention import NAME, grouped_sdpa
from graft_lab.profile import probe_tree
from tiny import tiny_target


class Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def tree_mask(rows: int, prefix: int, seed: int) -> torch.Tensor:
    """[1, 1, T, prefix + T] additive: the whole prefix, then each node's random ancestors and itself."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, rows)]
    allowed = torch.eye(rows, dtype=torch.bool)
    for i in range(1, rows):
        allowed[i] |= allowed[parents[i]]
    mask = torch.zeros(1, 1, rows, prefix + rows)
    mask[0, 0, :, prefix:].masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask


@pytest.mark.parametrize("groups,rows,prefix", [(1, 5, 7), (2, 1, 9), (2, 6, 0), (3, 8, 40), (4, 17, 130)])
def test_grouped_sdpa_matches_transformers_sdpa(groups, rows, prefix):
    torch.manual_seed(groups * 100 + rows)
    kv_heads, dim = 2, 16
    q = torch.randn(1, rows, kv_heads * groups, dim).transpose(1, 2)  # [B, Hq, T, D], strided as the layers make it
    k = torch.randn(1, kv_heads, prefix + rows + 3, dim)[:, :, : prefix + rows]  # a view of a longer cache
    v = torch.randn(1, kv_heads, prefix + rows + 3, dim)[:, :, : prefix + rows]
    mask = tree_mask(rows, prefix, seed=rows)
    module = Module(groups)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=dim**-0.5)
    got, _ = grouped_sdpa(module, q, k, v, mask, scaling=dim**-0.5)
    assert got.shape == expected.shape == (1, rows, kv_heads * groups, dim) and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_maskless_forwards_keep_transformers_path():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    module = Module(2)
    expected, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.25)
    got, _ = grouped_sdpa(module, q, k, v, None, scaling=0.25)
    assert torch.equal(got, expected)  # prefill: the very same call


def test_a_masked_forward_with_many_rows_keeps_transformers_path(monkeypatch):
    """Folding repeats the mask per group; past 2 x Hq x D rows that outweighs the key/value copy it saves."""
    torch.manual_seed(1)
    kv_heads, groups, dim = 1, 3, 4  # 2 x Hq x D = 24: fold while (G - 1) x T < 24, i.e. T <= 11
    folded = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *a, **kw: folded.append(q.shape[1] == kv_heads) or real(q, *a, **kw))
    module = Module(groups)
    for rows, fold in ((11, True), (12, False), (40, False)):
        q = torch.randn(1, kv_heads * groups, rows, dim)
        k, v = torch.randn(1, kv_heads, 5 + rows, dim), torch.randn(1, kv_heads, 5 + rows, dim)
        mask = tree_mask(rows, 5, seed=rows)
        expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.5)
        folded.clear()
        got, _ = grouped_sdpa(module, q, k, v, mask, scaling=0.5)
        assert folded == [fold], rows
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_targets_verify_with_it_and_a_tree_verify_matches_eager():
    target = tiny_target("qwen3")
    assert target.attn == "sdpa" and target.model.config._attn_implementation == NAME
    tree = probe_tree(9, target.vocab_size)
    prompt = torch.arange(3, 20)
    outs = {}
    for attn in ("sdpa", "eager"):
        target.use_attention(attn)
        cache = target.new_cache(64)
        target.prefill(prompt, cache, want_aux=False)
        outs[attn] = target.verify(tree, cache, want_aux=False).logits
    torch.testing.assert_close(outs["sdpa"], outs["eager"], rtol=1e-5, atol=1e-5)
