"""Long-context sets from the Hugging Face hub through `datasets` (streamed: PG-19 is 11 GB):
LongBench v2 (multiple-choice questions over long documents) and PG-19 (books, "continue the text").
Offline they fail with what to use instead; contexts are cut to `max_chars` characters."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from tqdm.auto import tqdm

from ..errors import ConfigError
from ..models.target import hub_reachable
from .base import DATASETS, Question
from .sources import Selection

OFFLINE_HINT = "offline, dataset=long_context builds long prompts from packaged text"


@dataclass
class HubOptions(Selection):
    repo: str = ""
    split: str = "train"
    limit: int | None = 20
    max_chars: int = 32000  # context characters kept (about 8k tokens of English)

    def __post_init__(self):
        super().__post_init__()
        if self.max_chars < 1:
            raise ConfigError(f"dataset.max_chars must be >= 1, got {self.max_chars}")


@dataclass
class LongBenchOptions(HubOptions):
    repo: str = "THUDM/LongBench-v2"


@dataclass
class PG19Options(HubOptions):
    repo: str = "emozilla/pg19"
    split: str = "test"


def stream_rows(opts: HubOptions, n: int | None) -> Iterator[dict]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise ConfigError("this dataset needs the `datasets` package: pip install 'graft-lab[experiments]'") from None
    if not hub_reachable():
        raise ConfigError(f"dataset {opts.repo} needs the Hugging Face hub, which is unreachable; {OFFLINE_HINT}")
    try:
        rows = load_dataset(opts.repo, split=opts.split, streaming=True)
        yield from tqdm(islice(rows, n), desc=opts.repo, unit="row", total=n)
    except Exception as exc:  # datasets and the hub client raise many network and format error types
        raise ConfigError(f"could not read {opts.repo} (split {opts.split}) from the Hugging Face hub: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; {OFFLINE_HINT}") from None


@DATASETS.register("longbench", LongBenchOptions)
def longbench(opts: LongBenchOptions) -> list[Question]:
    out = []
    for r in stream_rows(opts, opts.limit if not opts.categories and not opts.per_category else None):
        choices = "\n".join(f"({c}) {r[f'choice_{c}']}" for c in "ABCD")
        turn = (f"{r['context'][: opts.max_chars]}\n\nAnswer the question about the text above.\n"
                f"Question: {r['question']}\n{choices}\nReply with the letter of the correct choice, then explain.")
        out.append(Question(r["_id"], r.get("domain", "longbench"), (turn,)))
    return opts.apply(out)


@DATASETS.register("pg19", PG19Options)
def pg19(opts: PG19Options) -> list[Question]:
    out = []
    for n, r in enumerate(stream_rows(opts, opts.limit)):
        turn = f"{r['text'][: opts.max_chars]}\n\nContinue the text above in the same style."
        out.append(Question(f"pg19-{n}", "pg19", (turn,)))
    return opts.apply(out)
