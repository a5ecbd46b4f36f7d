"""One run: load the target and the method, decode every turn of every question, interleave the AR
baseline prompt by prompt, and write answers.jsonl (Spec-Bench format plus output_ids) and summary.json."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .audit import Auditor
from .config import RunConfig
from .data import DATASETS, Question
from .decode import Generation, Method, StopRule, generate
from .drafters import DRAFTERS
from .drafters.none import NoDrafter
from .errors import ConfigError
from .graft import GRAFTS, graft_root
from .metrics import TurnStats, aggregate, peak_memory_mb
from .models.target import Target, load_model
from .planner import build_planner
from .profile import drafter_id
from .pruners import PRUNERS, NoPruner
from .retrievers import RETRIEVERS, NoRetriever
from .stopping import StopStrings
from .verify import SamplingParams


def build_target(run: RunConfig) -> Target:
    m = run.model
    model, tokenizer = load_model(m.path, dtype=m.dtype, device=m.device, device_map=m.device_map)
    target = Target(model, tokenizer, max_context=m.max_context)
    attn = run.verify.attn
    if attn == "auto":
        attn = "triton" if target.device.type == "cuda" else "sdpa"
    target.use_attention(attn)
    return target


def build_method(target: Target, run: RunConfig, nodes: dict[str, Any]) -> Method:
    if run.tree.top_k > target.vocab_size:
        raise ConfigError(f"tree.top_k ({run.tree.top_k}) is larger than the vocabulary ({target.vocab_size})")
    retriever = RETRIEVERS.build(nodes["retriever"], vocab_size=target.vocab_size, device=target.device)
    drafter = DRAFTERS.build(nodes["drafter"], target=target)
    # tree=auto: the cost model, with this machine's profile (cached, or measured now in a few seconds)
    planner = build_planner(run.tree.plan, target, drafter, run.tree.total_tokens, run.model.path,
                            drafter_id(nodes["drafter"]))
    return Method(
        drafter=drafter,
        pruner=PRUNERS.build(nodes["pruner"], planner=planner),  # pruner=cost prices levels with it
        retriever=retriever,
        graft=GRAFTS.build(nodes["graft"], retriever=retriever),  # tail / match query the retriever
        budget=run.tree.total_tokens,
        planner=planner,
    )


def ar_method() -> Method:
    """The baseline: the same engine with a one-node tree."""
    return Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, budget=1)


def chat_prompt(target: Target, messages: list[dict[str, str]]) -> torch.Tensor:
    ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    return torch.tensor(ids, dtype=torch.long, device=target.device)


def eos_ids(target: Target) -> tuple[int, ...]:
    eos = target.model.generation_config.eos_token_id
    if eos is None:
        eos = target.tokenizer.eos_token_id
    return tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())


def timed(target: Target, method: Method, prompt, params, stop, generator) -> tuple[Generation, TurnStats]:
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    if target.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(target.device)
    sync()
    t0 = time.perf_counter()
    gen = generate(target, method, prompt, params, stop, generator)
    sync()
    wall = time.perf_counter() - t0
    return gen, TurnStats.of(gen.tokens, gen.steps, gen.prefill_s, wall, peak_memory_mb(target.device))


def answer_question(target, method, baseline, q: Question, run: RunConfig, model_id: str, generator,
                    auditor: Auditor | None = None) -> tuple[dict, list, list]:
    params = SamplingParams(run.gen.temperature, run.gen.top_p, run.gen.top_k)
    strings = StopStrings(target.tokenizer, tuple(run.gen.stop_strings)) if run.gen.stop_strings else None
    stop = StopRule(run.gen.max_new_tokens, eos_ids(target), strings)
    messages: list[dict[str, str]] = []
    turns, stats, base_stats, texts, ids, matches = [], [], [], [], [], []
    for i, turn in enumerate(q.turns):
        messages.append({"role": "user", "content": turn})
        prompt = chat_prompt(target, messages)
        gen, st = timed(target, method, prompt, params, stop, generator)
        if baseline is not None:
            base, bst = timed(target, baseline, prompt, params, stop, generator)
            base_stats.append(bst)
            matches.append(base.tokens == gen.tokens if params.greedy else None)
            if auditor is not None and params.greedy:
                auditor.add(q.question_id, i, prompt, gen, base)
        text = target.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": text})
        stats.append(st)
        texts.append(text)
        ids.append(gen.tokens)
        turns.append(gen.stop_reason)
    record = {
        "question_id": q.question_id,
        "category": q.category,
        "model_id": model_id,
        "choices": [{
            "index": 0,
            "turns": texts,
            "new_tokens": [s.new_tokens for s in stats],
            "wall_time": [s.wall_time for s in stats],
            "decoding_steps": [len(s.accept_lengths) for s in stats],
            "accept_lengths": [s.accept_lengths for s in stats],
            "peak_memory_mb": [s.peak_memory_mb for s in stats],
            "tree_sizes": [s.tree_sizes for s in stats],  # per step: nodes verified
            "step_times": [s.step_times for s in stats],  # per step: seconds
            # tree=auto: the planner's expected tokens and step seconds per step; None for a fixed tree
            "predicted_tokens": [None if None in s.predicted_tokens else s.predicted_tokens for s in stats],
            "predicted_step_times": [None if None in s.predicted_times else s.predicted_times for s in stats],
            "output_ids": ids,
        }],
        "stop_reasons": turns,
        "baseline": None if baseline is None else {
            "wall_time": [s.wall_time for s in base_stats],
            "new_tokens": [s.new_tokens for s in base_stats],
            "matches": matches,
        },
        "tstamp": time.time(),
    }
    return record, stats, base_stats


def reliability(method: Method) -> list | None:
    acceptance = getattr(method.planner, "acceptance", None)
    return acceptance.reliability() if acceptance is not None else None


def atomic_write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run(run_cfg: RunConfig, nodes: dict[str, Any], out_dir: Path, meta: dict) -> dict:
    """Decode the dataset into `out_dir`; returns the summary. Ctrl-C keeps finished questions and marks
    the run incomplete."""
    questions = DATASETS.build(nodes["dataset"])
    if not questions:
        raise ConfigError("the dataset selection is empty")
    target = build_target(run_cfg)
    method = build_method(target, run_cfg, nodes)
    baseline = ar_method() if run_cfg.baseline == "ar" else None
    auditor = Auditor(target, method)  # explains every greedy turn that differs from AR
    generator = torch.Generator(device=target.device).manual_seed(run_cfg.gen.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    answers = out_dir / "answers.jsonl"
    answers.write_text("")
    all_stats, all_base, categories, mismatches = [], [], {}, []
    complete = False
    try:
        with answers.open("a") as f:
            for q in tqdm(questions, desc=f"{run_cfg.model.name} {nodes['drafter']['name']}", unit="q"):
                record, stats, base = answer_question(target, method, baseline, q, run_cfg, run_cfg.model.name, generator, auditor)
                f.write(json.dumps(record) + "\n")
                f.flush()
                all_stats += stats
                all_base += base
                categories.setdefault(q.category, ([], []))
                categories[q.category][0].extend(stats)
                categories[q.category][1].extend(base)
                if record["baseline"] and False in record["baseline"]["matches"]:
                    mismatches.append(q.question_id)
        complete = True
    except KeyboardInterrupt:
        print("\n[graft-lab] interrupted: keeping the finished questions, marking the run incomplete")
    summary = {
        **aggregate(all_stats, all_base or None),
        "complete": complete,
        "n_questions": len({json.loads(line)["question_id"] for line in answers.read_text().splitlines()}),
        "n_turns": len(all_stats),
        "matches_baseline": (not mismatches) if all_base and run_cfg.gen.temperature == 0 else None,
        "mismatched_questions": mismatches,
        **auditor.summarise(),
        "per_category": {c: aggregate(s, b or None) for c, (s, b) in categories.items()},
        "peak_memory_mb": max((s.peak_memory_mb for s in all_stats + all_base), default=peak_memory_mb(target.device)),
        "device": str(target.device),
        "tree": asdict(run_cfg.tree),
        # tree=auto: per predicted path-probability bin, [mean predicted, share accepted, nodes]
        "acceptance_reliability": reliability(method),
        **meta,
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return summary
