"""Prefill cost of retrieval's warm-up: recycle asks prefill for the target's top-k next tokens after each
distinct prompt token (read chunk by chunk from the final hidden states, never [S, V] logits). This times
prefill with and without that warm-up on the long-context set's prompts, interleaved per repeat, and prints
the warm-up's share (issue 15: at most 5% of plain prefill at 4k tokens).

    python -m benchmarks.prefill_cost [--lengths 1024 4096] [--top-k 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from graft_lab.data.long_context import LongContextOptions, long_context
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.prompts import chat_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--top-k", type=int, default=8, help="successors per distinct token (recycle's top_k)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, tok = load_model(args.model, dtype=args.dtype)
    target = Target(model, tok)
    questions = long_context(LongContextOptions(target_lengths=args.lengths, per_length=1, tokenizer=args.model))
    print(f"prefill cost on {args.model} ({args.dtype}), {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'tokens':>7} {'distinct':>9} {'plain ms':>10} {'warm-up ms':>11} {'share':>7}")
    for q in questions:
        ids = torch.tensor(chat_ids(tok, [{"role": "user", "content": q.turns[0]}]))
        times: dict[int, list[float]] = {0: [], args.top_k: []}
        for rep in range(args.repeats + 1):
            for k in times:  # interleaved: drifting load hits both alike
                cache = target.new_cache(ids.numel() + 1)
                t0 = time.perf_counter()
                target.prefill(ids, cache, want_aux=False, successors=k)
                if rep:  # the first round warms up
                    times[k].append(time.perf_counter() - t0)
        plain, warm = statistics.median(times[0]), statistics.median(times[args.top_k])
        print(f"{ids.numel():>7} {ids.unique().numel():>9} {1000 * plain:>10.0f} {1000 * (warm - plain):>11.0f} "
              f"{(warm - plain) / plain:>7.1%}")


if __name__ == "__main__":
    main()
