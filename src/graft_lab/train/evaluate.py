"""Acceptance length (tau) of an EAGLE-3 drafter with the project's decode loop, and a CLI:

    python -m graft_lab.train.evaluate --drafter DIR [--questions 80 --new-tokens 128 --dtype float32]
    python -m graft_lab.train.evaluate --drafter DIR --questions 80 --turns 1,2  # and the 80 second turns
    python -m graft_lab.train.evaluate --drafter DIR --questions 0 --trees dense \
        --spec-bench ../shared/data/spec_bench/question.jsonl --per-category 10      # tau per category
    python -m graft_lab.train.evaluate --drafter DIR --replay ...  # the same tau, drafting cost only (train/replay.py)
    python -m graft_lab.train.evaluate --drafter DIR --forced --trees chain ...  # the chain's tau from training's
        # own forward (train/forced.py): `compare` it with a real chain run; also the top-1 / top-10 recall per step
        # and "wide", the tau of a tree of the chain's depth that holds every node's top 10 children
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..decode import Method, StopRule, generate
from ..drafters.eagle3 import Eagle3Drafter, build_eagle3, Eagle3Options
from ..drafters.eagle3_model import Eagle3Model
from ..graft import graft_root
from ..models.embedded import cache_root
from ..models.target import Target
from ..pruners.base import NoPruner
from ..retrievers.base import NoRetriever
from ..tree import CHAIN, tree_shape
from ..verify import SamplingParams

TREES = {"dense": tree_shape(60), "chain": CHAIN}  # the paper's dense tree and EAGLE-3's chain


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
        drafter = Eagle3Drafter(net, embed, tree.depth, tree.top_k)
        out[name] = tau_of(target, drafter, prompts, tree.total_tokens, max_new, eos_ids)
    net.train(was_training)
    return out


def labelled_prompts(tokenizer, questions: int, spec_bench: str | None, per_category: int) -> list[tuple[str, torch.Tensor]]:
    """(category, prompt ids): the first `questions` MT-Bench first turns (category "mt_bench"), then the first
    `per_category` first turns of each Spec-Bench category."""
    from ..data.base import DATASETS
    from .data import MT_BENCH_FIRST, mtbench_prompts, user_prompt

    out = [(MT_BENCH_FIRST, p) for p in (mtbench_prompts(tokenizer, questions) if questions else [])]
    if spec_bench:
        for q in DATASETS.build({"name": "spec_bench", "path": spec_bench, "per_category": per_category,
                                 "first_turn_only": True}):
            out.append((q.category, user_prompt(tokenizer, q.turns[0])))
    return out


def first_replies_dir() -> Path:
    return cache_root() / "first_replies"


def second_turns(model, tokenizer, questions: int, max_new: int, name: str = "",
                 cache: Path | None = None) -> list[tuple[str, torch.Tensor]]:
    """("mt_bench_turn2", prompt ids) for the first `questions` MT-Bench questions: the first turn, the target's own
    greedy reply to it (`regenerate`'s transformers `generate`, at most `max_new` tokens, in the model's dtype), then
    the second turn. The reply comes from the target alone, so every drafter meets the same second-turn prompts.
    Replies are cached in `cache` (default: first_replies/ under graft-lab's cache) for the target `name`, its
    weights, dtype, torch and CPU (bf16 numerics differ between CPUs), so the next drafter's A/B reads them back."""
    from ..profile import device_fingerprint
    from .data import MT_BENCH_SECOND, mtbench_questions
    from .regenerate import regenerate_batch
    from .replay import weights_digest

    cache = cache or first_replies_dir()
    cache.mkdir(parents=True, exist_ok=True)
    salt = [name, weights_digest(model), str(model.dtype), torch.__version__, device_fingerprint(model.device), max_new]
    out = []
    for q in tqdm(mtbench_questions()[:questions], desc="target's first replies", unit="question"):
        first = [{"role": "user", "content": q["turns"][0]}]
        path = cache / f"{hashlib.sha1(json.dumps(salt + [q['turns'][0]]).encode()).hexdigest()[:20]}.json"
        try:
            reply = json.loads(path.read_text())["reply"]
        except (OSError, ValueError, KeyError):
            reply = regenerate_batch(model, tokenizer, [first], max_new)[0][0]  # one at a time: no padding
            path.write_text(json.dumps({"target": name, "dtype": str(model.dtype), "reply": reply}))
        msgs = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": q["turns"][1]}]
        out.append((MT_BENCH_SECOND, torch.tensor(tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False))))
    return out


def by_category(labels: list[str], per_prompt: list[list[int]]) -> dict[str, float]:
    """tau per category: tokens / verifications pooled over the prompts of each label, in first-seen order."""
    per = {}
    for c, (tokens, steps) in zip(labels, per_prompt):
        agg = per.setdefault(c, [0, 0])
        agg[0] += tokens
        agg[1] += steps
    return {c: round(t / max(n, 1), 4) for c, (t, n) in per.items()}


def _brief(d: dict) -> dict:
    """`d` without its per-prompt lists (they go to --out, not to the terminal)."""
    return {k: v for k, v in d.items() if k not in ("per_prompt", "categories")}


def main(argv=None) -> None:
    from ..models.target import EMBEDDED, load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=int, default=80, help="MT-Bench first turns (0: none)")
    ap.add_argument("--turns", default="1", choices=("1", "2", "1,2"),
                    help="MT-Bench turns: 1, 2 (the second turn after the target's own greedy first reply), or 1,2")
    ap.add_argument("--spec-bench", help="a Spec-Bench question.jsonl: also report tau per category")
    ap.add_argument("--per-category", type=int, default=10, help="Spec-Bench questions per category")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--trees", default="dense,chain")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--replay", action="store_true",
                    help="replay the target's cached greedy continuations instead of verifying each tree "
                         "(train/replay.py): the drafter's cost only, after one reference pass per prompt")
    ap.add_argument("--forced", action="store_true",
                    help="the chain's tau from training's own forward (ttt_forward over the trainer's features) along "
                         "the target's cached greedy continuations (train/forced.py), and the top-1 / top-10 recall "
                         "per step and \"wide\" (every top-10 child to the chain's depth): in fp32 equal to a real chain "
                         "run unless training and inference disagree")
    ap.add_argument("--out", help="also write the summary JSON here")
    args = ap.parse_args(argv)
    unknown = [t for t in args.trees.split(",") if t not in TREES]
    if unknown:
        ap.error(f"unknown trees {unknown}; valid: {', '.join(TREES)}")
    if args.forced and (args.replay or args.trees != "chain"):
        ap.error("--forced measures the chain alone, without --replay: give --trees chain")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.target, dtype=args.dtype)
    turns = args.turns.split(",")
    labelled = labelled_prompts(tok, args.questions if "1" in turns else 0, args.spec_bench, args.per_category)
    if "2" in turns:
        labelled += second_turns(model, tok, args.questions, args.new_tokens, args.target)
    if not labelled:
        ap.error("no prompts: give --questions > 0 or --spec-bench")
    labels, prompts = [c for c, _ in labelled], [p for _, p in labelled]
    res = {"drafter": args.drafter, "target": args.target, "dtype": args.dtype, "prompts": len(prompts),
           "categories": labels,
           "new_tokens": args.new_tokens,
           "verification": "replay" if args.replay else "forced" if args.forced else "target"}
    replay = continuations = None
    if args.replay or args.forced:
        from .replay import ReplayTarget, references

        real = Target(model, tok)
        continuations = references(real, args.target, prompts, args.new_tokens)
        replay = ReplayTarget(real, prompts, continuations) if args.replay else None
    for name in args.trees.split(","):
        tree = TREES[name]
        target = Target(model, tok)
        drafter = build_eagle3(Eagle3Options(path=args.drafter, depth=tree.depth, top_k=tree.top_k), target)
        each = []  # [tokens, steps] per prompt, in prompt order: `graft_lab.train.compare` pairs two runs by it

        def log(i, tokens, steps, name=name, each=each):
            each.append([tokens, steps])
            print(json.dumps({"tree": name, "prompt": i, "category": labels[i], "tokens": tokens, "steps": steps}),
                  flush=True)

        if args.forced:
            from .forced import forced_tau

            res[name] = forced_tau(target, drafter.net, prompts, continuations, tree.depth, args.new_tokens,
                                   (tok.eos_token_id,), log)
            res["wide"] = res[name].pop("wide")  # every top-10 child to the chain's depth: `compare` pairs it too
            res["wide"]["by_category"] = by_category(labels, res["wide"]["per_prompt"])
        else:
            res[name] = tau_of(replay or target, drafter, prompts, tree.total_tokens, args.new_tokens,
                               (tok.eos_token_id,), log)
        res[name]["by_category"] = by_category(labels, each)
        res[name]["per_prompt"] = each
        print(name, json.dumps(_brief(res[name])), flush=True)
    print(json.dumps(_brief({k: _brief(v) if isinstance(v, dict) else v for k, v in res.items()})))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
