"""Verify-cost curve: one target forward over a tree of N nodes on top of a prompt-sized cache, timed
relative to N = 1 (the AR step). Sizes are interleaved per repeat so machine noise hits them alike.

    python -m benchmarks.verify_cost [--prefix 256] [--sizes 1 8 16 32 64] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.profile import probe_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    model, tok = load_model(args.model, dtype=args.dtype)
    target = Target(model, tok)
    cache = target.new_cache(args.prefix + max(args.sizes) + 1)
    target.prefill(torch.randint(0, target.vocab_size, (args.prefix,)), cache, want_aux=False)
    trees = {n: probe_tree(n, target.vocab_size) for n in args.sizes}
    times: dict[int, list[float]] = {n: [] for n in args.sizes}
    for rep in range(args.repeats + 3):
        for n in args.sizes:
            t0 = time.perf_counter()
            target.verify(trees[n], cache, want_aux=True)
            dt = time.perf_counter() - t0
            cache.crop(args.prefix)
            if rep >= 3:  # warm-up
                times[n].append(dt)
    base = statistics.median(times[args.sizes[0]])
    print(f"verify cost on {args.model} ({args.dtype}), prefix {args.prefix}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}")
    print(f"{'nodes':>6} {'ms':>8} {'x vs 1':>8}")
    for n in args.sizes:
        med = statistics.median(times[n])
        print(f"{n:>6} {1000 * med:>8.2f} {med / base:>8.2f}")


if __name__ == "__main__":
    main()
