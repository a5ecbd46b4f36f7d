"""Does the dense tree rank its nodes by the right probabilities? The EAGLE-3 drafter keeps the nodes with the
highest cumulative draft log-probability; this measures greedy tau when those log-probabilities come from
softmax(logits / T) instead (T = 1 is the drafter as shipped). The top-k children of a node do not change with T,
only which branches the tree keeps, so the output is the target's whatever T (verification decides).

    python experiments/rank_temperature.py --drafter DIR --temperatures 0.7,1,1.5 --out-dir runs/eval/rank_t
    python -m graft_lab.train.compare runs/eval/rank_t/t1.json runs/eval/rank_t/t0.7.json

Each T writes an `evaluate --out`-style JSON (MT-Bench first turns, dense tree) that `graft_lab.train.compare` pairs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from graft_lab.drafters.eagle3 import Eagle3Options, build_eagle3
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.train.evaluate import TREES, labelled_prompts, tau_of


def tempered(drafter, temperature: float):
    """`drafter` ranking by softmax(logits / temperature): its network's logits, divided."""
    logits = drafter.net.logits
    drafter.net.logits = lambda hidden: logits(hidden).float() / temperature  # in fp32, as the drafter ranks
    return drafter


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--temperatures", default="0.7,1,1.5")
    ap.add_argument("--questions", type=int, default=80)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        temps = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        ap.error(f"--temperatures: comma-separated numbers, got '{args.temperatures}'")
    if any(t <= 0 for t in temps):
        ap.error(f"--temperatures must be > 0, got {args.temperatures}")
    model, tok = load_model(args.target, dtype=args.dtype)
    labelled = labelled_prompts(tok, args.questions, None, 0)
    labels, prompts = [c for c, _ in labelled], [p for _, p in labelled]
    tree = TREES["dense"]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for t in temps:
        target = Target(model, tok)
        opts = Eagle3Options(path=args.drafter, depth=tree.depth, top_k=tree.top_k)
        drafter = tempered(build_eagle3(opts, target), t)
        each = []
        res = tau_of(target, drafter, prompts, tree.total_tokens, args.new_tokens, (tok.eos_token_id,),
                     lambda i, tokens, steps: each.append([tokens, steps]))
        res["per_prompt"] = each
        out = args.out_dir / f"t{t:g}.json"
        out.write_text(json.dumps({"drafter": f"{args.drafter} ranked at T={t:g}", "target": args.target,
                                   "dtype": args.dtype, "new_tokens": args.new_tokens, "categories": labels,
                                   "dense": res}))
        print(f"T={t:g}: tau {res['tau']:.3f} over {res['steps']} verifications -> {out}", flush=True)


if __name__ == "__main__":
    main()
