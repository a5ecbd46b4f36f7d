"""Tree-attention kernel against transformers' SDPA path, per layer, with 8B-like heads (Hq 32, Hkv 8, D 128), bf16.

Verification is memory bound: every step reads the whole KV cache once per layer. The baseline is what
`verify.attn=sdpa` runs: transformers' sdpa_attention_forward with a [1, 1, T, S] float mask (which
forces repeat_kv and a masked SDPA kernel). Bandwidth counts the KV bytes read once, against the
H200 / H100 peaks. The L2 is flushed before every timed call, so short prefixes are not served from it.

    python -m benchmarks.tree_attention                                  # the full table, CUDA
    python -m benchmarks.tree_attention --prefixes 4096 --nodes 60 --repeats 20

Without CUDA it says so, runs a tiny correctness smoke in Triton's interpreter, and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import torch

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
PEAK_TBPS = {"H200": 4.8, "H100 SXM": 3.35}
WARMUP = 10
L2_FLUSH_BYTES = 256 << 20  # larger than any Hopper L2 (50-60 MiB)


def random_tree_mask(nodes: int, generator: torch.Generator) -> torch.Tensor:
    """[1, T, T] ancestor mask of a random tree whose parents precede their children."""
    mask = torch.eye(nodes, dtype=torch.bool)
    for node in range(1, nodes):
        parent = int(torch.randint(0, node, (), generator=generator))
        mask[node] |= mask[parent]
    return mask[None]


def median_ms(fn, repeats: int, flush: torch.Tensor | None, warmup: int = WARMUP) -> float:
    """Median of `repeats` timings after a warm-up: CUDA events, each after an L2 flush, on a GPU;
    the wall clock on CPU (Triton's interpreter; `flush` None)."""
    for _ in range(warmup):
        fn()
    if flush is None:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(prefixes: list[int], node_counts: list[int], repeats: int, device: str = "cuda",
          heads: tuple[int, int, int] = (Q_HEADS, KV_HEADS, HEAD_DIM), warmup: int = WARMUP) -> list[dict]:
    """Print the table and return its rows. On CPU (tiny heads, Triton's interpreter) it runs the same code
    with wall-clock timings: a smoke of this benchmark, not a measurement."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from graft_lab.kernels import pack_tree_mask, tree_attention

    q_heads, kv_heads, head_dim = heads
    device, dtype = torch.device(device), torch.bfloat16
    module = SimpleNamespace(num_key_value_groups=q_heads // kv_heads, is_causal=True)
    cuda = device.type == "cuda"
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device) if cuda else None
    generator = torch.Generator().manual_seed(0)
    label = torch.cuda.get_device_name(device) if cuda else "CPU (Triton interpreter)"
    print(f"device: {label}; Hq {q_heads}, Hkv {kv_heads}, D {head_dim}, bf16, batch 1")
    peaks = "  ".join(f"%{name}" for name in PEAK_TBPS)
    print(f"{'prefix':>7} {'T':>4} {'sdpa us':>9} {'tree us':>9} {'speedup':>8} {'GB/s':>7}  {peaks}  {'max|diff|':>9}")
    rows = []
    for prefix in prefixes:
        for nodes in node_counts:
            seq = prefix + nodes
            q = torch.randn(1, q_heads, nodes, head_dim, device=device, dtype=dtype)
            k = torch.randn(1, kv_heads, seq, head_dim, device=device, dtype=dtype)
            v = torch.randn(1, kv_heads, seq, head_dim, device=device, dtype=dtype)
            tree_mask = random_tree_mask(nodes, generator).to(device)
            float_mask = torch.zeros(1, 1, nodes, seq, device=device, dtype=dtype)
            float_mask[..., prefix:].masked_fill_(~tree_mask[:, None], torch.finfo(dtype).min)
            bits = pack_tree_mask(tree_mask)  # once per verification step, shared by all layers

            def sdpa():
                return sdpa_attention_forward(module, q, k, v, float_mask, scaling=head_dim**-0.5)[0]

            def tree():
                return tree_attention(q, k, v, bits)

            diff = (tree().transpose(1, 2).float() - sdpa().float()).abs().max().item()
            sdpa_ms = median_ms(sdpa, repeats, flush, warmup)
            tree_ms = median_ms(tree, repeats, flush, warmup)
            kv_bytes = 2 * kv_heads * seq * head_dim * k.element_size()
            gbps = kv_bytes / (tree_ms * 1e-3) / 1e9
            shares = "  ".join(f"{100 * gbps / (tbps * 1e3):>{len(name) + 1}.0f}" for name, tbps in PEAK_TBPS.items())
            print(
                f"{prefix:>7} {nodes:>4} {sdpa_ms * 1e3:>9.1f} {tree_ms * 1e3:>9.1f} "
                f"{sdpa_ms / tree_ms:>7.2f}x {gbps:>7.0f}  {shares}  {diff:>9.2e}"
            )
            rows.append({"prefix": prefix, "nodes": nodes, "sdpa_us": sdpa_ms * 1e3, "tree_us": tree_ms * 1e3,
                         "speedup": sdpa_ms / tree_ms, "gbps": gbps, "max_abs_diff": diff})
    print("speedup = sdpa / tree; GB/s counts K and V read once; peaks: "
          + ", ".join(f"{name} {tbps} TB/s" for name, tbps in PEAK_TBPS.items()))
    return rows


def interpreter_smoke() -> None:
    """A tiny case through Triton's interpreter against the float64 reference."""
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' definition
    try:
        from graft_lab.kernels import tree_attention, tree_attention_reference
    except ImportError as error:
        print(f"interpreter smoke skipped: {error}")
        return
    generator = torch.Generator().manual_seed(0)
    nodes, prefix = 7, 37
    q = torch.randn(1, 4, nodes, 32, generator=generator).bfloat16()
    k = torch.randn(1, 2, prefix + nodes, 32, generator=generator).bfloat16()
    v = torch.randn(1, 2, prefix + nodes, 32, generator=generator).bfloat16()
    mask = random_tree_mask(nodes, generator)
    error = (tree_attention(q, k, v, mask).double() - tree_attention_reference(q, k, v, mask)).abs().max().item()
    print(f"interpreter smoke (bf16, T {nodes}, prefix {prefix}): max |error| vs float64 reference {error:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 32, 60])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/tree_attention.py: no CUDA device here, nothing to time (the table needs a Hopper GPU).")
        interpreter_smoke()
        return 0
    bench(args.prefixes, args.nodes, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
