"""Acceptance length (tau) of an EAGLE-3 drafter with the project's decode loop, and a CLI:

    python -m graft_lab.train.evaluate --drafter DIR [--questions 80 --new-tokens 128 --dtype float32]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ..decode import Method, StopRule, generate
from ..drafters.eagle3 import Eagle3Drafter, build_eagle3, Eagle3Options
from ..drafters.eagle3_model import Eagle3Model
from ..graft import graft_root
from ..models.target import Target
from ..pruners.base import NoPruner
from ..retrievers.base import NoRetriever
from ..verify import SamplingParams

TREES = {"dense": dict(total=60, depth=7, top_k=10), "chain": dict(total=8, depth=7, top_k=1)}


def tau_of(target: Target, drafter, prompts, total: int, max_new: int, eos_ids=(), log=None) -> dict:
    """Greedy generation of every prompt; tau = tokens emitted per target verification (bonus included).
    `log(i, tokens, steps)` is called after each prompt."""
    method = Method(drafter, NoPruner(), NoRetriever(), graft_root, total)
    emitted = steps = 0
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        gen = generate(target, method, p.to(target.device), SamplingParams(), StopRule(max_new, tuple(eos_ids)))
        emitted += sum(s.accept_length for s in gen.steps)
        steps += len(gen.steps)
        if log is not None:
            log(i, sum(s.accept_length for s in gen.steps), len(gen.steps))
    return {"tau": emitted / max(steps, 1), "steps": steps, "tokens": emitted, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def measure(target: Target, net: Eagle3Model, prompts, trees=("dense", "chain"), max_new: int = 64, eos_ids=()) -> dict:
    """tau per tree shape for an in-memory network (training mode is restored after)."""
    was_training = net.training
    net.eval()
    embed = net.embed_tokens if net.embed_tokens is not None else target.model.get_input_embeddings()
    out = {}
    for name in trees:
        tree = TREES[name]
        drafter = Eagle3Drafter(net, embed, tree["depth"], tree["top_k"])
        out[name] = tau_of(target, drafter, prompts, tree["total"], max_new, eos_ids)
    net.train(was_training)
    return out


def main(argv=None) -> None:
    from ..models.target import EMBEDDED, load_model
    from .data import mtbench_prompts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=int, default=80)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--trees", default="dense,chain")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", help="also write the summary JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.target, dtype=args.dtype)
    prompts = mtbench_prompts(tok, args.questions)
    res = {"drafter": args.drafter, "target": args.target, "dtype": args.dtype, "questions": len(prompts),
           "new_tokens": args.new_tokens}
    for name in args.trees.split(","):
        tree = TREES[name]
        target = Target(model, tok)
        drafter = build_eagle3(Eagle3Options(path=args.drafter, depth=tree["depth"], top_k=tree["top_k"]), target)
        def log(i, tokens, steps, name=name):
            print(json.dumps({"tree": name, "question": i, "tokens": tokens, "steps": steps}), flush=True)

        res[name] = tau_of(target, drafter, prompts, tree["total"], args.new_tokens, (tok.eos_token_id,), log)
        print(name, json.dumps(res[name]), flush=True)
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
