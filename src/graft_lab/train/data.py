"""Training and evaluation text: ShareGPT (streamed, the file is cut off at the end), the target's own replies,
sources interleaved for training, and MT-Bench prompts."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..data.base import wheel_file
from ..data.json_stream import stream_json_array
from ..data.sharegpt import SHAREGPT
from ..data.sources import MT_BENCH as MTBENCH

HELDOUT = 16  # usable ShareGPT conversations, the file's first, that the trainer holds out for validation

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


def sharegpt_path() -> Path:
    return wheel_file(*SHAREGPT)


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


def regenerated_conversations(path: Path, skip: int = 0, epochs: int = 1) -> Iterator[tuple[int, list[dict], bool]]:
    """(position, messages, complete) from a `graft_lab.train.regenerate` file, `epochs` times over, from
    position `skip` (position = epoch * lines + line, so a resumed run continues in the right epoch)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no regenerated conversations")
    for pos in range(skip, epochs * len(rows)):
        row = rows[pos % len(rows)]
        yield pos, row["messages"], bool(row.get("complete", True))


# items to skip -> (messages, complete), or None for an item dropped because it overlaps an evaluation prompt
# (it still counts as an item, so stream positions and resumes do not depend on what was dropped)
Source = Callable[[int], Iterator[tuple[list[dict], bool] | None]]


def _screened(items: Iterator[tuple[list[dict], bool]], screen) -> Iterator[tuple[list[dict], bool] | None]:
    for msgs, complete in items:
        yield None if screen is not None and screen.conversation(msgs) else (msgs, complete)


def sharegpt_source(skip: int, path: Path | None = None, screen=None) -> Source:
    """ShareGPT conversations after the first `skip` usable ones (the held-out ones and any an earlier stage used).
    `screen`: an `EvalIndex`; conversations that overlap an evaluation prompt are dropped."""
    def items(start: int):
        convs = itertools.islice(sharegpt_conversations(path), skip + start, None)
        return _screened(((msgs, True) for _, msgs in convs), screen)
    return items


def regenerated_source(path: Path, epochs: int, screen=None) -> Source:
    """The target's own replies from a `graft_lab.train.regenerate` file, `epochs` passes, screened as above."""
    def items(start: int):
        return _screened(((msgs, complete) for _, msgs, complete in regenerated_conversations(path, start, epochs)), screen)
    return items


def interleave(sources: list[Source], skip: int = 0) -> Iterator[tuple[int, list[dict], bool]]:
    """(position, messages, complete) taking one item from each source in turn, from position `skip`: position p
    is item p // n of source p % n, so a resumed run continues every source where it stopped. Ends with the
    first source that runs out. Dropped items (None) take their position and yield nothing."""
    n = len(sources)
    its = [src(skip // n + (j < skip % n)) for j, src in enumerate(sources)]
    end = object()
    for pos in itertools.count(skip):
        item = next(its[pos % n], end)
        if item is end:
            return
        if item is not None:
            yield pos, *item


def heldout_end(n: int, path: Path | None = None) -> int:
    """The source index just after the first `n` usable conversations: the trainer holds those out."""
    end = 0
    for count, (idx, _) in enumerate(sharegpt_conversations(path), 1):
        if count > n:
            break
        end = idx + 1
    return end


_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def render(tokenizer, messages: list[dict], max_len: int, complete: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [T] of the chat-template rendering and a bool mask [T] of assistant tokens (reply text and
    its end-of-turn token: what the model writes). Truncated to `max_len` tokens. `complete=False`: the last
    reply was cut off, so its end-of-turn token is not a label. An assistant message with `"label": False` is
    context, not a label (another model's reply before the target's, `regenerate --turn`)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_len)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    spans = [m.span(1) for m in _ASSISTANT.finditer(text)]
    labels = [m.get("label", True) for m in messages if m["role"] == "assistant"]
    if not all(labels):
        if len(labels) != len(spans):
            raise ValueError(f"{len(spans)} assistant turns in the rendering, {len(labels)} in the messages: "
                             "cannot tell which are context")
        spans = [s for s, keep in zip(spans, labels) if keep]
    mask = torch.zeros(len(ids), dtype=torch.bool)
    j = 0
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        while j < len(spans) and spans[j][1] <= a:
            j += 1
        if j < len(spans) and spans[j][0] <= a and b <= spans[j][1] and b > a:
            mask[t] = True
    if not complete and mask.any():
        last = int(mask.nonzero().max())  # the end-of-turn token, unless truncation cut it off
        if spans and enc["offset_mapping"][last][1] == spans[-1][1]:
            mask[last] = False
    return ids, mask


# MT-Bench's eight categories, ten questions each; Spec-Bench takes its MT-Bench first turns under the same names
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
# `evaluate`'s categories of MT-Bench's own first turns and of its second turns (after the target's first reply)
MT_BENCH_FIRST, MT_BENCH_SECOND = "mt_bench", "mt_bench_turn2"


def mtbench_questions() -> list[dict]:
    path = wheel_file(*MTBENCH)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def user_prompt(tokenizer, text: str) -> torch.Tensor:
    """One user turn rendered with the chat template and the assistant header: prompt ids [T]."""
    msgs = [{"role": "user", "content": text}]
    return torch.tensor(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def mtbench_prompts(tokenizer, n: int | None = None) -> list[torch.Tensor]:
    """First turns of MT-Bench as prompts."""
    return [user_prompt(tokenizer, q["turns"][0]) for q in mtbench_questions()[:n]]
