"""TreeKVCache: views of the filled part, in-place compaction to the accepted path."""

import torch

from graft_lab.models.cache import TreeKVCache


def test_update_returns_filled_views_and_compact_moves_accepted_nodes():
    cache = TreeKVCache(num_layers=2, max_len=32)
    layer = cache.layers[0]
    prefix = torch.randn(1, 2, 5, 4)
    k, v = layer.update(prefix, prefix + 1)
    assert k.shape == (1, 2, 5, 4) and torch.equal(k, prefix)
    tree = torch.randn(1, 2, 6, 4)
    k, v = layer.update(tree, tree + 1)
    assert k.shape == (1, 2, 11, 4)
    cache.layers[1].update(prefix, prefix)
    cache.layers[1].update(tree, tree)
    keep = torch.tensor([0, 2, 5])
    cache.compact(5, keep)
    assert cache.length == 8
    assert torch.equal(layer.keys[:, :, :5], prefix)
    assert torch.equal(layer.keys[:, :, 5:8], tree[:, :, keep])
    assert torch.equal(layer.values[:, :, 5:8], tree[:, :, keep] + 1)
    assert cache.get_seq_length() == 8


def test_crop_and_overflow():
    cache = TreeKVCache(num_layers=1, max_len=4)
    layer = cache.layers[0]
    layer.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    cache.crop(1)
    assert cache.length == 1
    try:
        layer.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    except RuntimeError as exc:
        assert "overflow" in str(exc)
    else:
        raise AssertionError("overflow not detected")
