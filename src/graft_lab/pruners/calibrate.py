"""Calibrate dyn_depth thresholds: decode warm-up prompts with a recording pruner that never stops, then
set each checkpoint's threshold to the quantile that stops the wanted share of drafts there.

    python -m graft_lab.pruners.calibrate --drafter builtin:smollm2-135m-instruct-eagle3 \
        --stop-rates 0.3 0.3 0.2 --limit 20 --name dyn_depth_smollm2

writes conf/pruner/dyn_depth_smollm2.yaml, usable as `pruner=dyn_depth_smollm2`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ..data import DATASETS
from ..decode import Method, StopRule, generate
from ..drafters import DRAFTERS
from ..errors import ConfigError, GraftLabError
from ..graft import graft_root
from ..models.target import EMBEDDED, Target, load_model
from ..retrievers import NoRetriever
from ..runner import chat_prompt, eos_ids
from ..tree import tree_shape
from ..verify import SamplingParams
from .base import PRUNERS
from .dyn_depth import DynDepthOptions, DynDepthPruner


def thresholds_for(conf: np.ndarray, stop_rates: list[float]) -> list[float]:
    """Thresholds that stop `stop_rates[i]` of all drafts at checkpoint i, checkpoints applied in order.

    conf: [T, C] confidence per draft and checkpoint (NaN: not reached). Checkpoint i sees only the drafts
    that passed 0..i-1, so its quantile is taken over those at the rate rescaled to them."""
    steps, n_ckpt = conf.shape
    if len(stop_rates) != n_ckpt or any(r < 0 for r in stop_rates) or sum(stop_rates) > 1:
        raise ConfigError(f"need {n_ckpt} stop rates >= 0 summing to at most 1, got {stop_rates}")
    alive = np.ones(steps, dtype=bool)
    out = []
    for i, rate in enumerate(stop_rates):
        c = conf[:, i]
        seen = alive & ~np.isnan(c)
        values = np.sort(c[seen])
        stop = min(round(rate * steps), values.size)  # drafts to stop here
        if stop == 0:
            thr = 0.0
        elif stop < values.size:
            thr = float(values[stop])  # c < values[stop] stops the `stop` lowest (fewer on ties)
        else:
            thr = float(np.nextafter(values[-1], np.inf))  # stop them all
        out.append(min(thr, 1.0))
        alive = seen & (c >= out[-1])
    return out


def significant(t: float, digits: int = 4) -> float:
    """Round to significant digits, not decimals: deep checkpoints' path probabilities are often below 1e-6."""
    return float(f"{t:.{digits}g}")


def stop_shares(conf: np.ndarray, thresholds: list[float]) -> list[float]:
    """Share of drafts each checkpoint stops under `thresholds` (what the pruner would do)."""
    alive = np.ones(conf.shape[0], dtype=bool)
    shares = []
    for i, thr in enumerate(thresholds):
        c = conf[:, i]
        stop = alive & (c < thr)  # NaN compares False: a draft that never reached i does not stop there
        shares.append(float(stop.mean()))
        alive &= ~np.isnan(c) & ~stop
    return shares


def collect(target: Target, drafter, prompts: list[torch.Tensor], opts: DynDepthOptions, budget: int,
            max_new_tokens: int, eos: tuple[int, ...] = ()) -> np.ndarray:
    """[T, C] checkpoint confidences of every draft made while greedily decoding `prompts`."""
    pruner = DynDepthPruner(dataclasses.replace(opts, thresholds=[0.0] * len(opts.checkpoints)), record=True)
    method = Method(drafter, pruner, NoRetriever(), graft_root, budget)
    for prompt in prompts:
        generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens, eos))
    return np.asarray(pruner.confidences, dtype=np.float64).reshape(-1, len(opts.checkpoints))


def write_config(path: Path, opts: DynDepthOptions, comment: str) -> None:
    """A pruner config file: `name: dyn_depth` plus the options, under a comment saying where they came from."""
    body = OmegaConf.to_yaml(OmegaConf.create({"name": "dyn_depth", **dataclasses.asdict(opts)}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"# {line}\n" for line in comment.splitlines()) + body)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m graft_lab.pruners.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=EMBEDDED, help="model path or hub id (default: the embedded SmolLM2)")
    ap.add_argument("--drafter", default="builtin:smollm2-135m-instruct-eagle3", help="EAGLE-3 checkpoint")
    ap.add_argument("--budget", type=int, default=60, help="K, verified nodes per step; depth and top_k follow it (tree_shape)")
    ap.add_argument("--questions", default=None, help="question.jsonl for warm-up prompts (default: MT-Bench)")
    ap.add_argument("--limit", type=int, default=20, help="warm-up questions (first turns)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--base", default=None, help="pruner YAML whose checkpoints and draft_split to keep (default: dyn_depth's)")
    ap.add_argument("--stop-rates", type=float, nargs="+", required=True, help="share of drafts to stop at each checkpoint")
    ap.add_argument("--name", required=True, help="config name: writes OUT_DIR/NAME.yaml")
    ap.add_argument("--out-dir", default="conf/pruner")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args(argv)


def base_options(path: str | None) -> DynDepthOptions:
    if path is None:
        return DynDepthOptions()
    node = OmegaConf.load(path)
    if node.get("name") != "dyn_depth":
        raise ConfigError(f"{path} is not a dyn_depth pruner config")
    return PRUNERS.options(node)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        opts = base_options(args.base)
        if len(args.stop_rates) != len(opts.checkpoints):
            raise ConfigError(f"--stop-rates needs one value per checkpoint {opts.checkpoints}")
        spec = {"name": "jsonl", "path": args.questions} if args.questions else {"name": "mt_bench"}
        questions = DATASETS.build({**spec, "limit": args.limit, "first_turn_only": True})
        model, tokenizer = load_model(args.target, dtype=args.dtype, device=args.device)
        target = Target(model, tokenizer)
        shape = tree_shape(args.budget)
        drafter = DRAFTERS.build({"name": "eagle3", "path": args.drafter, "depth": shape.depth, "top_k": shape.top_k}, target=target)
    except GraftLabError as exc:
        print(f"graft-lab: error: {exc}", file=sys.stderr)
        return 2
    prompts = [chat_prompt(target, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    conf = collect(target, drafter, prompts, opts, args.budget, args.max_new_tokens, eos_ids(target))
    thresholds = thresholds_for(conf, args.stop_rates)
    calibrated = dataclasses.replace(opts, thresholds=[significant(t) for t in thresholds])
    out = Path(args.out_dir) / f"{args.name}.yaml"
    write_config(out, calibrated, (
        f"dyn_depth thresholds calibrated by graft_lab.pruners.calibrate: {len(prompts)} prompts, {conf.shape[0]} drafts\n"
        f"target {args.target}, drafter {args.drafter}, K={args.budget}, depth and top_k from tree_shape(K)\n"
        f"target stop rates {args.stop_rates}; on the warm-up drafts: {[round(s, 3) for s in stop_shares(conf, calibrated.thresholds)]}"
    ))
    print(f"wrote {out}: thresholds {calibrated.thresholds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
