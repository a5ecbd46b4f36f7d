"""A training stage for a lent GPU machine (the `run` device tool), in parts that fit its calls.

A device call carries the working tree and at most 64 MiB in all, a file it returns is at most 16 MiB, and the
machine has torch and transformers but no data wheels, no GGUF, no Spec-Bench and no omegaconf. So `build`, here:
  - packs the stream (rendered and screened here: graft_lab.train.stream);
  - splits the embedded target's GGUF into parts, one per call, each as large as the tree leaves of the limit;
  - builds wheels of the pure-Python packages the trainer needs there (gguf, omegaconf, hydra-core, antlr4);
  - writes kit.json: each part's sha256, the target's weights hash, and the run's flags made explicit;
  - prints the calls. Each call but the last `stash`es its part in /tmp: a warm machine keeps it, and stays warm
    30 s after a call. The last call runs `device`: join and check the GGUF, convert it, check that the weights
    equal these here, train for --minutes, and leave the export in $OUT in parts under 16 MiB.
`receive` joins the parts back here, checked, into a run directory whose export/ the CPU evaluates.

    python -m graft_lab.train.kit build --kit .gpu -- --config conf/train/smollm2_mix.yaml --data A --data B ...
    python3 -m graft_lab.train.kit stash .gpu/c1                                 # device, every call but the last
    python3 -m graft_lab.train.kit device --kit .gpu/c3 --minutes 6 --out $OUT   # device, the last call
    python -m graft_lab.train.kit receive FILES_AT --run runs/gpu/stage27
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CALL_LIMIT = 64 << 20  # bytes a device call carries: the working tree and every carried path
RETURN_LIMIT = 16 << 20  # bytes of one file it returns
MARGIN = 2 << 20  # left free in each call, for files the tree gains between build and call
STASH = Path("/tmp/graft-kit")
WHEELS = ("gguf", "omegaconf", "hydra-core", "antlr4-python3-runtime")
MANIFEST = "kit.json"
GGUF_PART = "target.gguf.part"


def sha256(path: Path) -> str:
    """A file's sha256 (this module imports nothing but the standard library: `stash` runs before the wheels)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_hash(model_dir: Path) -> str:
    """sha256 over the converted target's tensors (names, dtypes, shapes, bytes), in name order."""
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tree_bytes(root: Path) -> int:
    """What a call carries besides `carry`: tracked and untracked-not-ignored files, and shared/."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           capture_output=True, check=True).stdout.split(b"\0")
    total = sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())
    shared = root / "shared"
    return total + (sum(p.stat().st_size for p in shared.rglob("*") if p.is_file()) if shared.is_dir() else 0)


def plan_parts(size: int, room: int, last_extra: int) -> list[int]:
    """Part sizes of a `size`-byte file over calls that carry `room` bytes each, the last also `last_extra`."""
    if room <= last_extra:
        raise SystemExit(f"kit: a call carries {room} bytes beside the tree, the last call's pack and wheels alone "
                         f"take {last_extra}")
    parts = []
    while size > room - last_extra:
        parts.append(room)
        size -= room
    return parts + [size]


def split(path: Path, sizes: list[int], dirs: list[Path], stem: str) -> list[dict]:
    out = []
    with open(path, "rb") as f:
        for k, (n, d) in enumerate(zip(sizes, dirs), 1):
            d.mkdir(parents=True, exist_ok=True)
            part = d / f"{stem}{k}"
            part.write_bytes(f.read(n))
            out.append({"name": part.name, "bytes": n, "sha256": sha256(part)})
    return out


def join(parts: list[dict], where: list[Path], out: Path) -> Path:
    """Concatenate checked parts, each found in one of `where`; SystemExit names a missing or changed one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        for p in parts:
            found = [d / p["name"] for d in where if (d / p["name"]).is_file()]
            if not found:
                raise SystemExit(f"kit: part {p['name']} is in none of {[str(d) for d in where]}: stash it first "
                                 "(the machine went cold between calls?)")
            if sha256(found[0]) != p["sha256"]:
                raise SystemExit(f"kit: part {found[0]} differs from the one built here")
            f.write(found[0].read_bytes())
    return out


def build_wheels(dest: Path, given: Path | None) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    if given is None:
        pins = [f"{n}=={importlib.metadata.version(n)}" for n in WHEELS]
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), *pins],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"kit: pip wheel {' '.join(pins)} failed: {done.stderr.strip().splitlines()[-1:]}")
    else:
        for w in given.glob("*.whl"):
            shutil.copy(w, dest / w.name)
    names = sorted(w.name for w in dest.glob("*.whl"))
    missing = [n for n in WHEELS if not any(w.lower().startswith(n.replace("-", "_") + "-") for w in names)]
    if missing:
        raise SystemExit(f"kit: no wheel of {missing} in {given or dest}")
    return names


def build(kit: Path, train_argv: list[str], wheels: Path | None, call_limit: int, root: Path,
          minutes: float = 6.0) -> list[str]:
    from ..models.embedded import embedded_dir, gguf_path
    from ..models.target import EMBEDDED
    from .__main__ import main as train_main, parse, to_argv

    args = parse(train_argv)
    if args.data and any(d.endswith(".pack.npz") for d in args.data):
        raise SystemExit("kit build: give the sources (--data A --data B); the kit packs them itself")
    if kit.exists():
        shutil.rmtree(kit)
    staging = kit / "staging"
    pack = staging / "stream.pack.npz"
    train_main(train_argv + ["--pack", str(pack)])
    wheel_names = build_wheels(staging / "wheels", wheels)
    extra = pack.stat().st_size + sum(p.stat().st_size for p in (staging / "wheels").iterdir()) + (64 << 10)
    room = call_limit - tree_bytes(root) - MARGIN
    manifest = {"target": args.target, "gguf": None, "weights": None, "wheels": wheel_names,
                "pack": {"name": pack.name, "sha256": sha256(pack)}, "built": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime())}
    if args.target == EMBEDDED:
        src = gguf_path()
        sizes = plan_parts(src.stat().st_size, room, extra)
        dirs = [kit / f"c{k}" for k in range(1, len(sizes) + 1)]
        manifest["gguf"] = {"name": src.name, "sha256": sha256(src), "parts": split(src, sizes, dirs, GGUF_PART)}
        manifest["weights"] = weights_hash(embedded_dir())
    else:
        if extra > room:
            raise SystemExit(f"kit: a call carries {room} bytes beside the tree, the pack and wheels take {extra}")
        dirs = [kit / "c1"]
    last = dirs[-1]
    last.mkdir(parents=True, exist_ok=True)
    shutil.move(str(pack), last / pack.name)
    shutil.move(str(staging / "wheels"), last / "wheels")
    shutil.rmtree(staging)
    manifest["argv"] = to_argv({k: v for k, v in vars(args).items() if k != "data"})
    (last / MANIFEST).write_text(json.dumps(manifest, indent=1))
    calls = [f"PYTHONPATH=src python3 -m graft_lab.train.kit stash {d}   # carry {d}" for d in dirs[:-1]]
    calls.append(f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
                 f"/tmp/site {last}/wheels/*.whl && PYTHONPATH=/tmp/site:src python3 -m graft_lab.train.kit device "
                 f"--kit {last} --minutes {minutes:g} --out $OUT   # carry {last}")
    return calls


def stash(part_dir: Path, to: Path = STASH) -> None:
    (to / "parts").mkdir(parents=True, exist_ok=True)
    for p in sorted(part_dir.iterdir()):
        if p.is_file():
            shutil.copy(p, to / "parts" / p.name)
            print(f"[kit] stashed {p.name} ({p.stat().st_size} bytes) in {to / 'parts'}", flush=True)


def device(kit: Path, minutes: float, out: Path, device_name: str, max_tokens: int, to: Path = STASH) -> dict:
    """On the lent machine: rebuild the target, train for `minutes`, leave the export in `out` in parts."""
    manifest = json.loads((kit / MANIFEST).read_text())
    pack = kit / manifest["pack"]["name"]
    if sha256(pack) != manifest["pack"]["sha256"]:
        raise SystemExit(f"kit: {pack} differs from the one built here")
    if manifest["gguf"]:
        gguf = join(manifest["gguf"]["parts"], [kit, to / "parts"], to / manifest["gguf"]["name"])
        if sha256(gguf) != manifest["gguf"]["sha256"]:
            raise SystemExit("kit: the joined GGUF differs from the one built here")
        os.environ["GRAFT_LAB_GGUF"] = str(gguf)
        os.environ["GRAFT_LAB_CACHE"] = str(to / "cache")
        from ..models.embedded import embedded_dir

        have = weights_hash(embedded_dir())
        if have != manifest["weights"]:
            raise SystemExit(f"kit: the target converted here has weights {have[:12]}, the one trained for "
                             f"{manifest['weights'][:12]}: another gguf or transformers converts differently")
        print("[kit] target rebuilt; its weights equal the ones the kit was built with", flush=True)
    import torch

    from .__main__ import main as train_main

    run = to / "run"
    argv = manifest["argv"] + ["--data", str(pack), "--device", device_name, "--out", str(run), "--export",
                               str(run / "export"), "--max-minutes", str(minutes), "--max-tokens", str(max_tokens)]
    t0 = time.time()
    error = None
    try:
        train_main(argv)
    except Exception as exc:  # a crash late in the only run of a lease: return what the last checkpoint holds
        error = f"{type(exc).__name__}: {exc}"
        print(f"[kit] training stopped: {error}", flush=True)
        if not (run / "checkpoint.pt").is_file():
            raise
        train_main(argv + ["--export-only"])
    wall = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    model = run / "export" / "model.safetensors"
    n = model.stat().st_size
    sizes = [RETURN_LIMIT - (1 << 20)] * (n // (RETURN_LIMIT - (1 << 20))) + [n % (RETURN_LIMIT - (1 << 20))]
    parts = split(model, [s for s in sizes if s], [out] * len(sizes), "model.safetensors.part")
    for name in ("config.json",):
        shutil.copy(run / "export" / name, out / name)
    for name in ("log.jsonl", "curve.jsonl"):
        if (run / name).is_file():
            shutil.copy(run / name, out / name)
    state = torch.load(run / "checkpoint.pt", weights_only=False, map_location="cpu")["state"]
    report = {"device": torch.cuda.get_device_name() if device_name.startswith("cuda") else "cpu",
              "torch": torch.__version__, "transformers": importlib.metadata.version("transformers"),
              "minutes": minutes, "wall_s": round(wall, 1), "state": state, "error": error,
              "tok_s": round(state["tokens"] / max(state["wall"], 1e-9), 1), "argv": argv,
              "model": {"sha256": sha256(model), "parts": parts}}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"[kit] trained {state['tokens']} tokens in {state['wall']:.0f} s ({report['tok_s']} tok/s) on "
          f"{report['device']}; export in {len(parts)} parts under {out}", flush=True)
    return report


def receive(src: Path, run: Path) -> Path:
    report = json.loads((src / "report.json").read_text())
    export = run / "export"
    model = join(report["model"]["parts"], [src], export / "model.safetensors")
    if sha256(model) != report["model"]["sha256"]:
        raise SystemExit("kit: the joined drafter differs from the one trained there")
    shutil.copy(src / "config.json", export / "config.json")
    for name in ("report.json", "log.jsonl", "curve.jsonl"):
        if (src / name).is_file():
            shutil.copy(src / name, run / name)
    print(f"[kit] {export}: the drafter trained on {report['device']} ({report['state']['tokens']} tokens, "
          f"{report['tok_s']} tok/s)", flush=True)
    return export


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="pack a stage for the device, here; the train flags follow --")
    b.add_argument("--kit", type=Path, default=Path(".gpu"), help="output folder (git must ignore it)")
    b.add_argument("--wheels", type=Path, help=f"a folder holding wheels of {', '.join(WHEELS)} (default: pip wheel)")
    b.add_argument("--call-limit", type=int, default=CALL_LIMIT, help="bytes a device call carries")
    b.add_argument("--minutes", type=float, default=6.0,
                   help="the training time the printed device call gives (6 of a lease's 15 minutes)")
    s = sub.add_parser("stash", help="on the device: keep a carried part in /tmp for the last call")
    s.add_argument("part_dir", type=Path)
    s.add_argument("--stash", type=Path, default=STASH, help="where the parts wait for the last call")
    d = sub.add_parser("device", help="on the device: rebuild the target, train, leave the export in --out")
    d.add_argument("--kit", type=Path, required=True)
    d.add_argument("--minutes", type=float, required=True, help="training wall time; the lr schedule ends with it")
    d.add_argument("--max-tokens", type=int, default=10**12, help="a token budget too (default: wall time alone)")
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--device", default="cuda")
    d.add_argument("--stash", type=Path, default=STASH, help="the stashed parts; the run and the target go here too")
    r = sub.add_parser("receive", help="here: join the returned export into RUN/export, checked")
    r.add_argument("src", type=Path)
    r.add_argument("--run", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        if not train_argv:
            ap.error("build: give the training flags after --")
        root = Path.cwd()
        if not a.kit.resolve().is_relative_to(root.resolve()) or not (root / ".git").exists():
            raise SystemExit(f"kit build: run it in the checkout's root, with --kit inside it ({a.kit} is not)")
        ignored = subprocess.run(["git", "check-ignore", "-q", str(a.kit / "c1")], cwd=root).returncode == 0
        if not ignored:
            raise SystemExit(f"kit build: git does not ignore {a.kit}; it would travel in every call "
                             f"(echo /{a.kit}/ >> .git/info/exclude)")
        for line in build(a.kit, train_argv, a.wheels, a.call_limit, root, a.minutes):
            print(line)
    elif a.cmd == "stash":
        stash(a.part_dir, a.stash)
    elif a.cmd == "device":
        if a.minutes <= 0:
            raise SystemExit("kit device: --minutes must be above 0")
        device(a.kit, a.minutes, a.out, a.device, a.max_tokens, a.stash)
    else:
        receive(a.src, a.run)


if __name__ == "__main__":
    main()
