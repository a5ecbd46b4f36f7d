"""Train an EAGLE-3 drafter offline:

    python -m graft_lab.train --config conf/train/smollm2.yaml --out runs/smollm2-eagle3 [--resume]
    python -m graft_lab.train --out runs/smollm2-eagle3 --export-only --export DIR   # checkpoint -> official format
    python -m graft_lab.train --config conf/train/smollm2_regen.yaml --out RUN2 --init RUN  # stage 2: own replies
    python -m graft_lab.train --config conf/train/smollm2_mix.yaml --out RUN3 --init RUN2   # stage 3: fresh ShareGPT + own replies
    python -m graft_lab.train ... --data A.jsonl --data B.jsonl --pack S.pack.npz   # the stream, rendered, into one file
    python -m graft_lab.train ... --data S.pack.npz                                 # train on it (graft_lab.train.stream)

Any TrainConfig field is a flag (--max-tokens 5000000, --labels hard, ...); a YAML --config gives defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from ..errors import ConfigError
from ..models.target import EMBEDDED, Target, load_model
from ..preflight import resolve_device
from .data import HELDOUT
from .decontaminate import SPEC_BENCH, build_index
from .loop import TrainConfig, build_drafter, export, read_init, train
from .stream import PACK_SUFFIX, STREAM_FLAGS, build_stream, is_pack, read_pack, write_pack
from .widen import mlp_width


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse(argv=None):
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    defaults = {}
    if known.config:
        from omegaconf import OmegaConf

        defaults = OmegaConf.to_container(OmegaConf.load(known.config))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML file of defaults for any flag below")
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--data", action="append",
                    help="sharegpt (default), or a JSONL written by `python -m graft_lab.train.regenerate` (the target's "
                         "own replies); repeat it to interleave sources one conversation each in turn")
    ap.add_argument("--epochs", type=int, default=1, help="passes over a --data JSONL")
    ap.add_argument("--sharegpt-skip", type=int, default=0,
                    help="skip this many ShareGPT training conversations (those an earlier stage trained on)")
    ap.add_argument("--target-dtype", default="bfloat16",
                    help="dtype of the target's feature prefill; auto: time fp32 and bf16 here and keep the faster")
    ap.add_argument("--max-len", type=int, default=1024, help="tokens per rendered conversation (truncated)")
    ap.add_argument("--val-sequences", type=int, default=HELDOUT, help="held-out conversations (the file's first)")
    ap.add_argument("--eval-questions", type=int, default=10, help="MT-Bench first turns for the tau curve")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda where there is one, else cpu), cpu, cuda or cuda:N")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export", help="write the drafter in the official format here at the end")
    ap.add_argument("--export-only", action="store_true", help="export the run's checkpoint and exit")
    ap.add_argument("--pack", help=f"write the stream this run would read (rendered and screened) into this "
                                   f"{PACK_SUFFIX} file and exit; --data FILE{PACK_SUFFIX} trains on it")
    for f in dataclasses.fields(TrainConfig):
        if f.name == "extra":
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "autocast":  # auto: time both here (graft_lab.train.probe)
            ap.add_argument(_flag(f.name), type=lambda s: "auto" if s.lower() == "auto" else s.lower() in ("1", "true", "yes"),
                            default=default, help="bf16 autocast for the drafter: true, false or auto")
        elif isinstance(default, bool):
            ap.add_argument(_flag(f.name), type=lambda s: s.lower() in ("1", "true", "yes"), default=default)
        elif isinstance(default, tuple):
            ap.add_argument(_flag(f.name), type=lambda s: tuple(x for x in s.split(",") if x), default=default)
        else:
            ap.add_argument(_flag(f.name), type=type(default), default=default)
    known_dests = {a.dest for a in ap._actions}
    bad = [k for k in defaults if k.replace("-", "_") not in known_dests]
    if bad:
        ap.error(f"unknown keys in {known.config}: {bad}")
    data = defaults.pop("data", ["sharegpt"])  # --data on the command line replaces the config's sources
    ap.set_defaults(**{k.replace("-", "_"): (tuple(v) if isinstance(v, list) else v) for k, v in defaults.items()})
    args = ap.parse_args(argv)
    args.data = args.data or ([data] if isinstance(data, str) else list(data))
    return args


def to_argv(args: dict) -> list[str]:
    """Flags that `parse` turns back into these args without a --config, every value explicit (graft_lab.train.kit
    runs them on a machine without omegaconf)."""
    argv = []
    for k, v in args.items():
        if k in ("config", "pack", "export_only") or v is None:
            continue
        if k == "data":
            argv += [a for d in v for a in ("--data", d)]
        elif k == "resume":
            argv += ["--resume"] if v else []
        else:
            text = (",".join(v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else str(v))
            argv += [_flag(k), text]
    return argv


def choose_dtypes(args) -> None:
    """Replace `auto` in --target-dtype / --autocast by what is faster on this machine (graft_lab.train.probe); on a
    GPU, bf16 for both, without timing (tensor cores run bf16, and it is what GPU training of EAGLE-3 uses)."""
    from .probe import choose

    if args.device != "cpu":
        args.target_dtype = "bfloat16" if args.target_dtype == "auto" else args.target_dtype
        args.autocast = True if args.autocast == "auto" else args.autocast
        print(f"[train] on {args.device}: target {args.target_dtype}, drafter autocast {args.autocast}", flush=True)
        return

    model, tok = load_model(args.target, dtype="float32")
    target = Target(model, tok)
    keep = torch.arange(min(args.draft_vocab, target.vocab_size))
    net = build_drafter(target, keep, "rows", args.seed)
    choice = choose(target, net, keep, dtypes=("float32", "bfloat16") if args.target_dtype == "auto" else (args.target_dtype,),
                    autocasts=(False, True) if args.autocast == "auto" else (args.autocast,))
    args.target_dtype, args.autocast = choice.target_dtype, choice.autocast
    print(choice.line(), flush=True)


def main(argv=None) -> None:
    args = parse(argv)
    packed = is_pack(args.data)
    for d in args.data:
        if d != "sharegpt" and not packed and not Path(d).is_file():
            raise SystemExit(f"--data: {d} is neither 'sharegpt' nor a file (write one with python -m graft_lab.train.regenerate)")
    if args.grow_vocab and not args.init:
        raise SystemExit("--grow-vocab grows the draft vocab of the --init drafter: give --init too")
    if args.mlp_width and args.init and not (args.resume and (Path(args.out) / "checkpoint.pt").is_file()):
        have = mlp_width(read_init(args.init)["model"])
        if args.mlp_width < have:
            raise SystemExit(f"--mlp-width {args.mlp_width}: the --init drafter's MLP has {have} units; "
                             f"give at least {have} (a width only grows)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    if "auto" in (args.target_dtype, args.autocast):
        choose_dtypes(args)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "extra"})
    model, tok = load_model(args.target, dtype=args.target_dtype, device=args.device)
    target = Target(model, tok)
    eos = (tok.eos_token_id,)
    if args.export_only:
        ck = torch.load(Path(cfg.out) / "checkpoint.pt", weights_only=False, map_location="cpu")
        keep = torch.load(Path(cfg.out) / "vocab.pt", map_location="cpu")["keep"]
        net = build_drafter(target, keep, "random", cfg.seed, mlp_width(ck["model"]))
        net.load_state_dict(ck["model"])
        if cfg.ema:  # the moving average of the run (--ema 0 exports the raw weights)
            if ck.get("ema") is None:
                raise SystemExit(f"--export-only --ema {cfg.ema}: {cfg.out} kept no moving average; give --ema 0")
            net.load_state_dict({**ck["model"], **ck["ema"]})
        print(export(net, args.export or Path(cfg.out) / "export", target), json.dumps(ck["state"]))
        return
    flags = {k: getattr(args, k) for k in STREAM_FLAGS}
    if packed:
        stream = read_pack(Path(args.data[0]), tok, flags)
        print(f"[train] {args.data[0]}: {stream.meta['sequences']} packed sequences, {stream.meta['tokens']} tokens",
              flush=True)
    else:
        screen = build_index()  # evaluation prompts: a training conversation that overlaps one is dropped
        if not SPEC_BENCH.is_file():
            print(f"[train] no Spec-Bench at {SPEC_BENCH}: its prompts are not screened out", flush=True)
        stream = build_stream(tok, args.data, screen=screen, **flags)
    if args.pack:
        if packed or not args.pack.endswith(PACK_SUFFIX):
            raise SystemExit(f"--pack {args.pack}: name a new file ending in {PACK_SUFFIX}, from sources that are not a pack")
        meta = write_pack(stream, Path(args.pack), progress=args.progress)
        print(f"[train] packed {meta['sequences']} sequences, {meta['tokens']} tokens, into {args.pack} (stored once "
              f"each: {meta['distinct']} distinct, the held-out ones included)", flush=True)
        return
    t0 = time.time()
    net = train(cfg, target, stream.sequences, stream.val, stream.prompts, eos, resume=args.resume)
    print(f"[train] done in {time.time() - t0:.0f} s", flush=True)
    if args.export:
        print("[train] exported to", export(net, args.export, target))


if __name__ == "__main__":
    main()
