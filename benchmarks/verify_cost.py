"""Verify-cost curve: one target forward over a tree of N nodes on top of a prompt-sized cache, timed
relative to N = 1 (the AR step) with the first --linear kernel. Sizes and kernels are interleaved per repeat
so machine noise hits them alike.

    python -m benchmarks.verify_cost [--prefix 256] [--sizes 1 8 16 32 64] [--repeats 30] [--linear torch onednn]
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
    ap.add_argument("--linear", nargs="+", default=["auto"], help="linear kernels to compare (as model.linear): "
                                                                   "auto, torch, onednn; each loads the model once")
    args = ap.parse_args()
    prompt = torch.randint(0, 1000, (args.prefix,))
    runs = {}
    for linear in args.linear:
        target = Target(*load_model(args.model, dtype=args.dtype))
        target.use_linear(linear)
        cache = target.new_cache(args.prefix + max(args.sizes) + 1)
        target.prefill(prompt, cache, want_aux=False)
        runs[linear] = (target, cache)
    trees = {n: probe_tree(n, 1000) for n in args.sizes}
    times = {(lin, n): [] for lin in runs for n in args.sizes}
    for rep in range(args.repeats + 3):
        for lin, (target, cache) in runs.items():
            for n in args.sizes:
                t0 = time.perf_counter()
                target.verify(trees[n], cache, want_aux=True)
                dt = time.perf_counter() - t0
                cache.crop(args.prefix)
                if rep >= 3:  # warm-up
                    times[lin, n].append(dt)
    base = statistics.median(times[args.linear[0], args.sizes[0]])
    print(f"verify cost on {args.model} ({args.dtype}), prefix {args.prefix}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}; x: against {args.sizes[0]} node(s) with linear={runs[args.linear[0]][0].linear}")
    print(f"{'nodes':>6} " + " ".join(f"{f'{t.linear} ms':>11} {'x':>6}" for t, _ in runs.values()))
    for n in args.sizes:
        meds = [statistics.median(times[lin, n]) for lin in runs]
        print(f"{n:>6} " + " ".join(f"{1000 * m:>11.2f} {m / base:>6.2f}" for m in meds))


if __name__ == "__main__":
    main()
