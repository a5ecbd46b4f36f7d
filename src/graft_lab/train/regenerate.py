"""Regenerate assistant replies with the target itself, so the drafter trains on the text it will see at
decoding time (the target's own continuations), not on another model's answers:

    python -m graft_lab.train.regenerate --out runs/regen.jsonl --minutes 40

Prompts are ShareGPT first user turns after the validation conversations (or from source index `--start`, for
prompts an earlier file did not reach), or the first turns of a question.jsonl file (`--prompts FILE`); any that
overlap an evaluation prompt are left out. `--turn K` takes ShareGPT's K-th user turns instead, after the
conversation's own turns and replies before it, which stay context: the trainer learns only the target's reply.
Replies are greedy, or drawn from the target's own distribution at `--temperature` (no top-k or top-p cut),
seeded per batch from `--seed` and the batch's first source index, so a second file of the same prompts at
another seed adds other replies the target could give. Batched with left padding and sorted by prompt length. Each line is {"index", "messages", "complete"}; `complete` is false
when the reply hit --max-new-tokens without an end of turn, so its last token is not an end-of-turn label.
The file is appended to and a rerun resumes after its last index. Each run adds its flags, versions and CPU to
OUT.meta.json, and `graft_lab.train.bundle` packs the replies into a small file git can carry.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers

from ..data.base import read_question_jsonl
from ..errors import ConfigError
from ..models.target import EMBEDDED, load_model
from ..preflight import resolve_device
from ..profile import cpu_isa, device_fingerprint, device_name
from .data import HELDOUT, heldout_end, sharegpt_conversations
from .decontaminate import EvalIndex, build_index


def written(path: Path) -> tuple[int, int]:
    """(replies, source index of the last one or -1) in `path`, up to the first line an interruption cut."""
    count, last = 0, -1
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                last = json.loads(line)["index"]
            except (json.JSONDecodeError, KeyError):
                break  # everything after a cut line is regenerated
            count += 1
    return count, last


def meta_path(out: Path) -> Path:
    """OUT.meta.json: one record per run that appended to OUT (flags, versions, CPU), for bundles and model cards."""
    return out.with_name(out.name + ".meta.json")


def record_run(out: Path, args: argparse.Namespace, replies_before: int) -> None:
    meta = meta_path(out)
    runs = json.loads(meta.read_text())["runs"] if meta.is_file() else []
    cpu, gpu = torch.device("cpu"), torch.device(getattr(args, "device", "cpu"))  # where the replies were generated
    runs.append({"flags": {k: v for k, v in vars(args).items() if k != "out"}, "replies_before": replies_before,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "torch": torch.__version__,
                 "transformers": transformers.__version__, "python": platform.python_version(),
                 "cpu": device_name(cpu), "cpu_isa": cpu_isa(), "cpu_fingerprint": device_fingerprint(cpu),
                 "gpu": device_name(gpu) if gpu.type == "cuda" else None})
    meta.write_text(json.dumps({"runs": runs}, indent=1) + "\n")


def question_file(path: Path, skip: int = 0) -> Iterator[tuple[int, list[dict]]]:
    """(line number, [first turn as a user message]) of a question.jsonl file (the MT-Bench / Spec-Bench schema),
    from line `skip`: any prompt set converted to that schema can be regenerated."""
    for idx, q in enumerate(read_question_jsonl(path)):
        if idx >= skip:
            yield idx, [{"role": "user", "content": q.turns[0]}]


def prompt_turns(source: Path | None, skip: int = 0, turn: int = 1) -> Iterator[tuple[int, list[dict]]]:
    """(source index, the conversation up to its `turn`-th user message) from index `skip`: ShareGPT's, or (turn 1
    only) those of a question.jsonl `source`. Conversations with fewer user turns are skipped. The replies before
    that turn are ShareGPT's, not the target's: they are context, marked `"label": False`, so the trainer does
    not learn them as the target's text (`data.render`)."""
    if turn < 1:
        raise ConfigError(f"turn {turn}: the first user turn is turn 1")
    if turn > 1 and source is not None:
        raise ConfigError(f"turn {turn} needs ShareGPT prompts: a question.jsonl has no replies to put before it")
    for idx, msgs in sharegpt_conversations(skip=skip) if source is None else question_file(source, skip):
        if len(msgs) >= 2 * turn - 1:
            yield idx, [dict(m, label=False) if m["role"] == "assistant" else m for m in msgs[: 2 * turn - 1]]


def prompts(tokenizer, skip: int, max_prompt_tokens: int, screen: EvalIndex | None = None,
            source: Path | None = None, min_prompt_tokens: int = 0,
            turn: int = 1) -> Iterator[tuple[int, list[dict], int]]:
    """(source index, the conversation up to its `turn`-th user message, prompt length) for prompts of more than
    `min_prompt_tokens` and at most `max_prompt_tokens` tokens, from index `skip`: ShareGPT's, or those of a
    question.jsonl `source`. Prompts with an empty turn, or any user turn that overlaps an evaluation prompt in
    `screen`, are left out."""
    for idx, msgs in prompt_turns(source, skip, turn):
        if not all(m["content"] for m in msgs) or (screen is not None and screen.conversation(msgs)):
            continue
        n = len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
        if min_prompt_tokens < n <= max_prompt_tokens:
            yield idx, msgs, n


@torch.no_grad()
def regenerate_batch(model, tokenizer, batch: list[list[dict]], max_new_tokens: int,
                     temperature: float = 0.0) -> list[tuple[str, bool, int]]:
    """Replies for a batch of chats, greedy (temperature 0) or sampled from softmax(logits / temperature) with
    the global torch RNG: (text, ended with an end of turn, reply tokens)."""
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    eos = tokenizer.eos_token_id
    # top_k=0 and top_p=1.0: generate's defaults (top_k 50) would cut the target's distribution
    sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
                else dict(do_sample=False))
    out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=eos, eos_token_id=eos, **sampling)
    new = out[:, enc.input_ids.shape[1]:]  # [B, <= max_new_tokens]
    replies = []
    for row in new.tolist():
        done = eos in row
        reply = row[: row.index(eos)] if done else row
        replies.append((tokenizer.decode(reply, skip_special_tokens=True), done, len(reply)))
    return replies


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSONL file to append to (resumes after its last index)")
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", default="sharegpt",
                    help="sharegpt (its first user turns), or a question.jsonl file whose first turns are the prompts")
    ap.add_argument("--heldout", type=int, default=HELDOUT, help="usable conversations the trainer holds out: skipped")
    ap.add_argument("--start", type=int, default=0,
                    help="first source index to read (ShareGPT entry or question.jsonl line), e.g. where an earlier "
                         "file stopped; a resumed file continues after its own last index")
    ap.add_argument("--turn", type=int, default=1,
                    help="reply to ShareGPT's K-th user turn, after the conversation before it (default: the first)")
    ap.add_argument("--max-prompt-tokens", type=int, default=192, help="prompt tokens, with any turns before it")
    ap.add_argument("--min-prompt-tokens", type=int, default=0,
                    help="leave out prompts of this many tokens or fewer, e.g. the ones an earlier file with "
                         "--max-prompt-tokens N already holds (--min-prompt-tokens N)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sort-window", type=int, default=8, help="batches sorted together by prompt length")
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: the whole file)")
    ap.add_argument("--max-prompts", type=int, default=0,
                    help="stop when the file holds this many replies, counting earlier runs (0: no limit)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy replies; above 0: replies sampled at this temperature, without top-k or top-p")
    ap.add_argument("--seed", type=int, default=0, help="with --temperature: seeds each batch (seed, first index)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda where there is one, else cpu), cpu, cuda or cuda:N")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.max_new_tokens < 1:
        ap.error("--batch and --max-new-tokens must be at least 1")
    if args.temperature < 0:
        ap.error("--temperature must be 0 (greedy) or above")
    if args.turn < 1:
        ap.error("--turn must be 1 (the first user turn) or above")
    if args.turn > 1 and args.prompts != "sharegpt":
        ap.error("--turn above 1 needs --prompts sharegpt: a question.jsonl has no replies to put before the turn")
    if args.start < 0:
        ap.error("--start must be a source index >= 0")
    if not 0 <= args.min_prompt_tokens < args.max_prompt_tokens:
        ap.error("--min-prompt-tokens must be >= 0 and below --max-prompt-tokens")
    source = None if args.prompts == "sharegpt" else Path(args.prompts)
    if source is not None and not source.is_file():
        ap.error(f"--prompts: {source} is neither 'sharegpt' nor a question.jsonl file")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
    except ConfigError as exc:
        ap.error(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(args.target, dtype=args.dtype, device=args.device)
    tok.padding_side = "left"
    done, last = written(out)
    record_run(out, args, done)
    skip = max(heldout_end(args.heldout) if source is None else 0, args.start, last + 1)
    stream = prompts(tok, skip, args.max_prompt_tokens, build_index(), source, args.min_prompt_tokens,
                     args.turn)
    from tqdm import tqdm

    bar = tqdm(unit="reply", dynamic_ncols=True, mininterval=5)
    t0, start, new_tokens = time.time(), done, 0
    while not (args.max_prompts and done >= args.max_prompts):
        size = args.batch * args.sort_window
        window = list(itertools.islice(stream, min(size, args.max_prompts - done) if args.max_prompts else size))
        if not window:
            break
        order = sorted(window, key=lambda r: r[2])  # similar lengths share a batch: less padding
        results = {}
        for i in range(0, len(order), args.batch):
            chunk = order[i: i + args.batch]
            if args.temperature > 0:
                torch.manual_seed(args.seed * 1_000_003 + chunk[0][0])  # resumed at a window's start: as unbroken
            replies = regenerate_batch(model, tok, [m for _, m, _ in chunk], args.max_new_tokens, args.temperature)
            for (idx, msgs, _), (text, complete, n) in zip(chunk, replies):
                results[idx] = (msgs, text, complete)
                new_tokens += n
            bar.update(len(chunk))
            bar.set_postfix_str(f"{new_tokens / (time.time() - t0):.0f} new tok/s")
        with open(out, "a") as f:  # whole windows in source order, so the last index is a resume point
            for idx in sorted(results):
                msgs, text, complete = results[idx]
                f.write(json.dumps({"index": idx, "messages": msgs + [{"role": "assistant", "content": text}],
                                    "complete": complete}) + "\n")
        done += len(window)
        if args.minutes and time.time() - t0 > 60 * args.minutes:
            break
    bar.close()
    print(f"[regenerate] {done - start} new replies ({done} in the file), {new_tokens} new tokens in {time.time() - t0:.0f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
