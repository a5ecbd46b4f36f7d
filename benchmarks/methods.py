"""The method table on the embedded SmolLM2 target: AR, retrieval alone, dense EAGLE-3, dyn_depth alone
and Graft (root / tail / match), at each budget K, on the same prompts in one run, greedy.

Per prompt every method runs back to back (AR once), so machine-load drift hits all of them alike.
Columns: tau (tokens per step, bonus included), tok/s, speedup over AR, nodes per step drafted /
retrieved / verified (the tree), the share of accepted tokens that were retrieved, the retrieve+graft
share of step time and its milliseconds per step, and whether the output equals AR's.

    python -m benchmarks.methods --limit 2 --max-new-tokens 32            # a quick check
    python -m benchmarks.methods --spec-bench ../shared/data/spec_bench/question.jsonl --out results/methods.jsonl
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from graft_lab.data import DATASETS
from graft_lab.decode import Method, StopRule
from graft_lab.drafters import DRAFTERS
from graft_lab.drafters.eagle3_checkpoint import ASSETS
from graft_lab.drafters.none import NoDrafter
from graft_lab.graft import GRAFTS
from graft_lab.metrics import TurnStats, aggregate
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.pruners import PRUNERS
from graft_lab.retrievers import RETRIEVERS
from graft_lab.runner import ar_method, chat_prompt, eos_ids, timed
from graft_lab.verify import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = "builtin:smollm2-135m-instruct-eagle3"
SPEC_BENCH = ["translation", "summarization", "qa", "math_reasoning", "rag"]


@dataclass(frozen=True)
class Spec:
    """One row of the table: which parts make the method (config nodes, as in conf/)."""

    name: str
    eagle3: bool
    pruner: dict
    retriever: dict
    graft: str = "root"


def specs(pruner: dict, retriever: dict) -> list[Spec]:
    none = {"name": "none"}
    return [
        Spec("ngram", False, none, {"name": "ngram"}),
        Spec("recycle", False, none, {"name": "recycle"}),
        Spec("eagle3 dense", True, none, none),
        Spec("dyn_depth", True, pruner, none),
        *(Spec(f"graft {g}", True, pruner, retriever, g) for g in ("root", "tail", "match")),
    ]


def tree_shape(budget: int) -> tuple[int, int]:
    """(depth, top_k) of the conf/tree preset with this K; EAGLE's 7 x 10 otherwise."""
    for f in sorted((ROOT / "conf" / "tree").glob("*.yaml")):
        node = OmegaConf.load(f)
        if node.total_tokens == budget:
            return node.get("depth", 7), node.get("top_k", 10)
    return 7, 10


def build(spec: Spec, target: Target, drafter_path: str, budget: int) -> Method:
    retriever = RETRIEVERS.build(spec.retriever, vocab_size=target.vocab_size, device=target.device)
    if spec.eagle3:
        depth, top_k = tree_shape(budget)
        drafter = DRAFTERS.build({"name": "eagle3", "path": drafter_path, "depth": depth, "top_k": top_k}, target=target)
    else:
        drafter = NoDrafter()
    return Method(drafter, PRUNERS.build(spec.pruner), retriever, GRAFTS.build({"name": spec.graft}, retriever=retriever), budget)


def prompts(target: Target, args) -> list[torch.Tensor]:
    if args.spec_bench:
        node = {"name": "spec_bench", "path": args.spec_bench, "categories": SPEC_BENCH, "per_category": args.limit}
    else:
        node = {"name": "mt_bench", "limit": args.limit}
    questions = DATASETS.build({**node, "first_turn_only": True})
    return [chat_prompt(target, [{"role": "user", "content": q.turns[0]}]) for q in questions]


def row(name: str, budget: int, stats: list[TurnStats], base: list[TurnStats], matches: bool) -> dict:
    agg = aggregate(stats, base)
    phases = agg["phase_time_s"]
    step_time = sum(v for k, v in phases.items() if k != "prefill") or 1.0
    tokens = sum(sum(t.accept_lengths) for t in stats) or 1
    return {
        "method": name,
        "K": budget,
        "tau": agg["tau"],
        "tok_s": agg["tokens_per_s"],
        "speedup": agg["speedup"],
        "draft_step": agg["drafted_per_step"],
        "retr_step": agg["retrieved_per_step"],
        "verify_step": 1 + agg["drafted_per_step"] + agg["retrieved_per_step"],
        "acc_retr": sum(t.accepted_retrieved for t in stats) / tokens,
        "rg_share": (phases.get("retrieve", 0.0) + phases.get("graft", 0.0)) / step_time,
        "rg_ms": 1000 * (phases.get("retrieve", 0.0) + phases.get("graft", 0.0)) / max(agg["steps"], 1),
        "ms_step": 1000 * step_time / max(agg["steps"], 1),
        "lossless": matches,
    }


COLUMNS = ["method", "K", "tau", "tok_s", "speedup", "draft_step", "retr_step", "verify_step", "acc_retr", "rg_share", "rg_ms", "ms_step", "lossless"]


def markdown(rows: list[dict]) -> str:
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=SHIPPED if (ASSETS / SHIPPED.removeprefix("builtin:")).is_dir() else None,
                    help="EAGLE-3 checkpoint (default: the shipped one, if present); without one the EAGLE-3 rows are skipped")
    ap.add_argument("--pruner", default=str(ROOT / "conf" / "pruner" / "dyn_depth.yaml"), help="dyn_depth config file")
    ap.add_argument("--retriever", default=str(ROOT / "conf" / "retriever" / "recycle.yaml"), help="Graft's retriever config file")
    ap.add_argument("--ks", type=int, nargs="+", default=[60, 16, 32], help="budgets K")
    ap.add_argument("--limit", type=int, default=10, help="MT-Bench questions, or Spec-Bench questions per category")
    ap.add_argument("--spec-bench", default=None, help="Spec-Bench question.jsonl (5 categories) instead of MT-Bench")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="auto", help="auto (triton on CUDA, else sdpa), triton, sdpa or eager")
    ap.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    model, tokenizer = load_model(EMBEDDED, dtype=args.dtype, device=args.device)
    target = Target(model, tokenizer)
    target.use_attention(args.attn if args.attn != "auto" else ("triton" if target.device.type == "cuda" else "sdpa"))
    pruner, retriever = (OmegaConf.to_container(OmegaConf.load(p)) for p in (args.pruner, args.retriever))
    table = [s for s in specs(pruner, retriever) if args.drafter or not s.eagle3]
    if not args.drafter:
        print("no EAGLE-3 drafter (pass --drafter PATH): skipping the EAGLE-3, dyn_depth and Graft rows")
    methods = {(s.name, k): build(s, target, args.drafter, k) for k in args.ks for s in table}
    ar = ar_method()
    params, stop = SamplingParams(), StopRule(args.max_new_tokens, eos_ids(target))
    batch = prompts(target, args)
    timed(target, ar, batch[0][:8], params, StopRule(4), None)  # warm-up: first-call allocations
    base: list[TurnStats] = []
    stats = {key: [] for key in methods}
    same = {key: True for key in methods}
    bar = tqdm(total=len(batch) * (1 + len(methods)), desc="methods x prompts", unit="run")
    for prompt in batch:
        ref, st = timed(target, ar, prompt, params, stop, None)
        base.append(st)
        bar.update()
        for key, method in methods.items():
            gen, st = timed(target, method, prompt, params, stop, None)
            stats[key].append(st)
            same[key] &= gen.tokens == ref.tokens
            bar.set_postfix_str(f"{key[0]} K={key[1]}")
            bar.update()
    bar.close()
    rows = [row("AR", 1, base, base, True)]
    rows += [row(name, k, stats[(name, k)], base, same[(name, k)]) for k in args.ks for name in (s.name for s in table)]
    print(f"\n{len(batch)} prompts, {args.max_new_tokens} new tokens, greedy, {target.device}, drafter {args.drafter}\n")
    print(markdown(rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


if __name__ == "__main__":
    main()
