"""One run: load the target and the method, decode every turn of every question, interleave the AR
baseline prompt by prompt, and write answers.jsonl (Spec-Bench format plus output_ids and per-turn stats)
and summary.json, which is always computed from the finished questions' records (so a resumed run's
summary covers the questions of every session)."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import torch
from tqdm.auto import tqdm

from .audit import Auditor
from .config import RunConfig
from .data import Question, source_of
from .decode import Generation, Method, StopRule, generate
from .drafters import DRAFTERS
from .drafters.none import NoDrafter
from .errors import ConfigError, ContextLimitError, GraftLabError
from .graft import GRAFTS, graft_root
from .metrics import TurnStats, aggregate, peak_memory_mb
from .models.target import Target, load_model
from .planner import build_planner
from .profile import drafter_id
from .prompts import chat_ids, check_budget, check_first_turns
from .pruners import PRUNERS, NoPruner
from .retrievers import RETRIEVERS, NoRetriever
from .rundir import RunDir
from .stopping import StopStrings
from .verify import SamplingParams


def build_target(run: RunConfig) -> Target:
    m = run.model
    model, tokenizer = load_model(m.path, dtype=m.dtype, device=m.device, device_map=m.device_map)
    target = Target(model, tokenizer, max_context=m.max_context)
    target.use_linear(m.linear)
    if target.linear_timing is not None:
        print(f"[graft-lab] model.linear=auto: {target.linear_timing.describe()}")
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
    return torch.tensor(chat_ids(target.tokenizer, messages), dtype=torch.long, device=target.device)


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


def question_generator(seed: int, question_id: int | str, device: torch.device) -> torch.Generator:
    """A generator per question and per decoder (method, baseline), seeded from gen.seed and the question:
    sampled output depends neither on the other decoder nor on which questions ran before (resume)."""
    digest = hashlib.sha256(f"{seed}:{question_id!r}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def answer_question(target, method, baseline, q: Question, run: RunConfig, model_id: str,
                    auditor: Auditor | None = None) -> dict:
    """Every turn of `q` with the method (and the baseline on the same prompt). A later turn whose prompt no
    longer fits the context ends the question there, recorded as stop reason 'prompt_too_long'."""
    params = SamplingParams(run.gen.temperature, run.gen.top_p, run.gen.top_k)
    strings = StopStrings(target.tokenizer, tuple(run.gen.stop_strings)) if run.gen.stop_strings else None
    stop = StopRule(run.gen.max_new_tokens, eos_ids(target), strings)
    gen_method = question_generator(run.gen.seed, q.question_id, target.device)
    gen_base = question_generator(run.gen.seed, q.question_id, target.device)
    messages: list[dict[str, str]] = []
    turns, stats, base_stats, texts, ids, matches = [], [], [], [], [], []
    for t, turn in enumerate(q.turns):
        messages.append({"role": "user", "content": turn})
        prompt = chat_prompt(target, messages)
        try:
            gen, st = timed(target, method, prompt, params, stop, gen_method)
        except ContextLimitError:
            if t == 0:
                raise
            turns.append("prompt_too_long")
            break
        if baseline is not None:
            base, bst = timed(target, baseline, prompt, params, stop, gen_base)
            base_stats.append(bst)
            matches.append(base.tokens == gen.tokens if params.greedy else None)
            if auditor is not None and params.greedy:
                auditor.add(q.question_id, t, prompt, gen, base)
        text = target.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": text})
        stats.append(st)
        texts.append(text)
        ids.append(gen.tokens)
        turns.append(gen.stop_reason)
    return {
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
        "stats": {"method": [asdict(s) for s in stats], "baseline": [asdict(s) for s in base_stats]},
        "tstamp": time.time(),
    }


def summarize(records: list[dict], run_cfg: RunConfig, device: torch.device, meta: dict, complete: bool,
              error: str | None = None, session: dict | None = None) -> dict:
    """summary.json from the records of the finished questions (this session's and any resumed ones);
    `session`: what only this session knows (the divergence audit of its turns, the planner's calibration)."""
    all_stats, all_base, categories, mismatches = [], [], {}, []
    for rec in records:
        stats = [TurnStats(**s) for s in rec["stats"]["method"]]
        base = [TurnStats(**s) for s in rec["stats"]["baseline"]]
        all_stats += stats
        all_base += base
        cat = categories.setdefault(rec["category"], ([], []))
        cat[0].extend(stats)
        cat[1].extend(base)
        if rec["baseline"] and False in rec["baseline"]["matches"]:
            mismatches.append(rec["question_id"])
    return {
        **aggregate(all_stats, all_base or None),
        "complete": complete,
        "error": error,
        "n_questions": len(records),
        "n_turns": len(all_stats),
        "matches_baseline": (not mismatches) if all_base and run_cfg.gen.temperature == 0 else None,
        "mismatched_questions": mismatches,
        "cut_by_context": [r["question_id"] for r in records if "prompt_too_long" in r["stop_reasons"]],
        **(session or {}),
        "per_category": {c: aggregate(s, b or None) for c, (s, b) in categories.items()},
        "peak_memory_mb": max((s.peak_memory_mb for s in all_stats + all_base), default=peak_memory_mb(device)),
        "device": str(device),
        "tree": asdict(run_cfg.tree),
        **meta,
    }


def reliability(method: Method) -> list | None:
    """tree=auto: per predicted path-probability bin, [mean predicted, share accepted, nodes]."""
    acceptance = getattr(method.planner, "acceptance", None)
    return acceptance.reliability() if acceptance is not None else None


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a scheduler's or `kill`'s stop) takes Ctrl-C's path: finished questions are kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def interrupts_held():
    """Ctrl-C and SIGTERM wait until the block is done (they are raised at its end), so a question is kept whole:
    its line in answers.jsonl and its record in the summary, or neither. Without it, a stop that landed between
    the line's write and its fsync cut back a line another process had already read."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run(run_cfg: RunConfig, nodes: dict[str, Any], questions: list[Question], out: RunDir, resume: bool,
        meta: dict) -> dict:
    """Decode `questions` into `out`; returns the summary, which is on disk before the first question is
    decoded and after each stop. Ctrl-C or SIGTERM keeps the finished questions and marks the run
    incomplete; a decoding or write error does too, and is named in the summary's `error`."""
    target = build_target(run_cfg)
    check_budget(run_cfg, target.max_context)
    check_first_turns(questions, target.tokenizer, target.max_context, source_of(nodes["dataset"]))
    method = build_method(target, run_cfg, nodes)
    baseline = ar_method() if run_cfg.baseline == "ar" else None
    auditor = Auditor(target, method)  # explains every greedy turn of this session that differs from AR
    records = out.start(resume)
    done = {json.dumps(r["question_id"]) for r in records}
    todo = [q for q in questions if json.dumps(q.question_id) not in done]
    if records:
        print(f"[graft-lab] resuming {out.path}: {len(records)} of {len(questions)} questions are done")
    out.write_summary(summarize(records, run_cfg, target.device, meta, complete=False))
    complete, error = False, None
    bar = tqdm(todo, desc=f"{run_cfg.model.name} {nodes['drafter']['name']}", unit="q", total=len(questions),
               initial=len(questions) - len(todo))
    q = None
    try:
        with sigterm_as_interrupt():
            for q in bar:
                record = answer_question(target, method, baseline, q, run_cfg, run_cfg.model.name, auditor)
                with interrupts_held():
                    out.append(record)
                    records.append(record)
        complete = True
    except KeyboardInterrupt:
        print("\n[graft-lab] interrupted: keeping the finished questions, marking the run incomplete")
    except GraftLabError as exc:
        error = f"question {q.question_id if q else '?'}: {str(exc).splitlines()[0]}"
    finally:
        bar.close()
    session = {**auditor.summarise(), "acceptance_reliability": reliability(method)}
    summary = summarize(records, run_cfg, target.device, meta, complete, error, session)
    out.write_summary(summary)
    return summary
