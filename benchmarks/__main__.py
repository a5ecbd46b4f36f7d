"""`make bench`: this project's decoding against transformers' own, on the same prompts in one run, greedy.

Rows: transformers `generate` (HF AR, the reference), transformers prompt-lookup decoding, our AR engine,
the default run (`make run`'s method on tree=auto: the cost model picks each step's tree), EAGLE-3 dense with the shipped drafter (when it exists), and the retrieval / pruning / Graft methods of
benchmarks/methods.py. All rows share the weights' dtype (--dtype) and device. Transformers' rows run the
model as transformers loads it (torch's linear kernels); ours run it with --linear (default auto: the
weights packed for oneDNN where this CPU supports the dtype and the packed kernel times faster,
models/linear.py), loaded a second time when that packs them, so the output check compares the two kernels too. Per prompt every method runs back to back, so load drift hits all alike. Our AR must
be at least as fast as HF AR and give its output token for token. In fp32 (the exact mode) every other
row must too; in bf16/fp16 a batched forward may flip a near-tie, so each of our tree methods is audited
against our AR instead (graft_lab.audit) and must have no unexplained divergence; HF prompt lookup's
share of identical prompts is reported.

    python -m benchmarks                       # quick: 3 MT-Bench prompts, 64 new tokens
    python -m benchmarks --full                # all 80 first turns, 256 new tokens
    python -m benchmarks --prompts 10 --max-new-tokens 128 --budget 60 --out results/bench.json
    python -m benchmarks --dtype bfloat16      # every row, transformers' included, in bf16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from graft_lab.audit import Auditor
from graft_lab.data import DATASETS
from graft_lab.decode import Generation, Method, StopRule
from graft_lab.drafters.eagle3_checkpoint import ASSETS, BUILTIN
from graft_lab.models.linear import resolve_linear
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.report import audit_line
from graft_lab.runner import ar_method, chat_prompt, eos_ids, timed
from graft_lab.verify import SamplingParams

SHIPPED = "smollm2-135m-instruct-eagle3"
Decoder = Callable[[torch.Tensor], Generation]  # prompt ids [S] -> the generation (HF rows: tokens only)


@dataclass
class Row:
    name: str
    decode: Decoder
    auditor: Auditor | None = None  # our tree methods: explains each prompt that differs from our AR
    wall: float = 0.0
    tokens: int = 0
    identical: int = 0  # prompts whose output equals HF AR's
    first_mismatch: int | None = None  # prompt index
    audit: dict | None = None  # Auditor.summarise(), outside fp32


def hf_decoder(target: Target, max_new: int, eos: tuple[int, ...], **kwargs) -> Decoder:
    model = target.model
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else eos[0]

    @torch.inference_mode()
    def decode(prompt: torch.Tensor) -> Generation:
        out = model.generate(prompt[None], attention_mask=torch.ones_like(prompt[None]), max_new_tokens=max_new,
                             do_sample=False, eos_token_id=list(eos), pad_token_id=pad, **kwargs)
        return Generation(tokens=out[0, prompt.numel():].tolist())

    return decode


def engine_decoder(target: Target, method: Method, stop: StopRule) -> Decoder:
    return lambda prompt: timed(target, method, prompt, SamplingParams(), stop, None)[0]


def engine_row(name: str, target: Target, method: Method, stop: StopRule) -> Row:
    return Row(name, engine_decoder(target, method, stop), Auditor(target, method))


def preset_methods(target: Target, drafter: str | None, budget: int) -> list[tuple[str, Method]]:
    """benchmarks/methods.py's presets (dense EAGLE-3, retrieval alone, dyn_depth, Graft modes) at budget K."""
    from benchmarks import methods

    names = [m for m in methods.METHODS if drafter or not methods.needs_drafter(m)]
    return [(f"{m} K={budget}", methods.build(m, target, drafter, budget, ())) for m in names]


def default_method(target: Target, drafter: str | None) -> tuple[str, Method] | None:
    """What `make run` decodes with (conf/config.yaml's method, on tree=auto), or None when it needs a drafter
    and there is none."""
    from benchmarks import methods
    from graft_lab.presets import compose_run

    name = str(compose_run([]).method.name)
    if methods.needs_drafter(name) and not drafter:
        return None
    return f"default: {name} tree=auto", methods.build(name, target, drafter, "auto", ())


def build_rows(hf: Target, target: Target, args, stop: StopRule) -> list[Row]:
    eos = stop.eos_ids
    rows = [Row("HF generate (AR)", hf_decoder(hf, args.max_new_tokens, eos)),
            Row("HF prompt lookup", hf_decoder(hf, args.max_new_tokens, eos, prompt_lookup_num_tokens=10)),
            Row("graft-lab AR", engine_decoder(target, ar_method(), stop))]
    if (default := default_method(target, args.drafter)) is not None:
        name, method = default
        rows.append(engine_row(name, target, method, stop))
    rows += [engine_row(name, target, m, stop) for name, m in preset_methods(target, args.drafter, args.budget)]
    return rows


def prompts(target: Target, n: int) -> list[torch.Tensor]:
    questions = DATASETS.build({"name": "mt_bench", "limit": n, "first_turn_only": True})
    return [chat_prompt(target, [{"role": "user", "content": q.turns[0]}]) for q in questions]


def report(rows: list[Row], n_prompts: int, args) -> str:
    ref = rows[0]
    lines = [f"{n_prompts} MT-Bench prompts, {args.max_new_tokens} new tokens, greedy, model {args.model} "
             f"({args.dtype}, {args.device}, every row; linear kernel: HF rows torch, ours {args.linear_used}), "
             f"drafter {args.drafter or '-'}", "",
             f"| {'method':<36} | tokens | wall s | tok/s  | vs HF AR | vs our AR | identical to HF AR |",
             f"|{'-' * 38}|--------|--------|--------|----------|-----------|--------------------|"]
    ours = rows[2]
    for r in rows:
        tps = r.tokens / r.wall if r.wall else 0.0
        ratio = ref.wall / r.wall if r.wall else 0.0
        vs_ours = ours.wall / r.wall if r.wall else 0.0
        same = "yes" if r.identical == n_prompts else f"NO {r.identical}/{n_prompts} (prompt {r.first_mismatch})"
        lines.append(f"| {r.name:<36} | {r.tokens:>6} | {r.wall:>6.2f} | {tps:>6.1f} | {ratio:>7.2f}x | {vs_ours:>8.2f}x | {same:<18} |")
    audited = [r for r in rows if r.audit]
    if audited:
        lines += ["", f"divergence audit against our AR ({args.dtype}; graft_lab.audit):"]
        lines += [f"  {r.name}: {audit_line({**r.audit, 'matches_baseline': None})}" for r in audited]
    return "\n".join(lines)


def lossless(rows: list[Row], n_prompts: int, exact: bool) -> bool:
    """fp32: every row equals HF AR. Otherwise: our AR equals HF AR (both 1-token forwards) and every audited
    row has no unexplained divergence."""
    if exact:
        return all(r.identical == n_prompts for r in rows)
    return rows[2].identical == n_prompts and all(r.audit["unexplained_divergences"] == 0 for r in rows if r.audit)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--full", action="store_true", help="80 prompts, 256 new tokens")
    ap.add_argument("--budget", type=int, default=60, help="K for the tree methods")
    ap.add_argument("--model", default=EMBEDDED, help="target (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--drafter", default=BUILTIN + SHIPPED if (ASSETS / SHIPPED / "config.json").is_file() else None,
                    help="EAGLE-3 checkpoint (default: the shipped one, if present)")
    ap.add_argument("--dtype", default="float32", help="the target's dtype, for every row (float32 is the exact mode)")
    ap.add_argument("--linear", default="auto", help="our rows' linear kernel: auto, onednn, torch (as model.linear)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", help="also write the table as JSON here")
    args = ap.parse_args(argv)
    if args.full:
        args.prompts, args.max_new_tokens = 80, 256
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf = Target(*load_model(args.model, dtype=args.dtype, device=args.device))  # as transformers runs it
    target = hf  # one model object for every row, unless ours packs its linear layers
    if resolve_linear(args.linear, hf.dtype, hf.device) == "onednn":  # a candidate: auto times it against torch's
        packed = Target(*load_model(args.model, dtype=args.dtype, device=args.device))
        packed.use_linear(args.linear)
        target = packed if packed.linear == "onednn" else hf
    exact = target.dtype == torch.float32
    for t in (hf, target):
        t.use_attention("sdpa" if t.device.type == "cpu" else "triton")
    stop = StopRule(args.max_new_tokens, eos_ids(target))
    args.linear_used = target.linear
    rows = build_rows(hf, target, args, stop)
    batch = prompts(target, args.prompts)
    for r in rows:  # warm-up: first-call allocations and lazy inits stay out of the timings
        r.decode(batch[0][:16])
    for i, prompt in enumerate(tqdm(batch, desc="bench", unit="prompt")):
        gens = []
        for r in rows:
            t0 = time.perf_counter()
            gens.append(r.decode(prompt))
            r.wall += time.perf_counter() - t0
            r.tokens += len(gens[-1].tokens)
            if gens[-1].tokens == gens[0].tokens:
                r.identical += 1
            elif r.first_mismatch is None:
                r.first_mismatch = i
        for r, gen in zip(rows, gens):
            if r.auditor is not None and not exact:
                r.auditor.add(i, 0, prompt, gen, gens[2])  # against our AR: the same-dtype 1-token baseline
    for r in rows:  # after every timing
        r.audit = r.auditor.summarise() if r.auditor is not None and not exact else None
    print(report(rows, len(batch), args))
    hf_ar, our_ar = rows[0], rows[2]
    ar_ok = our_ar.wall <= hf_ar.wall
    ok = lossless(rows, len(batch), exact)
    print(f"\nour AR vs HF generate: {hf_ar.wall / our_ar.wall:.2f}x ({'PASS' if ar_ok else 'FAIL'}: must be at least as fast)")
    print(f"every output equals HF AR token for token: {'PASS' if ok else 'FAIL'}" if exact else
          f"our AR equals HF AR, no unexplained divergence ({args.dtype}): {'PASS' if ok else 'FAIL'}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps([{"method": r.name, "dtype": args.dtype, "tokens": r.tokens, "wall_s": r.wall,
                                               "identical": r.identical == len(batch), "identical_prompts": r.identical,
                                               "audit": r.audit} for r in rows], indent=1))
    return 0 if ok and ar_ok else 1


if __name__ == "__main__":
    sys.exit(main())
