"""Self-prompts: user turns the target writes itself, a prompt source with no end (Magpie; Xu et al. 2024).

The chat template up to the user's header (the system prompt, then `<|im_start|>user\\n` for SmolLM2) is what the
target has read before every user turn it was tuned on, so sampling from it gives user requests in the target's
own distribution; `regenerate --prompts FILE` then adds the target's replies to them:

    python -m graft_lab.train.selfprompt --out runs/regen/self.jsonl --prompts 4096 --seed 0 --threads 2
    python -m graft_lab.train.regenerate --prompts runs/regen/self.jsonl --out runs/regen/self_greedy.jsonl \\
        --max-prompt-tokens 512 --threads 2
    python -m graft_lab.train.bundle pack runs/regen/self_greedy.jsonl --inline --out data/regen/self_greedy.jsonl.gz

A sampled turn is kept when it ends with an end of turn within --max-new-tokens, has MIN_WORDS to MAX_WORDS words,
repeats no turn already in the file (normalised text) and overlaps no evaluation prompt (`decontaminate`). The
output is a question.jsonl file (category "self"), appended to in whole batches; batch k draws from the seed
(seed, k), and a rerun resumes after the last batch written, so one run of N prompts and two runs that reach N
write the same file. Sampling numerics differ by CPU and dtype, so another machine draws other turns from the same
seed: a bundle of replies to self-prompts carries their text (`bundle pack --inline`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError
from ..models.target import EMBEDDED, load_model
from ..preflight import resolve_device
from .decontaminate import EvalIndex, build_index, normalise
from .regenerate import record_run

MIN_WORDS, MAX_WORDS = 4, 200
CATEGORY = "self"
_MARK = "\x00turn\x00"


def user_header(tokenizer) -> str:
    """The chat template's text before a first user turn's content (system prompt and user header)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    return text[: text.index(_MARK)]


@torch.no_grad()
def sample_turns(model, tokenizer, n: int, max_new_tokens: int, temperature: float, seed: int) -> list[str | None]:
    """`n` user turns sampled from the user header at `temperature` (no top-k or top-p cut) with the seed `seed`:
    each turn's text, or None for one that did not end with an end of turn within `max_new_tokens`."""
    enc = tokenizer([user_header(tokenizer)] * n, return_tensors="pt", add_special_tokens=False).to(model.device)
    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                         max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)
    turns = []
    for row in out[:, enc.input_ids.shape[1]:].tolist():  # [n, <= max_new_tokens]
        turns.append(tokenizer.decode(row[: row.index(eos)], skip_special_tokens=True).strip() if eos in row else None)
    return turns


@dataclass
class Screen:
    """Which sampled turns a file keeps: finished, of MIN_WORDS to MAX_WORDS words, new, and no evaluation prompt."""

    index: EvalIndex
    seen: set[str] = field(default_factory=set)  # normalised turns kept so far
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("unfinished", "length", "repeat",
                                                                            "evaluation"), 0))

    def why_not(self, turn: str | None) -> str | None:
        """None when `turn` is kept (and remembered), else the reason it is dropped."""
        if turn is None:
            return "unfinished"
        if not MIN_WORDS <= len(turn.split()) <= MAX_WORDS:
            return "length"
        norm = normalise(turn)
        if norm in self.seen:
            return "repeat"
        if self.index.match(turn) is not None:
            return "evaluation"
        self.seen.add(norm)
        return None

    def keep(self, turn: str | None) -> bool:
        reason = self.why_not(turn)
        if reason is not None:
            self.dropped[reason] += 1
        return reason is None


def existing(path: Path) -> tuple[list[dict], int]:
    """(rows, next batch to draw) of a self-prompt file, up to the first line an interruption cut."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                row["draw"], row["turns"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                break
            rows.append(row)
    return rows, (rows[-1]["draw"] + 1 if rows else 0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="question.jsonl file to append to (resumes after its last batch)")
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=0, help="stop when the file holds this many turns (0: --minutes)")
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: --prompts)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="sampling temperature (chosen by eye on SmolLM2: at 1.0 a third of its turns ramble)")
    ap.add_argument("--seed", type=int, default=0, help="batch k draws with the seed (seed, k)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=160, help="a turn that does not end by then is dropped")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda where there is one, else cpu), cpu, cuda or cuda:N")
    args = ap.parse_args(argv)
    if args.prompts < 0 or args.minutes < 0 or not (args.prompts or args.minutes):
        ap.error("give --prompts N or --minutes M (or both), each above 0")
    if args.temperature <= 0:
        ap.error("--temperature must be above 0: greedy decoding draws one turn")
    if args.batch < 1 or args.max_new_tokens < 1:
        ap.error("--batch and --max-new-tokens must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
    except ConfigError as exc:
        ap.error(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, draw = existing(out)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")  # drop a cut line
    model, tok = load_model(args.target, dtype=args.dtype, device=args.device)
    record_run(out, args, len(rows))
    screen = Screen(build_index(), {normalise(r["turns"][0]) for r in rows})
    from tqdm import tqdm

    bar = tqdm(total=args.prompts or None, initial=len(rows), unit="prompt", dynamic_ncols=True, mininterval=5)
    t0, start, drawn = time.time(), len(rows), 0
    while not (args.prompts and len(rows) >= args.prompts) and not (args.minutes and time.time() - t0 > 60 * args.minutes):
        turns = sample_turns(model, tok, args.batch, args.max_new_tokens, args.temperature, args.seed * 1_000_003 + draw)
        kept = [{"question_id": len(rows) + i, "category": CATEGORY, "turns": [t], "draw": draw}
                for i, t in enumerate(t for t in turns if screen.keep(t))]
        with open(out, "a", encoding="utf-8") as f:  # a whole batch at a time: the last draw is a resume point
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        rows += kept
        draw, drawn = draw + 1, drawn + len(turns)
        bar.update(len(kept))
        bar.set_postfix_str(f"kept {len(rows) - start}/{drawn}")
    bar.close()
    why = ", ".join(f"{n} {k}" for k, n in screen.dropped.items() if n)
    print(f"[selfprompt] {len(rows) - start} new prompts of {drawn} drawn ({why or 'none'} dropped), "
          f"{len(rows)} in the file, {time.time() - t0:.0f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
