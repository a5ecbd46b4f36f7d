"""A preallocated KV cache that speculative decoding can compact in place.

transformers' StaticCache returns the whole `max_len` buffer to attention every step, so every verify
pays for the empty tail. This cache returns views of the filled part only, and `compact` moves the
accepted tree nodes down to the prefix with one small gather per layer: no re-prefill, no full copy.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class TreeKVLayer(CacheLayerMixin):
    """One layer's keys and values, [B, H, max_len, D], allocated on first write."""

    is_sliding = False

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, dk = key_states.shape
        self.keys = key_states.new_empty(b, h, self.max_len, dk)
        self.values = value_states.new_empty(b, h, self.max_len, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states, value_states: [B, H, T, D]; returns views [B, H, length + T, D]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        end = self.length + t
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} > max_len {self.max_len}")
        self.keys[:, :, self.length : end] = key_states
        self.values[:, :, self.length : end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Move entries start + keep[i] to start + i, then drop everything after them."""
        # keep: [M] ascending offsets relative to `start`
        if self.is_initialized:
            dst = slice(start, start + keep.numel())
            self.keys[:, :, dst] = self.keys[:, :, start + keep]
            self.values[:, :, dst] = self.values[:, :, start + keep]
        self.length = start + keep.numel()

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @torch.inference_mode()
    def fill_random(self, length: int, generator: torch.Generator | None = None) -> None:
        """Pretend `length` positions are committed, holding random keys and values (for cost measurement:
        attention then costs what it would after a real prefill of that length, without running one)."""
        if not self.is_initialized:
            raise RuntimeError("fill_random needs a layer that has seen one forward (its shapes)")
        if length > self.max_len:
            raise RuntimeError(f"KV cache overflow: {length} > max_len {self.max_len}")
        for buf in (self.keys, self.values):  # drawn where the buffer lives: no host round trip on a GPU
            noise = torch.randn(buf[:, :, :length].shape, generator=generator, dtype=torch.float32, device=buf.device)
            buf[:, :, :length] = noise.to(buf)
        self.length = length


class TreeKVCache(Cache):
    """A transformers `Cache` made of `TreeKVLayer`s; `length` is the number of committed positions."""

    def __init__(self, num_layers: int, max_len: int):
        super().__init__(layers=[TreeKVLayer(max_len) for _ in range(num_layers)])
        self.max_len = max_len

    @property
    def length(self) -> int:
        return self.layers[0].length

    def compact(self, start: int, keep: torch.Tensor) -> None:
        for layer in self.layers:
            layer.compact(start, keep)

    def crop(self, length: int) -> None:
        for layer in self.layers:
            layer.crop(length)

    def fill_random(self, length: int, seed: int = 0) -> None:
        first = self.layers[0]
        generator = torch.Generator(first.keys.device if first.is_initialized else "cpu").manual_seed(seed)
        for layer in self.layers:
            layer.fill_random(length, generator)
