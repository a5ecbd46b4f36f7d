"""The machine's cost profile: what verifying N tree nodes, and drafting one level, cost for the loaded
target on this device, dtype, thread count, attention backend and linear kernel (model.linear).

Measured at first use in a few seconds: sizes N on a grid up to the cap, interleaved in a shuffled order
per repeat, at two prefix lengths (the KV cache is filled with random keys and values, so no long prefill
runs), a few repeats, the fastest of each. Cached on disk as `<GRAFT_LAB_CACHE or ~/.cache/graft_lab>/profiles/*.json`
($GRAFT_LAB_PROFILES moves that folder), keyed by everything that changes the curve: model, dtype, device
and its name (CPU model and a fingerprint of its features and caches, or GPU), threads, attention backend,
linear kernel, torch version, drafter (its dtype included), cap. Each size's figure is the fastest of its
repeats: another process only ever adds time, so the minimum is the machine's own cost, and the online level
below carries how busy the machine is now.

A cached profile is checked before it is used (`check`): three sizes are timed again in about a second,
and when their costs or the shape between them moved by more than `CHECK_TOLERANCE` (another machine that
reports the same name, a profile taken in a slow spell), the whole profile is measured again.

Refined online, in memory (the cached file keeps the measurement): every measured verify time moves a
global level (how much slower or faster than measured the whole curve runs now, the drafter included) and,
more slowly, the shape correction of the grid sizes around it, each by an exponential moving average.

Its lower envelope, env(N) = min over M >= N of t(M), is what N nodes really cost: never verify N nodes
when a bigger tree costs less, fill up to the cheapest size instead.

    python -m graft_lab.profile [--model embedded:smollm2-135m-instruct] [--dtype float32] [--cap 64]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .drafters.base import DraftInput, Drafter
from .errors import GraftLabError
from .models.embedded import cache_root
from .models.target import EMBEDDED, Target
from .tree import DraftTree, Source

GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PREFIXES = (128, 1024)  # prefix lengths measured (capped by the model's context)
VERSION = 3  # bump when the measurement changes: old cache files are then ignored
LEVEL_RATE = 0.1  # weight of one measured step in the online level
REFINE_RATE = 0.05  # weight of one measured step in the shape correction of the sizes around it
CHECK_TOLERANCE = 1.25  # a cached profile is measured again when a checked size's cost moved beyond this factor
SHIPPED_DRAFTER = "builtin:smollm2-135m-instruct-eagle3"


def grid(cap: int) -> list[int]:
    """The sizes measured for a cap: the grid below it, then the cap itself."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    return sorted({n for n in GRID if n < cap} | {cap})


def default_prefixes(max_context: int, cap: int) -> list[int]:
    hi = max(1, min(PREFIXES[-1], max_context - cap - 1))
    return sorted({max(1, min(PREFIXES[0], hi // 4)), hi})


@dataclass
class CostProfile:
    key: dict[str, Any]  # what the profile was measured for (see `profile_key`)
    sizes: list[int]  # N grid, ascending, from 1 to the cap
    prefixes: list[int]  # prefix lengths measured, ascending
    verify_s: list[list[float]]  # [P][G] fastest seconds of one verification of sizes[g] nodes after prefixes[p]
    draft_base_s: float  # a draft that stops after level 0: ingest the new pairs, the root's children
    draft_level_s: float  # each further draft level
    measure_s: float = 0.0  # how long measuring took
    repeats: int = 0  # measured repeats per size and prefix
    shape: list[float] = field(default_factory=list)  # online correction per grid size, around the level (not saved)
    level: float = 1.0  # online: measured / profiled cost of the whole curve now (not saved)
    note: str = ""  # how this run got the profile: measured, or read from the cache and checked (not saved)

    def __post_init__(self):
        self._t = np.asarray(self.verify_s, dtype=np.float64)  # [P, G]
        self._p = np.asarray(self.prefixes, dtype=np.float64)
        self.shape = list(self.shape) or [1.0] * len(self.sizes)

    @property
    def cap(self) -> int:
        return self.sizes[-1]

    @property
    def draft_level_now(self) -> float:
        """Seconds of a further draft level now: the profiled cost at the online level."""
        return self.draft_level_s * self.level

    def grid_times(self, prefix: int, refined: bool = True) -> np.ndarray:
        """[G] seconds per grid size after `prefix` tokens: linear in the prefix between the measured ones,
        flat below the first, extrapolated (never falling) beyond the last; `refined`: at the online level
        and shape."""
        hi = min(max(int(np.searchsorted(self._p, prefix)), 1), max(1, len(self.prefixes) - 1))
        lo = hi - 1
        if len(self.prefixes) == 1 or prefix <= self._p[0]:
            t = self._t[0]
        else:
            slope = (self._t[hi] - self._t[lo]) / (self._p[hi] - self._p[lo])
            if prefix > self._p[-1]:  # beyond the last: from the last point, never falling
                t = self._t[hi] + np.maximum(slope, 0.0) * (prefix - self._p[hi])
            else:
                t = self._t[lo] + slope * (prefix - self._p[lo])
        return t * self.level * np.asarray(self.shape) if refined else t

    def curve(self, prefix: int) -> np.ndarray:
        """[cap] t(N) in seconds for N = 1..cap, linear between grid sizes."""
        return np.interp(np.arange(1, self.cap + 1), self.sizes, self.grid_times(prefix))

    def envelope(self, prefix: int) -> np.ndarray:
        """[cap] env(N) = min over M >= N of t(M): what verifying N nodes costs when filling up is allowed."""
        return np.minimum.accumulate(self.curve(prefix)[::-1])[::-1]

    def fill_to(self, prefix: int) -> np.ndarray:
        """[cap] the size N nodes should fill up to: the largest M >= N with t(M) == env(N)."""
        t = self.curve(prefix)
        out = np.empty(self.cap, dtype=np.int64)
        best = self.cap
        for n in range(self.cap, 0, -1):
            if t[n - 1] < t[best - 1]:
                best = n
            out[n - 1] = best
        return out

    def verify_time(self, n: int, prefix: int) -> float:
        return float(np.interp(n, self.sizes, self.grid_times(prefix)))

    def observe(self, n: int, prefix: int, seconds: float) -> None:
        """Refine online: the level moves towards measured / profiled, whatever the size, then the shape of
        the grid sizes around n towards what the level leaves unexplained, each by its interpolation weight.
        When one size runs alone its shape returns to 1 and the level carries the whole change."""
        profiled = float(np.interp(n, self.sizes, self.grid_times(prefix, refined=False)))
        if profiled <= 0 or seconds <= 0:
            return
        ratio = min(5.0, max(0.2, seconds / profiled))  # one stall (GC, another process) moves it little
        self.level += LEVEL_RATE * (ratio - self.level)
        hi = min(int(np.searchsorted(self.sizes, n)), len(self.sizes) - 1)
        lo = max(hi - 1, 0)
        w = 1.0 if hi == lo or self.sizes[hi] == n else (n - self.sizes[lo]) / (self.sizes[hi] - self.sizes[lo])
        for g, weight in ((lo, 1.0 - w), (hi, w)):
            self.shape[g] += REFINE_RATE * weight * (ratio / self.level - self.shape[g])

    def to_json(self) -> dict:
        data = asdict(self)
        for online in ("shape", "level", "note"):
            data.pop(online)
        return data

    @staticmethod
    def from_json(data: dict) -> "CostProfile":
        data = {k: v for k, v in data.items() if k not in ("shape", "level", "note")}
        return CostProfile(**data)


# ---- measuring -----------------------------------------------------------------------------------
def probe_tree(n: int, vocab: int, seed: int = 0, device: torch.device | str = "cpu") -> DraftTree:
    """A tree of n nodes with a realistic shape: top-4 fan-out per level (EAGLE-like)."""
    parents = torch.tensor([-1] + [(i - 1) // 4 for i in range(1, n)])
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = torch.randperm(max(vocab, n), generator=torch.Generator().manual_seed(seed))[:n] % vocab  # siblings differ
    source = torch.full((n,), int(Source.DRAFT), dtype=torch.int8)
    source[0] = int(Source.ROOT)
    tree = DraftTree(tokens, parents, depth, torch.zeros(n), source)
    return DraftTree(*(getattr(tree, f).to(device) for f in ("tokens", "parents", "depth", "score", "source")))


class LevelCap:
    """A pruner that drafts exactly `levels` levels and keeps the whole budget (to time drafting)."""

    def __init__(self, levels: int):
        self.levels = levels

    def keep_drafting(self, level: int, best_score: float) -> bool:
        return level + 1 < self.levels

    def draft_budget(self, total: int, last_level: int) -> int:
        return total


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def measure_verify(target: Target, sizes: list[int], prefixes: list[int], want_aux: bool, repeats: int,
                   budget_s: float) -> tuple[list[list[float]], int]:
    """[P][G] fastest verify seconds, every (prefix, size) once per repeat in a shuffled order, after a warm-up
    of each size once at the shortest prefix. At least one repeat runs; a further one starts only if it is
    predicted (from the last one) to end within `budget_s` of the start. Returns the minima and the repeats done."""
    dev = target.device
    caches = []
    for p in prefixes:
        cache = target.new_cache(p + sizes[-1] + 1)
        target.prefill(torch.zeros(1, dtype=torch.long, device=dev), cache, want_aux=False)  # shapes the layers
        cache.fill_random(p)
        caches.append(cache)
    trees = {n: probe_tree(n, target.vocab_size, device=dev) for n in sizes}
    times: list[list[list[float]]] = [[[] for _ in sizes] for _ in prefixes]

    def verify(cache, p, n):
        target.verify(trees[n], cache, want_aux)
        cache.crop(p)

    cells = [(i, g) for i in range(len(prefixes)) for g in range(len(sizes))]
    rng, start = random.Random(0), time.perf_counter()
    for n in sizes:  # warm-up: allocations, kernel selection; the longer prefixes reuse the same tree shapes
        verify(caches[0], prefixes[0], n)
    done, last = 0, 0.0
    while done < repeats and (done == 0 or time.perf_counter() - start + last <= budget_s):
        t = time.perf_counter()
        for i, g in rng.sample(cells, len(cells)):  # interleaved: drifting load hits every cell alike
            times[i][g].append(timed(lambda: verify(caches[i], prefixes[i], sizes[g]), dev))
        done, last = done + 1, time.perf_counter() - t
    return [[min(ts) for ts in row] for row in times], done


def measure_draft(target: Target, drafter: Drafter, cap: int, repeats: int) -> tuple[float, float]:
    """(seconds of a draft that stops after level 0, seconds per further level): drafts of 1 and of
    `drafter.depth` levels after one new pair, interleaved, the fastest of each."""
    dev = target.device
    depth = int(getattr(drafter, "depth", 1))
    context = 64
    width = len(target.aux_layers) * target.hidden_size
    feats = torch.randn(context + 1, width, dtype=target.dtype, device=dev) if drafter.needs_features else None
    tokens = torch.randint(0, target.vocab_size, (context + 1,), device=dev)
    drafter.reset(context + cap + 1)
    drafter.draft(DraftInput(None if feats is None else feats[:context], tokens[:context], 0), 1, LevelCap(1))
    step = DraftInput(None if feats is None else feats[context:], tokens[context:], context)
    runs: dict[int, list[float]] = {1: [], depth: []}
    for rep in range(repeats + 1):
        for levels in runs:
            dt = timed(lambda: drafter.draft(step, cap, LevelCap(levels)), dev)
            if rep:  # the first round warms up
                runs[levels].append(dt)
    base = min(runs[1])
    per_level = (min(runs[depth]) - base) / (depth - 1) if depth > 1 else 0.0
    return base, max(0.0, per_level)


@torch.inference_mode()
def measure(target: Target, drafter: Drafter, cap: int, key: dict | None = None, prefixes: list[int] | None = None,
            repeats: int = 3, budget_s: float = 9.0) -> CostProfile:
    """Measure the profile now (a few seconds); see the module docstring."""
    t0 = time.perf_counter()
    sizes = grid(cap)
    prefixes = sorted(prefixes or default_prefixes(target.max_context, cap))
    verify_s, done = measure_verify(target, sizes, prefixes, drafter.needs_features, repeats, budget_s)
    base, level = measure_draft(target, drafter, cap, repeats=max(3, repeats))
    return CostProfile(key or {}, sizes, prefixes, verify_s, base, level, time.perf_counter() - t0, done)


@torch.inference_mode()
def check(profile: CostProfile, target: Target, want_aux: bool, rounds: int = 3) -> dict[int, float]:
    """{size: measured / profiled seconds} for the smallest, a middle and the largest grid size at the first
    prefix, timed now (the fastest of `rounds`, as `measure` takes them): about a second."""
    sizes = sorted({profile.sizes[0], profile.sizes[len(profile.sizes) // 2], profile.cap})
    prefix = profile.prefixes[0]
    now, _ = measure_verify(target, sizes, [prefix], want_aux, rounds, budget_s=float("inf"))
    return {n: t / profile.verify_time(n, prefix) for n, t in zip(sizes, now[0])}


def agrees(ratios: dict[int, float], tolerance: float = CHECK_TOLERANCE) -> bool:
    """Whether every checked size costs what the profile says, within a factor of `tolerance`."""
    return all(1 / tolerance <= r <= tolerance for r in ratios.values())


# ---- the on-disk cache ---------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model (from /proc/cpuinfo where there is one)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_isa() -> list[str]:
    """Which of the instruction sets that decide CPU speed here the CPU has (bf16 runs 5x slower without the last
    two); empty where /proc/cpuinfo is missing."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]


def device_fingerprint(device: torch.device) -> str:
    """A short hash of what tells apart machines that report the same name: a GPU's capability, memory and
    processors; a CPU's feature flags, cache sizes and logical CPU count (virtual machines often report a
    bare family name such as "AMD EPYC")."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts = [str(torch.cuda.get_device_capability(device)), str(props.total_memory), str(props.multi_processor_count)]
    else:
        facts = [str(os.cpu_count()), platform.machine()]
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.is_file():
            wanted = ("flags", "cache size", "cpu family", "model\t", "stepping")
            lines = cpuinfo.read_text(errors="replace").split("\n\n")[0].splitlines()
            facts += sorted(line for line in lines if line.startswith(wanted))
    return hashlib.sha1("\n".join(facts).encode()).hexdigest()[:12]


def profile_key(target: Target, model_id: str, drafter_id: str, cap: int, drafter: Drafter | None = None) -> dict[str, Any]:
    """Everything that changes the curve; another machine, dtype or backend gets its own profile, and so does
    a drafter running in another dtype than before (drafter.dtype)."""
    dev = target.device
    drafter_dtype = getattr(drafter, "dtype", None)  # the drafter's own dtype, as it runs; None: no network
    return {
        "model": model_id,
        "layers": target.config.num_hidden_layers,
        "hidden": target.hidden_size,
        "vocab": target.vocab_size,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": dev.type,
        "device_name": device_name(dev),
        "fingerprint": device_fingerprint(dev),
        "threads": torch.get_num_threads(),
        "attn": target.attn,
        "linear": target.linear,
        "torch": torch.__version__,
        "drafter": drafter_id,
        "drafter_dtype": None if drafter_dtype is None else str(drafter_dtype).removeprefix("torch."),
        "cap": cap,
        "max_context": target.max_context,
        "version": VERSION,
    }


def profile_dir() -> Path:
    """$GRAFT_LAB_PROFILES, else profiles/ under graft-lab's cache ($GRAFT_LAB_CACHE or ~/.cache/graft_lab)."""
    return Path(os.environ.get("GRAFT_LAB_PROFILES") or cache_root() / "profiles")


def profile_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", str(key["model"])).strip("-")[-48:]
    return profile_dir() / f"{slug}-{key['dtype']}-{key['device']}-{key['threads']}t-{digest}.json"


def load(path: Path, key: dict[str, Any]) -> CostProfile | None:
    """The cached profile for `key`, or None when there is none (or it is unreadable or for another key)."""
    try:
        data = json.loads(path.read_text())
        prof = CostProfile.from_json(data)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return prof if prof.key == key else None


def save(profile: CostProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    os.replace(tmp, path)


def profile_for(target: Target, drafter: Drafter, model_id: str, drafter_id: str, cap: int,
                refresh: bool = False, verify_cache: bool = True, **measure_kwargs) -> tuple[CostProfile, Path, bool]:
    """The profile of this target and drafter on this machine: read from the cache and checked against a
    second of timing now (`verify_cache`), or measured now and cached, also when the check disagrees.
    Returns (profile, its cache file, whether it came from the cache); `profile.note` says which and why."""
    key = profile_key(target, model_id, drafter_id, cap, drafter)
    path = profile_path(key)
    note = "measured"
    if not refresh and (cached := load(path, key)) is not None:
        if not verify_cache:
            cached.note = "read from the cache"
            return cached, path, True
        ratios = check(cached, target, drafter.needs_features)
        moved = ", ".join(f"t({n}) {r:.2f}x" for n, r in ratios.items())
        if agrees(ratios):
            cached.note = f"read from the cache, checked now: {moved} of the cached cost"
            return cached, path, True
        note = f"measured again: the cached profile is off on this machine now ({moved} of it)"
    prof = measure(target, drafter, cap, key, **measure_kwargs)
    prof.note = note
    save(prof, path)
    return prof, path, False


def drafter_id(node) -> str:
    """A drafter config node (validated options included) as one string: part of the profile's key."""
    from .drafters import DRAFTERS

    opts = DRAFTERS.options(node)
    return json.dumps({"name": str(node["name"]), **(asdict(opts) if opts is not None else {})}, sort_keys=True)


# ---- python -m graft_lab.profile ---------------------------------------------------------------
def describe(profile: CostProfile, path: Path, cached: bool) -> str:
    k = profile.key
    source = (f"{profile.note or 'read from the cache'}; file" if cached else
              f"{profile.note or 'measured'} in {profile.measure_s:.1f} s ({profile.repeats} repeats, fastest), saved to")
    lines = [
        f"cost profile: {k.get('model')}  {k.get('dtype')} on {k.get('device')} ({k.get('device_name')}), "
        f"{k.get('threads')} threads, attention {k.get('attn')}, torch {k.get('torch')}",
        f"  {source} {path}",
    ]
    ar = profile.verify_time(1, profile.prefixes[0])
    lines.append(f"  drafter ({k.get('drafter_dtype') or 'none'}): {profile.draft_base_s * 1e3:.2f} ms for level 0, "
                 f"{profile.draft_level_s * 1e3:.2f} ms per "
                 f"further level ({100 * profile.draft_level_s / ar:.1f}% of an AR step)")
    head = "".join(f" | t@{p:<5} ms  x N=1  env ms  fill" for p in profile.prefixes)
    lines.append(f"\n  {'N':>4}{head}")
    curves = [(profile.curve(p), profile.envelope(p), profile.fill_to(p)) for p in profile.prefixes]
    for n in profile.sizes:
        row = "".join(f" | {1e3 * t[n - 1]:>9.2f}  {t[n - 1] / t[0]:>5.2f}  {1e3 * e[n - 1]:>6.2f}  {f[n - 1]:>4}"
                      for t, e, f in curves)
        lines.append(f"  {n:>4}{row}")
    lines.append("\n  t: verify cost of N nodes; env: min over M >= N of t(M), the lower envelope; "
                 "fill: the size N nodes fill up to")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m graft_lab.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=EMBEDDED, help="model path, hub id, random:... or the embedded SmolLM2")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attn", default="auto", choices=["auto", "sdpa", "eager", "triton"])
    ap.add_argument("--drafter", default=None, help="EAGLE-3 checkpoint, or none (default: the shipped drafter for the "
                                                    "embedded model, else none)")
    ap.add_argument("--depth", type=int, default=7, help="draft levels (as tree.depth)")
    ap.add_argument("--top-k", type=int, default=8, help="children per expanded node (as tree.top_k)")
    ap.add_argument("--drafter-dtype", default="auto", help="the drafter's own dtype (as drafter.dtype): auto (the "
                                                           "target's), float32, bfloat16, float16")
    ap.add_argument("--cap", type=int, default=64, help="largest tree measured (as tree.total_tokens)")
    ap.add_argument("--linear", default="auto", help="the linear layers' kernel (as model.linear): auto, onednn, torch")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--refresh", action="store_true", help="measure again even when a cached profile exists")
    ap.add_argument("--no-check", action="store_true", help="use a cached profile without timing it against this "
                                                            "machine now")
    ap.add_argument("--json", action="store_true", help="print the profile as JSON")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .drafters import DRAFTERS
    from .models.target import load_model

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.drafter or (SHIPPED_DRAFTER if args.model == EMBEDDED else "none")
    node = {"name": "none"} if path == "none" else {"name": "eagle3", "path": path, "depth": args.depth, "top_k": args.top_k,
                                                    "dtype": args.drafter_dtype}
    try:
        model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
        target = Target(model, tokenizer)
        target.use_linear(args.linear)
        target.use_attention(("triton" if target.device.type == "cuda" else "sdpa") if args.attn == "auto" else args.attn)
        drafter = DRAFTERS.build(node, target=target)
        prof, file, cached = profile_for(target, drafter, args.model, drafter_id(node), args.cap, refresh=args.refresh,
                                          verify_cache=not args.no_check)
    except GraftLabError as exc:
        print(f"graft-lab: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(prof.to_json(), indent=1) if args.json else describe(prof, file, cached))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
