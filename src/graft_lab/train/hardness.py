"""How well a drafter already predicts each training reply, and a training stream of the replies it predicts worst
(or a random control of the same size):

    python -m graft_lab.train.hardness score --drafter builtin:smollm2-135m-instruct-eagle3 \
        --data runs/regen/a.jsonl --data runs/regen/b.jsonl --out runs/hard/scores.jsonl
    python -m graft_lab.train.hardness select --scores runs/hard/scores.jsonl --pick hardest --max-tokens 375000 \
        --out runs/hard/hardest.jsonl

`score` renders every reply as the trainer does, runs the drafter's TTT steps on the target's features (teacher
forced, no gradient) and appends, per reply, the top-1 agreement with the target's full-vocabulary argmax at each
step (what greedy acceptance needs). It resumes after the last reply it wrote. `select` keeps whole replies, lowest
mean agreement first (`hardest`) or in a seeded random order (`random`), until `--max-tokens` sequence tokens
(`--stratify`: within each source file, up to its share of the pool's tokens), and writes them shuffled, in the
`regenerate` format, so `python -m graft_lab.train --data` reads them."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from ..models.target import EMBEDDED, Target, load_model
from .data import regenerated_conversations, render
from .decontaminate import build_index
from .features import target_features
from .loop import build_drafter, read_init
from .ttt import ttt_loss
from .widen import mlp_width

PICKS = ("hardest", "easiest", "random")


def agreement(row: dict) -> float:
    """A reply's mean top-1 agreement over the TTT steps (each step weighs the same): lower is harder."""
    return sum(row["agree"]) / len(row["agree"])


def mean_agreement(rows: list[dict]) -> float:
    return sum(map(agreement, rows)) / len(rows)


def scored(path: Path) -> list[str]:
    """The whole lines of a scores file, up to a cut last line (that reply is scored again)."""
    good = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                row["file"], row["line"]
            except (json.JSONDecodeError, KeyError, TypeError):
                break
            good.append(line)
    return good


@torch.no_grad()
def score_reply(net, target: Target, keep: torch.Tensor, t2d_index: torch.Tensor, ids: torch.Tensor,
                mask: torch.Tensor, steps: int, autocast: bool) -> dict | None:
    """{"tokens", "labels", "agree": [per step], "loss": [per step, soft cross-entropy]} of one rendered reply
    (ids, mask: [T]), or None when it has no label at step 0."""
    f = target_features(target, ids, keep, full=True)
    _, stats = ttt_loss(net, ids, mask, f.aux, f.embeds, f.draft_logits, t2d_index, steps, "soft", 1.0, autocast,
                        top_in_vocab=f.top_in_vocab)
    if not stats or stats[0][3] == 0:
        return None
    return {"tokens": int(ids.numel()), "labels": stats[0][3],
            "agree": [round(s[4] / max(s[3], 1), 4) for s in stats],
            "loss": [round(s[0] / max(s[3], 1), 4) for s in stats]}


def score(args) -> None:
    from tqdm import tqdm

    for d in args.data:
        if not Path(d).is_file():
            raise SystemExit(f"--data: {d} is not a file (write one with python -m graft_lab.train.regenerate)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.target, dtype=args.target_dtype)
    target = Target(model, tok)
    try:
        init = read_init(args.drafter)
    except FileNotFoundError as exc:
        raise SystemExit(f"--drafter: {exc}") from None
    keep = init["vocab"]["keep"]
    net = build_drafter(target, keep, "random", 0, mlp_width(init["model"]))
    net.load_state_dict(init["model"])
    net.eval()
    t2d_index = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d_index[keep] = torch.arange(keep.numel())
    screen = build_index()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    good = scored(out)
    if out.is_file():
        out.write_text("".join(line + "\n" for line in good))  # drops a cut last line
    done = {(r["file"], r["line"]) for r in map(json.loads, good)}
    rows = [(d, pos, msgs, complete) for d in args.data
            for pos, msgs, complete in regenerated_conversations(Path(d)) if (d, pos) not in done]
    counts = {"scored": 0, "evaluation": 0, "no labels": 0}
    with open(out, "a") as f:
        for d, pos, msgs, complete in tqdm(rows, unit="reply", dynamic_ncols=True, mininterval=5):
            if screen.conversation(msgs):  # the trainer drops it too
                counts["evaluation"] += 1
                continue
            ids, mask = render(tok, msgs, args.max_len, complete)
            row = score_reply(net, target, keep, t2d_index, ids, mask, args.ttt_steps, args.autocast)
            if row is None:
                counts["no labels"] += 1
                continue
            f.write(json.dumps({"file": d, "line": pos, **row}) + "\n")
            f.flush()
            counts["scored"] += 1
    print(f"[hardness] {counts['scored']} replies scored ({len(done)} before), {counts['evaluation']} overlap an "
          f"evaluation prompt, {counts['no labels']} have no label -> {out}", flush=True)


def _take(order: list[dict], max_tokens: float) -> list[dict]:
    chosen, total = [], 0
    for r in order:
        if total >= max_tokens:
            break
        chosen.append(r)
        total += r["tokens"]
    return chosen


def pick(rows: list[dict], how: str, max_tokens: int, seed: int, min_labels: int = 8,
         stratify: bool = False) -> list[dict]:
    """Whole replies in `how` order (hardest: lowest agreement first) until `max_tokens` sequence tokens, then
    shuffled with `seed`. Replies with fewer than `min_labels` labels are left out, as the trainer skips them.
    `stratify`: each source file gets its share of the pool's tokens, and the order applies within each file, so
    the pick changes which replies of a source are kept, not how much of each source."""
    rows = [r for r in rows if r["labels"] >= min_labels]
    rng = random.Random(seed)
    if how == "random":
        order = rows[:]
        rng.shuffle(order)
    else:
        order = sorted(rows, key=agreement, reverse=how == "easiest")
    if stratify:
        pool = sum(r["tokens"] for r in rows)
        files = sorted({r["file"] for r in rows})
        chosen = [r for f in files for r in _take([r for r in order if r["file"] == f],
                                                  max_tokens * sum(r["tokens"] for r in rows if r["file"] == f) / pool)]
    else:
        chosen = _take(order, max_tokens)
    rng.shuffle(chosen)
    return chosen


def select(args) -> None:
    path = Path(args.scores)
    if not path.is_file():
        raise SystemExit(f"--scores: {path} is not a file (write one with python -m graft_lab.train.hardness score)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    chosen = pick(rows, args.pick, args.max_tokens, args.seed, stratify=args.stratify)
    if not chosen:
        raise SystemExit(f"--scores: {path} holds no reply with at least 8 labels")
    lines = {}
    for f in {r["file"] for r in chosen}:
        if not Path(f).is_file():
            raise SystemExit(f"{path} scores replies of {f}, which is not here")
        lines[f] = Path(f).read_text().splitlines()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        for r in chosen:
            src = json.loads(lines[r["file"]][r["line"]])
            fh.write(json.dumps({**src, "source": r["file"], "line": r["line"]}) + "\n")
    per_file = {}
    for r in chosen:
        per_file[r["file"]] = per_file.get(r["file"], 0) + 1
    tokens = sum(r["tokens"] for r in chosen)
    summary = {"pick": args.pick, "stratify": args.stratify, "seed": args.seed, "replies": len(chosen), "of": len(rows), "tokens": tokens,
               "agreement": round(mean_agreement(chosen), 4), "agreement_all": round(mean_agreement(rows), 4),
               "per_file": per_file}
    out.with_name(out.name + ".meta.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"[hardness] {args.pick}: {len(chosen)} of {len(rows)} replies, {tokens} tokens, mean agreement "
          f"{summary['agreement']:.4f} (all: {summary['agreement_all']:.4f}) -> {out}", flush=True)
    for f, n in sorted(per_file.items()):
        print(f"  {n:5d}  {f}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="per-reply agreement of a drafter with the target")
    s.add_argument("--drafter", required=True, help="a training run directory or an exported drafter (builtin:NAME)")
    s.add_argument("--data", action="append", required=True, help="a regenerate JSONL; repeat for more")
    s.add_argument("--out", required=True, help="scores JSONL to append to (resumes)")
    s.add_argument("--target", default=EMBEDDED)
    s.add_argument("--target-dtype", default="bfloat16")
    s.add_argument("--max-len", type=int, default=768, help="tokens per rendered conversation, as in training")
    s.add_argument("--ttt-steps", type=int, default=5)
    s.add_argument("--autocast", type=lambda v: v.lower() in ("1", "true", "yes"), default=True)
    s.add_argument("--threads", type=int, default=0)
    c = sub.add_parser("select", help="a training stream of the hardest (or random) scored replies")
    c.add_argument("--scores", required=True)
    c.add_argument("--pick", choices=PICKS, default="hardest")
    c.add_argument("--max-tokens", type=int, required=True, help="sequence tokens to keep")
    c.add_argument("--stratify", action="store_true",
                   help="keep each source file's share of the pool's tokens; --pick orders the replies within each")
    c.add_argument("--seed", type=int, default=0, help="the random pick and the order of the stream")
    c.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if getattr(args, "max_tokens", 1) < 1:
        ap.error("--max-tokens must be at least 1")
    if getattr(args, "ttt_steps", 1) < 1:
        ap.error("--ttt-steps must be at least 1")
    score(args) if args.cmd == "score" else select(args)


if __name__ == "__main__":
    main()
