"""What a training run reads: the held-out sequences, the training sequences from a stream position, and the
MT-Bench prompts of the tau curve. Built from the sources here (ShareGPT and `regenerate` files, screened against
the evaluation prompts), or read from a pack: the same stream rendered, screened and written into one file, so a
machine without the data wheels or Spec-Bench (a lent GPU: `graft_lab.train.kit`) trains on exactly these tokens.

    python -m graft_lab.train --config C --data A.jsonl --data B.jsonl --epochs 3 --pack runs/s.pack.npz  # write
    python -m graft_lab.train --data runs/s.pack.npz ...                                                   # read
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .data import interleave, mtbench_prompts, regenerated_source, render, sharegpt_conversations, sharegpt_source
from .kit import sha256

PACK_SUFFIX = ".pack.npz"
PACK_FORMAT = 1
# the flags that decide what the stream holds: a pack records them, and a run that reads it must give the same
STREAM_FLAGS = ("max_len", "val_sequences", "epochs", "sharegpt_skip", "eval_questions")

Sequences = Callable[[int], Iterator[tuple[int, torch.Tensor, torch.Tensor]]]  # skip -> (position, ids [T], mask [T])


@dataclass
class TrainStream:
    val: list[tuple[torch.Tensor, torch.Tensor]]  # held-out (ids [T], mask [T])
    sequences: Sequences
    prompts: list[torch.Tensor]  # MT-Bench first turns, prompt ids [T]
    meta: dict


def is_pack(data: list[str]) -> bool:
    packs = [d for d in data if d.endswith(PACK_SUFFIX)]
    if packs and len(data) > 1:
        raise SystemExit(f"--data {packs[0]} is a pack, the whole stream: give it alone, not beside {len(data) - 1} "
                         "other source(s)")
    return bool(packs)


def tokenizer_hash(tok) -> str:
    vocab = sorted(tok.get_vocab().items())
    return hashlib.sha256(json.dumps([vocab, tok.chat_template or ""]).encode()).hexdigest()[:16]


def build_stream(tok, data: list[str], *, epochs: int, max_len: int, val_sequences: int, sharegpt_skip: int,
                 eval_questions: int, screen) -> TrainStream:
    """The stream of `python -m graft_lab.train --data ...`: ShareGPT's first `val_sequences` usable conversations
    held out, then the sources interleaved one item each in turn (`data.interleave`)."""
    val = [render(tok, msgs, max_len) for _, msgs in itertools.islice(sharegpt_conversations(), val_sequences)]
    sources = [sharegpt_source(val_sequences + sharegpt_skip, screen=screen) if d == "sharegpt"
               else regenerated_source(Path(d), epochs, screen) for d in data]

    def sequences(skip: int):
        for pos, msgs, complete in interleave(sources, skip):
            yield (pos, *render(tok, msgs, max_len, complete))
    prompts = mtbench_prompts(tok, eval_questions) if eval_questions else []
    meta = {"max_len": max_len, "val_sequences": val_sequences, "epochs": epochs, "sharegpt_skip": sharegpt_skip,
            "eval_questions": eval_questions, "tokenizer": tokenizer_hash(tok),
            "data": [d if d == "sharegpt" else {"path": d, "sha256": sha256(Path(d))} for d in data]}
    return TrainStream(val, sequences, prompts, meta)


def write_pack(stream: TrainStream, path: Path, progress: bool = True) -> dict:
    """Every sequence of `stream` (each distinct one stored once: epochs repeat them) into one compressed file."""
    table: dict[bytes, int] = {}
    tokens, labels, lengths = [], [], []

    def index(ids: torch.Tensor, mask: torch.Tensor) -> int:
        key = hashlib.blake2b(ids.numpy().tobytes() + mask.numpy().tobytes(), digest_size=16).digest()
        if key not in table:
            table[key] = len(lengths)
            tokens.append(ids.numpy().astype(np.uint32))
            labels.append(mask.numpy())
            lengths.append(len(ids))
        return table[key]

    val = [index(ids, mask) for ids, mask in stream.val]
    pos, seq = [], []
    items = stream.sequences(0)
    if progress:
        from tqdm import tqdm

        items = tqdm(items, desc="pack", unit="seq", mininterval=5)
    for p, ids, mask in items:
        pos.append(p)
        seq.append(index(ids, mask))
    flat = np.concatenate(tokens) if tokens else np.zeros(0, np.uint32)
    dtype = np.uint16 if flat.size == 0 or int(flat.max()) < 1 << 16 else np.uint32
    prompt_lens = [len(p) for p in stream.prompts]
    meta = {**stream.meta, "format": PACK_FORMAT, "sequences": len(pos), "distinct": len(lengths),
            "tokens": int(sum(lengths[i] for i in seq)), "distinct_tokens": int(flat.size)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, tokens=flat.astype(dtype), labels=np.packbits(np.concatenate(labels) if labels else []),
                        starts=np.cumsum([0] + lengths, dtype=np.int64), pos=np.asarray(pos, np.int64),
                        seq=np.asarray(seq, np.int32), val=np.asarray(val, np.int32),
                        prompts=np.concatenate([p.numpy() for p in stream.prompts]).astype(np.int64) if prompt_lens
                        else np.zeros(0, np.int64), prompt_starts=np.cumsum([0] + prompt_lens, dtype=np.int64),
                        meta=np.asarray(json.dumps(meta)))
    tmp.replace(path)
    return meta


def read_pack(path: Path, tok, flags: dict) -> TrainStream:
    """A pack's stream; `flags` (STREAM_FLAGS of the reading run) must equal the ones it was built with, and the
    tokenizer must be the one that rendered it."""
    if not path.is_file():
        raise SystemExit(f"--data {path}: no such pack (write one with python -m graft_lab.train ... --pack FILE)")
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    if meta.get("format") != PACK_FORMAT:
        raise SystemExit(f"--data {path}: pack format {meta.get('format')}, this code reads {PACK_FORMAT}")
    differ = [f"--{k.replace('_', '-')} {flags[k]} (the pack's: {meta[k]})" for k in STREAM_FLAGS if flags[k] != meta[k]]
    if differ:
        raise SystemExit(f"--data {path} was packed with other stream flags: " + ", ".join(differ))
    if tokenizer_hash(tok) != meta["tokenizer"]:
        raise SystemExit(f"--data {path} was rendered by another tokenizer than this target's")
    tokens = torch.from_numpy(z["tokens"].astype(np.int64))
    starts = z["starts"].tolist()
    labels = torch.from_numpy(np.unpackbits(z["labels"], count=starts[-1]).astype(bool))
    pos, seq = z["pos"].tolist(), z["seq"].tolist()

    def one(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tokens[starts[i]:starts[i + 1]].clone(), labels[starts[i]:starts[i + 1]].clone()

    def sequences(skip: int):
        for k in range(int(np.searchsorted(pos, skip)), len(pos)):
            yield (pos[k], *one(seq[k]))
    ps = z["prompt_starts"].tolist()
    prompts = [torch.from_numpy(z["prompts"][a:b].copy()) for a, b in zip(ps, ps[1:])]
    return TrainStream([one(i) for i in z["val"].tolist()], sequences, prompts, meta)
