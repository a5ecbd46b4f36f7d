"""Issue 15's GPU check, one run: the tree-attention kernel against SDPA (benchmarks/tree_attention.py), then the
cost profile (graft_lab.profile.measure) of 8B-shaped random-weight Llama-3.1-8B and Qwen3-8B targets in bf16
at prefixes 1k and 4k, verification through SDPA and through the Triton kernel. Sized for under 8 minutes on
one H200; without CUDA (`--mode cpu`, the default there) it runs the same steps with tiny shapes and Triton's
interpreter, so CI exercises it.

    benchmarks/gpu_check.sh                        # gpu mode where CUDA is, cpu mode elsewhere
    benchmarks/gpu_check.sh --mode gpu --out DIR   # fails at once, in one line, without CUDA

Writes summary.json and summary.md into --out, else $OUT, else results/gpu_check/. A step that fails is
recorded (its error in the summary) and the next one runs; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from graft_lab.errors import ConfigError

DEADLINE_S = 450.0  # the whole run, with margin under 8 minutes; shrinks the profiles' repeat budget
BACKENDS = ("sdpa", "triton")
LLAMA_8B = ("random:llama?seed=0&hidden=4096&layers=32&heads=32&kv_heads=8&head_dim=128&intermediate=14336"
            "&vocab=128256&ctx=131072&std=0.02")  # Llama-3.1-8B's shape
QWEN3_8B = ("random:qwen3?seed=0&hidden=4096&layers=36&heads=32&kv_heads=8&head_dim=128&intermediate=12288"
            "&vocab=151936&ctx=40960&std=0.02")  # Qwen3-8B's shape


@dataclass(frozen=True)
class Plan:
    """Everything the two modes differ in."""

    mode: str
    device: str
    kernel_prefixes: tuple[int, ...]
    kernel_nodes: tuple[int, ...]
    kernel_heads: tuple[int, int, int]  # query heads, kv heads, head dim
    kernel_repeats: int
    kernel_warmup: int
    models: dict[str, str]  # name -> random:... spec (graft_lab.models.random_model)
    prefixes: tuple[int, ...]  # profile prefixes
    cap: int  # largest tree profiled
    repeats: int  # profile repeats (medians), each a shuffled sweep over every (prefix, size)
    budget_s: float  # no repeat of a profile starts after this long (its warm-up sweep included, which always runs)
    dtype: torch.dtype = torch.bfloat16


GPU = Plan("gpu", "cuda", kernel_prefixes=(1024, 4096, 16384, 65536), kernel_nodes=(16, 32, 60),
           kernel_heads=(32, 8, 128), kernel_repeats=50, kernel_warmup=10,
           models={"llama-3.1-8b": LLAMA_8B, "qwen3-8b": QWEN3_8B}, prefixes=(1024, 4096), cap=64, repeats=10,
           budget_s=60.0)
CPU = Plan("cpu", "cpu", kernel_prefixes=(64,), kernel_nodes=(8, 20), kernel_heads=(4, 2, 32), kernel_repeats=1,
           kernel_warmup=0,
           models={"llama-tiny": "random:llama?seed=0&hidden=64&layers=4&heads=4&kv_heads=2&vocab=512&ctx=512",
                   "qwen3-tiny": "random:qwen3?seed=0&hidden=64&layers=4&heads=4&kv_heads=2&vocab=512&ctx=512"},
           prefixes=(16, 64), cap=6, repeats=1, budget_s=15.0)


class Skip(Exception):
    """A step that cannot run here; its message says why."""


@dataclass
class Step:
    name: str
    status: str = "pending"  # ok | skipped | failed
    elapsed_s: float = 0.0
    detail: str = ""


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_step(steps: list[Step], name: str, fn):
    """Run fn(); record its status and time. A failure is printed and recorded, never raised."""
    step = Step(name)
    steps.append(step)
    print(f"\n=== {name}", flush=True)
    t0 = time.perf_counter()
    result = None
    try:
        result = fn()
        synchronize()  # an asynchronous CUDA error belongs to this step
        step.status = "ok"
    except Skip as why:
        step.status, step.detail = "skipped", str(why)
        print(f"skipped: {why}")
    except Exception as exc:  # noqa: BLE001 - one broken step must not cost the GPU session the others
        traceback.print_exc()
        step.status, step.detail = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    step.elapsed_s = time.perf_counter() - t0
    print(f"=== {name}: {step.status} in {step.elapsed_s:.1f} s", flush=True)
    return result


def triton_ready(plan: Plan) -> None:
    """Raise Skip when the Triton kernel cannot run in this process."""
    if importlib.util.find_spec("triton") is None:
        raise Skip("the triton package is not installed (pip install triton)")
    if plan.mode == "cpu":
        from graft_lab.kernels import tree_attention_kernel

        if not tree_attention_kernel.INTERPRETED:
            raise Skip("graft_lab.kernels was imported before TRITON_INTERPRET=1 was set, and there is no GPU")


def kernel_step(plan: Plan) -> dict:
    from benchmarks.tree_attention import PEAK_TBPS, bench

    triton_ready(plan)
    rows = bench(list(plan.kernel_prefixes), list(plan.kernel_nodes), plan.kernel_repeats, device=plan.device,
                 heads=plan.kernel_heads, warmup=plan.kernel_warmup)
    out = {"heads": dict(zip(("q_heads", "kv_heads", "head_dim"), plan.kernel_heads)), "dtype": "bfloat16",
           "timing": ("CUDA events, L2 flushed" if plan.mode == "gpu"
                      else "wall clock in Triton's interpreter: a smoke, not a timing"),
           "rows": rows}
    h200 = PEAK_TBPS["H200"] * 1e3
    goal = [r for r in rows if r["prefix"] == 4096 and r["nodes"] == 60]
    if goal:  # issue 6's bar: >= 1.5x SDPA at prefix 4k, T 60; within 2x of reading the KV once at peak bandwidth
        r = goal[0]
        out["issue6_target"] = {"speedup": r["speedup"], "speedup_ok": r["speedup"] >= 1.5,
                                "h200_bandwidth_share": r["gbps"] / h200, "bandwidth_ok": r["gbps"] >= h200 / 2}
    return out


def build_target(spec: str, plan: Plan):
    from graft_lab.models.random_model import RandomSpec, random_model
    from graft_lab.models.target import Target

    t0 = time.perf_counter()
    model = random_model(RandomSpec.parse(spec), plan.dtype, plan.device)
    synchronize()
    target = Target(model, tokenizer=None)
    init_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    print(f"built {spec} on {plan.device} in {plan.dtype}: {params / 1e6:,.1f}M parameters in {init_s:.1f} s")
    return target, init_s, params


def profile_step(target, spec: str, backend: str, plan: Plan, budget_s: float, out_path: Path) -> dict:
    from graft_lab.drafters.none import NoDrafter
    from graft_lab.profile import describe, measure, profile_key

    if backend == "triton":
        triton_ready(plan)
    target.use_attention(backend)
    key = profile_key(target, spec, "none", plan.cap)
    prof = measure(target, NoDrafter(), plan.cap, key, prefixes=list(plan.prefixes), repeats=plan.repeats,
                   budget_s=budget_s)
    print(describe(prof, out_path, cached=False))
    return {"sizes": prof.sizes, "prefixes": prof.prefixes, "repeats": prof.repeats, "measure_s": prof.measure_s,
            "verify_ms": [[1e3 * t for t in row] for row in prof.verify_s],
            "envelope_ms": [[1e3 * float(prof.envelope(p)[n - 1]) for n in prof.sizes] for p in prof.prefixes],
            "key": key}


def model_steps(plan: Plan, steps: list[Step], deadline: float, out_path: Path) -> list[dict]:
    results = []
    todo = len(plan.models) * len(BACKENDS)
    for name, spec in plan.models.items():
        built = run_step(steps, f"init {name}", lambda: build_target(spec, plan))
        for backend in BACKENDS:
            entry = {"model": name, "spec": spec, "backend": backend, "dtype": str(plan.dtype).removeprefix("torch.")}
            results.append(entry)
            if built is None:
                entry.update(status="skipped", detail=f"init {name} failed")
                todo -= 1
                continue
            target, entry["init_s"], entry["params"] = built
            left = deadline - time.perf_counter()
            budget = max(0.0, min(plan.budget_s, left / max(todo, 1)))  # the deadline shared by the profiles left
            got = run_step(steps, f"profile {name} {backend}",
                           lambda: profile_step(target, spec, backend, plan, budget, out_path))
            entry.update(status=steps[-1].status, detail=steps[-1].detail, elapsed_s=steps[-1].elapsed_s, **(got or {}))
            todo -= 1
        built = target = None  # free the model before the next one is built
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def comparison(profiles: list[dict]) -> list[dict]:
    """Per model, prefix and size: SDPA's verify time against Triton's."""
    ok = {(p["model"], p["backend"]): p for p in profiles if p["status"] == "ok"}
    rows = []
    for model in dict.fromkeys(p["model"] for p in profiles):
        sdpa, tri = ok.get((model, "sdpa")), ok.get((model, "triton"))
        if not (sdpa and tri):
            continue
        for i, prefix in enumerate(sdpa["prefixes"]):
            for g, n in enumerate(sdpa["sizes"]):
                s, t = sdpa["verify_ms"][i][g], tri["verify_ms"][i][g]
                rows.append({"model": model, "prefix": prefix, "n": n, "sdpa_ms": s, "triton_ms": t,
                             "sdpa_over_triton": s / t if t > 0 else None})
    return rows


def markdown(summary: dict) -> str:
    lines = [f"# gpu_check ({summary['mode']} mode)", "",
             f"{summary['device_name']}; torch {summary['torch']}, transformers {summary['transformers']}, "
             f"triton {summary['triton'] or '-'}; {summary['started']}; total {summary['total_s']:.1f} s "
             f"(budget {summary['budget_s']:.0f} s)", "",
             "| step | status | s | detail |", "|---|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['elapsed_s']:.1f} | {s['detail']} |" for s in summary["steps"]]
    kernel = summary.get("kernel") or {}
    if kernel.get("rows"):
        lines += ["", f"## Tree-attention kernel vs SDPA ({kernel['timing']})", "",
                  "| prefix | T | sdpa us | tree us | speedup | GB/s | max abs diff |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['prefix']} | {r['nodes']} | {r['sdpa_us']:.1f} | {r['tree_us']:.1f} | {r['speedup']:.2f}x "
                  f"| {r['gbps']:.0f} | {r['max_abs_diff']:.2e} |" for r in kernel["rows"]]
    if summary["comparison"]:
        lines += ["", "## Verify cost t(N), ms: SDPA against Triton", "",
                  "| model | prefix | N | sdpa ms | triton ms | sdpa / triton |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['prefix']} | {r['n']} | {r['sdpa_ms']:.3f} | {r['triton_ms']:.3f} | "
                  f"{r['sdpa_over_triton']:.2f}x |" for r in summary["comparison"]]
    return "\n".join(lines) + "\n"


def resolve_mode(requested: str) -> Plan:
    cuda = torch.cuda.is_available()
    if requested == "gpu" and not cuda:
        raise ConfigError(f"--mode gpu needs CUDA, but torch {torch.__version__} sees no GPU; use --mode cpu "
                          "(tiny shapes) or run on a GPU machine")
    return GPU if requested == "gpu" or (requested == "auto" and cuda) else CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_check.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["auto", "gpu", "cpu"], default="auto",
                    help="gpu: 8B shapes, needs CUDA; cpu: tiny shapes, Triton's interpreter; auto: gpu where CUDA is")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else results/gpu_check)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = resolve_mode(args.mode)
    except ConfigError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    if plan.mode == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when graft_lab.kernels is first imported
    import transformers

    from graft_lab import profile

    out = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parents[1] / "results" / "gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    start = time.perf_counter()
    deadline = start + DEADLINE_S
    triton_version = None
    if importlib.util.find_spec("triton") is not None:
        import triton

        triton_version = triton.__version__
    device_name = profile.device_name(torch.device(plan.device))
    print(f"gpu_check: {plan.mode} mode on {device_name}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, triton {triton_version or '-'}; writing {out}", flush=True)
    steps: list[Step] = []
    kernel = run_step(steps, "kernel benchmark (tree attention vs SDPA)", lambda: kernel_step(plan))
    profiles = model_steps(plan, steps, deadline, out / "summary.json")
    total = time.perf_counter() - start
    summary = {
        "mode": plan.mode, "device_name": device_name, "torch": torch.__version__,
        "transformers": transformers.__version__, "triton": triton_version,
        "started": started,
        "total_s": total, "budget_s": DEADLINE_S, "within_budget": total <= DEADLINE_S,
        "steps": [vars(s) for s in steps], "kernel": kernel, "profiles": profiles,
        "comparison": comparison(profiles), "ok": all(s.status != "failed" for s in steps),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print("\n" + markdown(summary))
    print(f"gpu_check: {'ok' if summary['ok'] else 'FAILED'} in {total:.1f} s; wrote {out / 'summary.json'} "
          f"and {out / 'summary.md'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
