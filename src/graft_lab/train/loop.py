"""The training loop: on-the-fly target features, batched TTT, AdamW with warm-up + cosine decay,
atomic resumable checkpoints, held-out per-step accuracy and a tau learning curve."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig

from ..drafters.eagle3_checkpoint import save_eagle3
from ..drafters.eagle3_model import Eagle3Model
from ..models.target import Target
from .features import Features, target_features
from .ttt import ttt_loss
from .vocab import count_labels, coverage, draft_vocab, grow, grow_head, maps
from .widen import mlp_width, widen_mlp

Sequences = Callable[[int], Iterator[tuple[int, torch.Tensor, torch.Tensor]]]  # skip -> (position, ids, mask)


@dataclass
class TrainConfig:
    out: str = "runs/eagle3"  # run directory: checkpoint.pt, vocab.pt, log.jsonl, curve.jsonl, export/
    draft_vocab: int = 8192
    vocab_sequences: int = 2000  # training sequences counted for the draft vocabulary
    ttt_steps: int = 7
    labels: str = "soft"  # soft: target distribution over the draft vocab; hard: the data token
    decay: float = 0.8  # step j loss weight decay**j
    anchor_frac: float = 1.0  # share of trained anchors that also run TTT steps >= 1 (cost vs signal)
    lr: float = 8e-4
    min_lr_ratio: float = 0.1
    warmup_tokens: int = 100_000
    weight_decay: float = 0.01
    clip: float = 0.5
    ema: float = 0.0  # > 0: also keep an exponential moving average of the weights, this decay per optimizer step,
    # from the start's weights; the run ends with it (validated beside the raw weights) and exports it
    labels_per_step: int = 2048  # label (assistant) tokens per optimizer step
    batch_sequences: int = 1  # sequences per forward, right-padded (a GPU wants many; 1: no padding, as on 2 cores)
    max_tokens: int = 5_000_000  # sequence tokens through the target; the lr schedule spans this
    max_minutes: float = 0.0  # training wall-time budget (summed over resumes, evaluation excluded); 0: none.
    # The lr schedule runs on progress = max(tokens / max_tokens, wall / max_minutes): it ends with the budget.
    autocast: bool = True  # bf16 autocast for the drafter (AMX on recent Xeons); weights stay fp32
    head_init: str = "rows"  # rows: lm_head = the target's head rows of the draft vocab; target: and its final norm; random
    seed: int = 0  # random head (no init, head_init=random) and anchor sampling (anchor_frac < 1) only: the data order is
    # fixed, so a run from `init` with anchor_frac 1.0 is the same for every seed
    init: str = ""  # a run directory or an exported drafter (builtin:NAME) whose weights and draft vocab start this
    # run (fresh optimizer and schedule)
    grow_vocab: int = 0  # with init: grow its draft vocab to this many tokens, adding the most frequent labels of the
    # first vocab_sequences (new lm_head rows mapped from the target's: vocab.grow_head); 0: keep it as it is
    mlp_width: int = 0  # MLP hidden units; 0: the init's (a resumed run: its own), else the target's intermediate size.
    # Wider than the init's widens it without changing its output (widen.widen_mlp)
    ckpt_every: int = 50  # optimizer steps
    log_every: int = 10
    eval_every_tokens: int = 1_000_000  # tau learning curve; 0: only at the end
    eval_trees: tuple[str, ...] = ("dense", "chain")
    eval_new_tokens: int = 64
    min_labels: int = 8  # skip sequences with fewer label tokens
    prefetch: int = 2  # sequences whose target features a background thread computes ahead; 0: inline
    progress: bool = True
    extra: dict = field(default_factory=dict)


def drafter_config(target: Target, draft_vocab_size: int, mlp_width: int = 0) -> LlamaConfig:
    tc = target.config
    return LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=tc.hidden_size, intermediate_size=mlp_width or tc.intermediate_size,
        num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        rms_norm_eps=tc.rms_norm_eps, max_position_embeddings=tc.max_position_embeddings,
        rope_parameters=dict(getattr(tc, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}),
        attention_bias=False, hidden_act="silu", bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id, num_hidden_layers=1, draft_vocab_size=draft_vocab_size,
    )


def build_drafter(target: Target, keep: torch.Tensor, head_init: str, seed: int, mlp_width: int = 0) -> Eagle3Model:
    torch.manual_seed(seed)
    net = Eagle3Model(drafter_config(target, keep.numel(), mlp_width), target_hidden_size=target.hidden_size)
    d2t, t2d = maps(keep, target.vocab_size)
    net.d2t.copy_(d2t)
    net.t2d.copy_(t2d)
    if head_init in ("rows", "target"):
        with torch.no_grad():
            net.lm_head.weight.copy_(target.model.get_output_embeddings().weight[keep].float())
            norm = getattr(target.model.model, "norm", None)
            if norm is not None and head_init == "target":
                net.norm.weight.copy_(norm.weight.float())
    return net.float()


def progress(cfg: TrainConfig, tokens: int, wall: float) -> float:
    frac = tokens / max(1, cfg.max_tokens)
    if cfg.max_minutes:
        frac = max(frac, wall / (60 * cfg.max_minutes))
    return min(1.0, frac)


def lr_at(cfg: TrainConfig, tokens: int, wall: float = 0.0) -> float:
    if tokens < cfg.warmup_tokens:
        return cfg.lr * max(tokens, 1) / cfg.warmup_tokens
    frac = progress(cfg, tokens, wall)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def read_init(path: str) -> dict:
    """{"model": state dict, "vocab": {"keep", ...}} of a run to start from: a training run directory
    (checkpoint.pt + vocab.pt) or an exported drafter in the official format, such as the shipped one
    (`builtin:NAME` or a directory with config.json + model.safetensors: its weights in fp32, its d2t/t2d map)."""
    run = Path(path)
    if all((run / f).is_file() for f in ("checkpoint.pt", "vocab.pt")):
        return {"model": torch.load(run / "checkpoint.pt", weights_only=False, map_location="cpu")["model"],
                "vocab": torch.load(run / "vocab.pt", map_location="cpu")}
    from ..drafters.eagle3_checkpoint import ModelLoadError, load_eagle3

    try:
        net, _ = load_eagle3(path, dtype=torch.float32)
    except ModelLoadError as exc:
        raise FileNotFoundError(f"init={path!r} is neither a training run directory (checkpoint.pt and vocab.pt) "
                                f"nor an exported EAGLE-3 drafter: {exc}") from None
    keep = net.t2d.nonzero().flatten()
    return {"model": {k: v.float() if v.is_floating_point() else v for k, v in net.state_dict().items()},
            "vocab": {"keep": keep, "coverage": None}}


@dataclass
class Batch:
    """Training sequences stacked for one forward, right-padded, on the target's device."""

    last: int  # stream position of the last sequence
    ids: torch.Tensor  # [B, T] token ids (0 after a row's end)
    mask: torch.Tensor  # [B, T] bool: the assistant tokens trained (False after a row's end)
    tokens: int  # sequence tokens without the padding
    features: Features | None = None  # of ids, [B, T, ...]: prefetch computes them


def batches(stream, size: int, device) -> Iterator[Batch]:
    """Group (position, ids [T], mask [T]) into right-padded Batches of `size` sequences (the last may be short)."""
    rows: list = []

    def stack() -> Batch:
        t = max(r[1].numel() for r in rows)
        ids = torch.zeros(len(rows), t, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.bool)
        for b, (_, x, m) in enumerate(rows):
            ids[b, : x.numel()], mask[b, : m.numel()] = x, m
        return Batch(rows[-1][0], ids.to(device), mask.to(device), sum(r[1].numel() for r in rows))

    for row in stream:
        rows.append(row)
        if len(rows) == size:
            yield stack()
            rows = []
    if rows:
        yield stack()


def prefetch(stream: Iterator[Batch], target: Target, keep: torch.Tensor, depth: int) -> Iterator[Batch]:
    """Compute target features in a background thread, `depth` batches ahead of the trainer: with one
    intra-op thread per Python thread, the target prefill and the drafter's training overlap on two cores
    (ATen releases the GIL) without OpenMP barrier stalls. Yields the Batches with their features."""
    def featured(batch: Batch) -> Batch:
        batch.features = target_features(target, batch.ids, keep)
        return batch

    if depth <= 0:
        for batch in stream:
            yield featured(batch)
        return
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> None:  # gives up once the trainer stops reading: it may stop with the queue full
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def work():
        try:
            for batch in stream:
                if stop.is_set():
                    return
                put(featured(batch))
        except BaseException as exc:  # surfaced in the trainer
            put(exc)
            return
        put(None)  # the end of the stream

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()  # a prefill still running at interpreter exit would abort the process ("terminate called")


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


@torch.no_grad()
def validate(net, target, val, keep, t2d_index, cfg) -> dict:
    """Per-step loss and top-1 agreement with the target (and with the data token) on held-out sequences."""
    net.eval()
    agg = [[0.0, 0, 0, 0, 0] for _ in range(cfg.ttt_steps)]
    for ids, mask in val:
        f = target_features(target, ids, keep, full=True)
        _, stats = ttt_loss(net, ids, mask, f.aux, f.embeds, f.draft_logits, t2d_index, cfg.ttt_steps,
                            cfg.labels, cfg.decay, cfg.autocast, top_in_vocab=f.top_in_vocab)
        for a, s in zip(agg, stats or []):
            for i in range(5):
                a[i] += s[i]
    net.train()
    return {"val_loss": [round(a[0] / max(a[3], 1), 4) for a in agg],
            "val_acc": [round(a[1] / max(a[3], 1), 4) for a in agg],
            "val_acc_full": [round(a[4] / max(a[3], 1), 4) for a in agg],
            "val_acc_data": [round(a[2] / max(a[3], 1), 4) for a in agg]}


def train(cfg: TrainConfig, target: Target, sequences: Sequences, val=(), eval_prompts=(), eos_ids=(),
          resume: bool = False) -> Eagle3Model:
    """Train (or resume) a drafter for `target`; returns the network. `sequences(skip)` streams training
    (position, ids [T], assistant mask [T]) from stream position `skip`."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, vocab_path = out / "checkpoint.pt", out / "vocab.pt"
    if cfg.grow_vocab and not cfg.init:
        raise ValueError("grow_vocab grows the draft vocab of the init drafter: give init too (or draft_vocab alone)")
    if cfg.batch_sequences < 1:
        raise ValueError(f"batch_sequences {cfg.batch_sequences}: give at least 1 sequence per forward")
    resuming = resume and ckpt_path.is_file()  # the run's own checkpoint and vocabulary win over the init's
    init_state = read_init(cfg.init) if cfg.init and not resuming else None
    ck = torch.load(ckpt_path, weights_only=False, map_location="cpu") if resuming else None
    width = cfg.mlp_width
    if ck is not None:
        width = mlp_width(ck["model"])
    elif init_state is not None:
        have = mlp_width(init_state["model"])
        width = width or have
        init_state["model"] = widen_mlp(init_state["model"], width, torch.Generator().manual_seed(cfg.seed))
        if width != have:
            print(f"[train] MLP widened from {have} to {width} units (the new ones start at zero output)", flush=True)
    torch.manual_seed(cfg.seed)

    def label_counts() -> torch.Tensor:
        return count_labels((s[1:] for _, s in zip(range(cfg.vocab_sequences), sequences(0))), target.vocab_size)

    t0 = time.perf_counter()
    if resume and vocab_path.is_file():
        vocab = torch.load(vocab_path, map_location="cpu")
    elif init_state is not None and cfg.grow_vocab:
        counts, small = label_counts(), init_state["vocab"]["keep"]
        keep = grow(small, counts, cfg.grow_vocab)
        init_state["model"] = grow_head(init_state["model"], small, keep,
                                        target.model.get_output_embeddings().weight.detach().float().cpu())
        vocab = {"keep": keep, "counts": counts, "coverage": coverage(counts, keep), "grown_from": small.numel(),
                 "seconds": time.perf_counter() - t0}
        atomic_save(vocab, vocab_path)
    elif init_state is not None:
        vocab = init_state["vocab"]
        atomic_save(vocab, vocab_path)
    else:
        counts = label_counts()
        keep = draft_vocab(counts, cfg.draft_vocab, tuple(i for i in eos_ids if i is not None))
        vocab = {"keep": keep, "counts": counts, "coverage": coverage(counts, keep),
                 "seconds": time.perf_counter() - t0}
        atomic_save(vocab, vocab_path)
    keep = vocab["keep"]
    covers = "an unknown share" if vocab.get("coverage") is None else f"{vocab['coverage']:.4f}"
    print(f"[train] draft vocab {keep.numel()} covers {covers} of label tokens", flush=True)
    t2d_index = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d_index[keep] = torch.arange(keep.numel())
    t2d_index = t2d_index.to(target.device)
    net = build_drafter(target, keep, cfg.head_init, cfg.seed, width)
    if init_state is not None:
        net.load_state_dict(init_state["model"])
        print(f"[train] initialised from {cfg.init}", flush=True)
    net.to(target.device)
    net.train()
    decay, no_decay = [], []
    for name, p in net.named_parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    state = {"step": 0, "tokens": 0, "label_tokens": 0, "consumed": 0, "wall": 0.0, "next_eval": cfg.eval_every_tokens}
    if not 0.0 <= cfg.ema < 1.0:
        raise ValueError(f"ema {cfg.ema}: give a decay in [0, 1) (0: no moving average)")
    if ck is not None:
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
    params = dict(net.named_parameters())
    ema = None
    if cfg.ema:
        saved = (ck or {}).get("ema")
        if ck is not None and saved is None:
            print("[train] the checkpoint has no moving average: it starts from the resumed weights", flush=True)
        ema = {k: (saved[k].to(p.device) if saved else p.detach().float().clone()) for k, p in params.items()}
    if ck is not None:
        state = ck["state"]
        if cfg.eval_every_tokens:  # the evaluation interval may change on resume
            state["next_eval"] = min(state["next_eval"], (state["tokens"] // cfg.eval_every_tokens + 1) * cfg.eval_every_tokens)
        torch.set_rng_state(ck["rng"])
        print(f"[train] resumed at step {state['step']}, {state['tokens']} tokens, stream position {state['consumed']}", flush=True)

    def checkpoint():
        atomic_save({"model": net.state_dict(), "opt": opt.state_dict(), "state": state, "rng": torch.get_rng_state(),
                     "config": asdict(cfg), "ema": ema}, ckpt_path)

    def curve_point(final=False, weights="raw"):
        row = {"step": state["step"], "tokens": state["tokens"], "label_tokens": state["label_tokens"],
               "wall_s": round(state["wall"], 1), "final": final, **({"weights": weights} if ema is not None else {})}
        if val:
            row.update(validate(net, target, val, keep, t2d_index, cfg))
        if eval_prompts:
            taus = __import__("graft_lab.train.evaluate", fromlist=["measure"]).measure(
                target, net, eval_prompts, cfg.eval_trees, cfg.eval_new_tokens, eos_ids)
            row.update({f"tau_{k}": round(v["tau"], 4) for k, v in taus.items()})
        append_jsonl(out / "curve.jsonl", row)
        print(f"[curve] {json.dumps(row)}", flush=True)

    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.max_tokens, initial=state["tokens"], unit="tok", unit_scale=True, dynamic_ncols=True,
                   mininterval=5)
    stream = prefetch(batches(
        ((i, ids, m) for i, ids, m in sequences(state["consumed"]) if int(m[2:].sum()) >= cfg.min_labels),
        cfg.batch_sequences, target.device), target, keep, cfg.prefetch)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state["step"])
    first_step = state["step"]
    t_start = time.perf_counter()
    t_last = t_log = t_start
    tok_log = state["tokens"]
    window = [[0.0, 0, 0, 0, 0] for _ in range(cfg.ttt_steps)]
    exhausted = False
    while progress(cfg, state["tokens"], state["wall"]) < 1.0 and not exhausted:
        step_tokens = step_labels = 0
        opt.zero_grad(set_to_none=True)
        while step_labels < cfg.labels_per_step:
            try:
                batch = next(stream)
            except StopIteration:
                exhausted = True
                break
            state["consumed"] = batch.last + 1
            f = batch.features
            loss, stats = ttt_loss(net, batch.ids, batch.mask, f.aux, f.embeds, f.draft_logits, t2d_index,
                                   cfg.ttt_steps, cfg.labels, cfg.decay, cfg.autocast, cfg.anchor_frac, gen)
            (loss / cfg.labels_per_step).backward()
            step_tokens += batch.tokens
            step_labels += stats[0][3]
            for a, s in zip(window, stats):
                for i in range(5):
                    a[i] += s[i]
        if step_labels == 0:
            break
        lr = lr_at(cfg, state["tokens"], state["wall"])
        for g in opt.param_groups:
            g["lr"] = lr
        gnorm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.clip))
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for k, p in params.items():
                    ema[k].lerp_(p.detach().float(), 1.0 - cfg.ema)
        state["step"] += 1
        state["tokens"] += step_tokens
        state["label_tokens"] += step_labels
        now = time.perf_counter()
        state["wall"] += now - t_last
        t_last = now
        if bar is not None:
            bar.update(step_tokens)
        if state["step"] % cfg.log_every == 0:
            tps = (state["tokens"] - tok_log) / max(now - t_log, 1e-9)
            row = {"step": state["step"], "tokens": state["tokens"], "lr": lr, "gnorm": round(gnorm, 3),
                   "loss": [round(a[0] / max(a[3], 1), 3) for a in window],
                   "acc": [round(a[1] / max(a[3], 1), 3) for a in window], "tok_s": round(tps, 1),
                   "wall_s": round(state["wall"], 1)}
            append_jsonl(out / "log.jsonl", row)
            if bar is not None:
                bar.set_postfix_str(f"loss {row['loss'][0]:.2f}/{row['loss'][-1]:.2f} acc "
                                    + ",".join(f"{a:.2f}" for a in row["acc"]) + f" {tps:.0f} tok/s")
            else:
                print(f"[train] {json.dumps(row)}", flush=True)
            window = [[0.0, 0, 0, 0, 0] for _ in range(cfg.ttt_steps)]
            t_log, tok_log = now, state["tokens"]
        if cfg.eval_every_tokens and state["tokens"] >= state["next_eval"]:
            state["next_eval"] += cfg.eval_every_tokens
            curve_point()
            t_last = t_log = time.perf_counter()  # evaluation time is not training time
            tok_log = state["tokens"]
        if state["step"] % cfg.ckpt_every == 0:
            checkpoint()
    stream.close()  # stops the prefetch thread before the final evaluation
    checkpoint()
    if bar is not None:
        bar.close()
    finished_now = state["step"] > first_step  # resuming a finished run adds no second final point
    finished = finished_now and (progress(cfg, state["tokens"], state["wall"]) >= 1.0 or exhausted)
    if finished:
        curve_point(final=True)
        checkpoint()
    if ema is not None:  # the run's result is the moving average; the checkpoint keeps the raw weights to resume
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(ema[k])
        if finished:
            curve_point(final=True, weights="ema")
    return net


def export(net: Eagle3Model, out_dir, target: Target, dtype=torch.bfloat16) -> Path:
    """Write the official format; records the aux layers (SpecForge numbering: decoder-layer outputs)."""
    aux = [i - 1 for i in target.aux_layers]
    return save_eagle3(net, out_dir, dtype=dtype, extra_config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": aux}})
