"""Where a draft level's time goes: torch.profiler over drafts of `depth` and of 1 level (the difference is
`depth - 1` further levels), per op its share of the level's op time and its calls per level, and the share
of wall time spent inside ops (the rest is Python). Shares and counts hold up under machine load; absolute
times do not, so none are printed.

    python -m benchmarks.draft_ops [--drafter-dtype auto] [--top-k 8] [--depth 7] [--rows 25]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from graft_lab.drafters import DRAFTERS
from graft_lab.drafters.base import DraftInput
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.profile import SHIPPED_DRAFTER, LevelCap


def op_times(drafter, step: DraftInput, cap: int, levels: int, repeats: int) -> tuple[dict[str, tuple[float, int]], float]:
    """{op: (self CPU us, calls)} over `repeats` drafts of `levels` levels, and their wall time in us."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            drafter.draft(step, cap, LevelCap(levels))
        wall = (time.perf_counter() - t0) * 1e6
    return {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}, wall


def level_table(drafter, target: Target, depth: int, cap: int = 64, context: int = 64, repeats: int = 20,
                rows: int = 25) -> str:
    width = len(target.aux_layers) * target.hidden_size
    feats = torch.randn(context + 1, width, dtype=target.dtype, device=target.device)
    tokens = torch.randint(0, target.vocab_size, (context + 1,), device=target.device)
    drafter.reset(context + cap + 1)
    with torch.inference_mode():
        drafter.draft(DraftInput(feats[:context], tokens[:context], 0), 1, LevelCap(1))
        step = DraftInput(feats[context:], tokens[context:], context)
        for _ in range(3):  # warm-up
            drafter.draft(step, cap, LevelCap(depth))
        (deep, wall_deep), (flat, wall_flat) = (op_times(drafter, step, cap, n, repeats) for n in (depth, 1))
    levels = repeats * (depth - 1)
    per = {k: ((deep.get(k, (0, 0))[0] - flat.get(k, (0, 0))[0]) / levels,
               (deep.get(k, (0, 0))[1] - flat.get(k, (0, 0))[1]) / levels) for k in set(deep) | set(flat)}
    total = sum(t for t, _ in per.values())
    inside = 100 * total * levels / max(wall_deep - wall_flat, 1e-9)
    lines = [f"per further draft level: {sum(c for _, c in per.values()):.0f} ops; {inside:.0f}% of wall time inside ops",
             f"  {'op':48s} {'% of op time':>12s} {'calls':>6s}"]
    for key, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"  {key:48s} {100 * t / total:12.1f} {c:6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32", help="the target's dtype")
    ap.add_argument("--drafter", default=SHIPPED_DRAFTER, help="EAGLE-3 checkpoint (default: the shipped drafter)")
    ap.add_argument("--drafter-dtype", default="auto", help="as drafter.dtype: auto, float32, bfloat16, float16")
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--linear", default="auto", help="the linear kernel (as model.linear): auto, onednn, torch")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    target = Target(model, tokenizer)
    target.use_linear(args.linear)  # the drafter follows the target's choice
    target.use_attention("sdpa")
    node = {"name": "eagle3", "path": args.drafter, "depth": args.depth, "top_k": args.top_k, "dtype": args.drafter_dtype}
    drafter = DRAFTERS.build(node, target=target)
    print(f"{args.model} ({args.dtype}), drafter {args.drafter} ({str(drafter.dtype).removeprefix('torch.')}), "
          f"top-k {args.top_k}, linear {target.linear}, {args.threads} thread(s)")
    print(level_table(drafter, target, args.depth, repeats=args.repeats, rows=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
