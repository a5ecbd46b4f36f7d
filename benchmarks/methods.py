"""The method table on the embedded SmolLM2 target: AR, retrieval alone, dense EAGLE-3, dyn_depth alone
and Graft (root / tail / match), at each budget K, on the same prompts in one run, greedy.

Per prompt every method runs back to back (AR once), so machine-load drift hits all of them alike.
Columns: tau (tokens per step, bonus included), tok/s, speedup over AR, nodes per step drafted /
retrieved / verified (the tree), the share of accepted tokens that were retrieved, the retrieve+graft
share of step time and its milliseconds per step, and whether the output equals AR's. A second pair of
tables gives tau and speedup per category (MT-Bench counts as one, as in Spec-Bench) and their means.

Each finished prompt is appended to --raw, so a long run can be stopped, resumed, or reported at any point:

    python -m benchmarks.methods --mt-bench 2 --max-new-tokens 32                      # a quick check
    python -m benchmarks.methods --spec-bench ../shared/data/spec_bench/question.jsonl --raw results/methods/raw.jsonl
    python -m benchmarks.methods --report results/methods/raw.jsonl                   # the tables from a (partial) run
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from graft_lab.data import DATASETS, Question
from graft_lab.decode import Method, StopRule
from graft_lab.drafters.eagle3_checkpoint import ASSETS
from graft_lab.metrics import TurnStats, aggregate
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.presets import build_preset, preset
from graft_lab.runner import ar_method, chat_prompt, eos_ids, timed
from graft_lab.verify import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = "builtin:smollm2-135m-instruct-eagle3"
AR = ("AR", 1)
SPEC_BENCH = ["translation", "summarization", "qa", "math_reasoning", "rag"]


METHODS = ["pld", "recycle", "eagle3_dense", "dyn_depth", "graft_root", "graft_tail", "graft_match"]  # conf/method/


def needs_drafter(name: str) -> bool:
    return preset(name)[0].method.parts.get("drafter", "none") != "none"


def budget(value: str) -> int | str:
    """A --ks entry: a fixed budget K, or `auto` (tree=auto: the cost model picks each step's tree)."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a budget is a positive integer K or 'auto', got '{value}'") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"a budget K must be >= 1, got {k}")
    return k


def build(name: str, target: Target, drafter_path: str | None, k: int | str, overrides: tuple[str, ...]) -> Method:
    """The method exactly as `python run.py method=NAME` builds it: at a fixed budget K (shape: tree_shape(K),
    tree.plan=fixed, whatever the preset's tree), or with K='auto' on tree=auto (the cost model, its cap)."""
    extra = (*overrides, f"drafter.path={drafter_path}") if drafter_path and needs_drafter(name) else overrides
    if k == "auto":
        return build_preset(target, name, None, ("tree=auto", *extra))
    return build_preset(target, name, k, ("tree.plan=fixed", *extra))


def interleave(questions: list[tuple[str, Question]]) -> list[tuple[str, Question]]:
    """Round-robin over the fine categories (file order within each), so a run stopped early is still a
    balanced sample of them."""
    rank: dict[str, int] = defaultdict(int)
    keyed = []
    for order, (group, q) in enumerate(questions):
        keyed.append((rank[q.category], order, group, q))
        rank[q.category] += 1
    return [(group, q) for *_, group, q in sorted(keyed, key=lambda t: t[:2])]


def prompts(target: Target, args) -> list[tuple[str, str, torch.Tensor]]:
    """(group, category, prompt ids): MT-Bench first turns (one group, as in Spec-Bench) and Spec-Bench's five."""
    questions = [("mt_bench", q) for q in DATASETS.build({"name": "mt_bench", "limit": args.mt_bench, "first_turn_only": True})]
    if args.spec_bench:
        node = {"name": "spec_bench", "path": args.spec_bench, "categories": SPEC_BENCH, "per_category": args.per_category}
        questions += [(q.category, q) for q in DATASETS.build({**node, "first_turn_only": True})]
    return [(group, q.category, chat_prompt(target, [{"role": "user", "content": q.turns[0]}])) for group, q in interleave(questions)]


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


def records_table(records: list[dict]) -> tuple[list[dict], str]:
    """The overall rows and the per-category tables from per-prompt records (prompts every method finished)."""
    by_key: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for r in records:
        by_key[(r["method"], r["K"])][r["prompt"]] = r
    base = by_key[AR]
    done = sorted(set(base).intersection(*(set(v) for v in by_key.values())))
    turns = lambda key, ids: [TurnStats(**by_key[key][i]["stats"]) for i in ids]
    keys = [key for key in by_key if key != AR]
    rows = [row("AR", 1, turns(AR, done), turns(AR, done), True)]
    rows += [row(m, k, turns((m, k), done), turns(AR, done), all(by_key[(m, k)][i]["identical"] for i in done))
             for m, k in keys]
    tables = []
    for figure, field in (("tau", "group"), ("speedup", "group"), ("tau", "category")):
        names = list(dict.fromkeys(base[i][field] for i in done))
        ids = {c: [i for i in done if base[i][field] == c] for c in names}
        lines = ["| method | K | " + " | ".join(f"{c} ({len(ids[c])})" for c in names) + " | mean |",
                 "|---|---|" + "---|" * (len(names) + 1)]
        for key in keys:
            values = [aggregate(turns(key, ids[c]), turns(AR, ids[c]))[figure] for c in names]
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {sum(values) / len(values):.2f} |")
        tables.append(f"{figure} by {field} (mean: unweighted over the columns):\n" + "\n".join(lines))
    return rows, f"{len(done)} prompts finished by every method\n\n" + markdown(rows) + "\n\n" + "\n\n".join(tables)


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=SHIPPED if (ASSETS / SHIPPED.removeprefix("builtin:")).is_dir() else None,
                    help="EAGLE-3 checkpoint (default: the shipped one, if present); without one the EAGLE-3 rows are skipped")
    ap.add_argument("--override", nargs="*", default=[], help="run.py overrides for every method, e.g. retriever=ngram pruner.thresholds=[0.5,0.3,0.1]")
    ap.add_argument("--ks", type=budget, nargs="+", default=[60, 32, 16],
                    help="budgets K (fixed trees), or auto (tree=auto: the cost model picks each step's tree)")
    ap.add_argument("--methods", nargs="+", default=METHODS, help=f"method presets (conf/method/), default: {' '.join(METHODS)}")
    ap.add_argument("--mt-bench", type=int, default=80, help="MT-Bench first turns")
    ap.add_argument("--spec-bench", default=None, help="Spec-Bench question.jsonl: adds its 5 categories")
    ap.add_argument("--per-category", type=int, default=10, help="Spec-Bench questions per category")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts (categories round-robin)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--linear", default="auto", help="the linear layers' kernel (as model.linear): auto, onednn, torch")
    ap.add_argument("--attn", default="auto", help="auto (triton on CUDA, else sdpa), triton, sdpa or eager")
    ap.add_argument("--raw", default=None, help="per-prompt stats, one JSON line per prompt and method; a rerun skips finished prompts")
    ap.add_argument("--report", default=None, help="print the tables from this --raw file and exit")
    ap.add_argument("--out", default=None, help="also write the overall rows as JSON lines here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.report:
        records = read_records(Path(args.report))
        if not records:
            raise SystemExit(f"benchmarks.methods: no records in {args.report} (a --raw file of a run)")
        rows, text = records_table(records)
        print(text)
        return rows
    model, tokenizer = load_model(EMBEDDED, dtype=args.dtype, device=args.device)
    target = Target(model, tokenizer)
    target.use_linear(args.linear)
    target.use_attention(args.attn if args.attn != "auto" else ("triton" if target.device.type == "cuda" else "sdpa"))
    table = [m for m in args.methods if args.drafter or not needs_drafter(m)]
    if not args.drafter:
        print("no EAGLE-3 drafter (pass --drafter PATH): skipping the EAGLE-3, dyn_depth and Graft rows")
    overrides = tuple(args.override)
    methods = {(m, k): build(m, target, args.drafter, k, overrides) for k in args.ks for m in table}
    ar = ar_method()
    params, stop = SamplingParams(), StopRule(args.max_new_tokens, eos_ids(target))
    batch = prompts(target, args)[: args.limit]
    raw = Path(args.raw) if args.raw else None
    records = read_records(raw) if raw else []
    finished = {r["prompt"] for r in records if r["method"] == "AR"}
    timed(target, ar, batch[0][2][:8], params, StopRule(4), None)  # warm-up: first-call allocations
    bar = tqdm(total=len(batch) * (1 + len(methods)), initial=len(finished) * (1 + len(methods)), desc="methods x prompts", unit="run")
    for i, (group, category, prompt) in enumerate(batch):
        if i in finished:
            continue
        ref, st = timed(target, ar, prompt, params, stop, None)
        done = [{"prompt": i, "group": group, "category": category, "method": "AR", "K": 1, "identical": True, "stats": asdict(st)}]
        bar.update()
        for (name, k), method in methods.items():
            bar.set_postfix_str(f"{name} K={k}")
            gen, st = timed(target, method, prompt, params, stop, None)
            done.append({"prompt": i, "group": group, "category": category, "method": name, "K": k,
                         "identical": gen.tokens == ref.tokens, "stats": asdict(st)})
            bar.update()
        records += done
        if raw:
            raw.parent.mkdir(parents=True, exist_ok=True)
            with raw.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in done))
    bar.close()
    rows, text = records_table(records)
    print(f"\n{args.max_new_tokens} new tokens, greedy, {target.device}, {args.dtype}, drafter {args.drafter}, overrides {list(overrides)}")
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


if __name__ == "__main__":
    main()
