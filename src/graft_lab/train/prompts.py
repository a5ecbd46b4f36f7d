"""Training prompt sets built from offline text, written as question.jsonl for `regenerate --prompts FILE`, so the
drafter sees the target's own replies to the requests Spec-Bench asks for and ShareGPT's first turns rarely do:

    python -m graft_lab.train.prompts --out runs/regen/prompts.jsonl --sets translate,summarize,news,code

Sets (one registry; `--sets` takes any of their names):
- translate: "Translate German to English: SENTENCE", Spec-Bench's wording, for German sentences from the questions
  and answer options of OpenAI `evals`' german-exams-qa (MIT; the `evals` wheel) and from the German turns of
  ShareGPT's training conversations.
- summarize: "Summarize: PASSAGE", Spec-Bench's wording, where PASSAGE is an English prose reply of 80-350 words
  from ShareGPT's training conversations (one per conversation).
- news: "Summarize: ARTICLE" for the 335 articles of 60 words or more among the 348 Australian Broadcasting
  Corporation news articles of the Lee corpus (Lee, Pincombe and Welsh 2005), as the `gensim` wheel ships it for its
  tests (LGPL-2.1; the articles are ABC's): news, as Spec-Bench's CNN/DailyMail summarization prompts are, which
  ShareGPT's replies are not.
- code: "Write a Python function for this task: TASK" and its input/output spec, for the 3,205 distinct tasks of
  8 words or more in the two CodeI/O files that the `reasoning-gym` wheel ships (Apache-2.0; the quality-filtered
  file first), so that the target writes code, as the coding prompts of Spec-Bench and MT-Bench ask.

Only training text is read: ShareGPT after the conversations the trainer holds out. The file interleaves the sets
one prompt each in turn, so a time-limited regeneration covers all of them; `regenerate` screens every prompt
against the evaluation prompts, as for ShareGPT's.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

from ..data.base import wheel_file
from ..errors import ConfigError
from ..registry import Registry
from .data import HELDOUT, sharegpt_conversations

PROMPT_SETS: Registry[Iterator[tuple[str, str]]] = Registry("prompt set")  # name -> () -> (category, prompt)

GERMAN_EXAMS = ("evals", "evals/registry/data/german-exams-qa/samples.jsonl")
LEE_NEWS = [("gensim", "gensim/test/test_data/lee_background.cor"), ("gensim", "gensim/test/test_data/lee.cor")]
CODEIO = [("reasoning-gym", "reasoning_gym/data/codeio-hq.jsonl.gz"),
          ("reasoning-gym", "reasoning_gym/data/codeio.jsonl.gz")]
_GERMAN = frozenset("der die das und ist nicht ich sie wir ein eine einen mit für auf zu den dem von sich auch es "
                    "wird werden sind wenn wie bei oder aus nach kann".split())
_ENGLISH = frozenset("the and is are of to in that it for with this you was be on as".split())
_WORDS = re.compile(r"[^\W\d_]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ])")


def words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def is_german(text: str, min_share: float = 0.12) -> bool:
    """Enough common German function words, more than English ones: a crude test that suffices for picking
    German sentences out of mostly English text."""
    ws = words(text)
    de, en = sum(w in _GERMAN for w in ws), sum(w in _ENGLISH for w in ws)
    return bool(ws) and de / len(ws) >= min_share and de > en


def german_sentences(text: str, min_words: int = 5, max_words: int = 60) -> Iterator[str]:
    """Sentences of German prose in `text`, line by line, that begin with a capital (code blocks and table rows are
    skipped; a list item's marker is stripped)."""
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or "|" in line:
            continue
        for s in _SENTENCE_END.split(" ".join(line.split())):
            s = s.strip(" -*#")
            if s[:1].isupper() and min_words <= len(s.split()) <= max_words and is_german(s):
                yield s


def exam_sentences(path: Path) -> Iterator[str]:
    """German sentences from german-exams-qa rows: each question (without its options) and each option that is
    itself a sentence."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        user = next(m["content"] for m in json.loads(line)["input"] if m["role"] == "user")
        body = user.rsplit("\nAnswer:", 1)[0]
        question, *options = re.split(r"\n[A-H]\. ", body)
        yield from german_sentences(question.replace("\n", " "))
        for opt in options:
            yield from german_sentences(opt, min_words=6)


def _training_conversations() -> Iterator[list[dict]]:
    """ShareGPT's usable conversations after the HELDOUT the trainer holds out, in one pass over the file."""
    for _, msgs in itertools.islice(sharegpt_conversations(), HELDOUT, None):
        yield msgs


@PROMPT_SETS.register("translate")
def translate() -> Iterator[tuple[str, str]]:
    sentences = itertools.chain(exam_sentences(wheel_file(*GERMAN_EXAMS)),
                                (s for msgs in _training_conversations() for m in msgs
                                 for s in german_sentences(m["content"])))
    for s in sentences:
        yield "translation", f"Translate German to English: {s}"


def is_prose(text: str, min_words: int = 80, max_words: int = 350) -> bool:
    """English running text: no code, table or link, mostly lines that are not list items, within the word range."""
    if "```" in text or "|" in text or "http" in text or not min_words <= len(text.split()) <= max_words:
        return False
    lines = [ln for ln in text.splitlines() if ln.strip()]
    listed = sum(bool(re.match(r"\s*([-*•]|\d+[.)])\s", ln)) for ln in lines)
    ws = words(text)
    return listed <= len(lines) // 3 and sum(w in _ENGLISH for w in ws) >= 0.12 * len(ws)


@PROMPT_SETS.register("summarize")
def summarize() -> Iterator[tuple[str, str]]:
    for msgs in _training_conversations():
        passage = next((m["content"] for m in msgs[1::2] if is_prose(m["content"])), None)
        if passage is not None:
            yield "summarization", "Summarize: " + " ".join(passage.split())


def articles(path: Path, min_words: int = 60) -> Iterator[str]:
    """The Lee corpus files hold one article per line (Latin-1); short ones are left out."""
    for line in path.read_text(encoding="latin-1").splitlines():
        text = " ".join(line.split())
        if len(text.split()) >= min_words:
            yield text


@PROMPT_SETS.register("news")
def news() -> Iterator[tuple[str, str]]:
    for dist, relpath in LEE_NEWS:
        for article in articles(wheel_file(dist, relpath)):
            yield "summarization", "Summarize: " + article


def code_tasks(path: Path, min_words: int = 8) -> Iterator[tuple[str, str]]:
    """(task description, input/output spec) of a CodeI/O file: gzip, either one JSON list (the quality-filtered
    file) or JSON lines; tasks of fewer than `min_words` words are left out."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    listed = text.lstrip().startswith("[")
    rows = json.loads(text) if listed else [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    for row in rows:
        task, spec = " ".join(row["task_description"].split()), row.get("input_output_spec", "").strip()
        if len(task.split()) >= min_words:
            yield task, spec


@PROMPT_SETS.register("code")
def code() -> Iterator[tuple[str, str]]:
    for dist, relpath in CODEIO:
        for task, spec in code_tasks(wheel_file(dist, relpath)):
            yield "coding", f"Write a Python function for this task: {task}" + (f"\n\n{spec}" if spec else "")


def build(names: list[str], max_per_set: int = 0) -> Iterator[dict]:
    """question.jsonl rows: the named sets interleaved one prompt each in turn, each without repeats (ShareGPT
    holds duplicate conversations) and cut at `max_per_set`."""
    def unique(items: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        seen: set[str] = set()
        for item in items:
            if item[1] not in seen:
                seen.add(item[1])
                yield item

    sets = [itertools.islice(unique(PROMPT_SETS.entry(n).factory()), max_per_set or None) for n in names]
    for item in itertools.chain.from_iterable(itertools.zip_longest(*sets)):
        if item is not None:
            category, prompt = item
            yield {"category": category, "turns": [prompt]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="question.jsonl file to write (replaced)")
    ap.add_argument("--sets", default=",".join(PROMPT_SETS.names), help=f"comma-separated: {', '.join(PROMPT_SETS.names)}")
    ap.add_argument("--max-per-set", type=int, default=0, help="at most this many prompts from each set (0: all)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    if not names:
        ap.error("--sets names no prompt set")
    try:
        for n in names:
            PROMPT_SETS.entry(n)
    except ConfigError as exc:  # one line that lists the valid names
        ap.error(str(exc))
    if args.max_per_set < 0:
        ap.error("--max-per-set must be >= 0")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    try:
        rows = list(build(names, args.max_per_set))
    except ConfigError as exc:  # a source wheel is missing: one line that names it
        ap.error(str(exc))
    with open(out, "w", encoding="utf-8") as f:
        for qid, row in enumerate(rows):
            counts[row["category"]] = counts.get(row["category"], 0) + 1
            f.write(json.dumps({"question_id": qid, **row}, ensure_ascii=False) + "\n")
    print(f"[prompts] {sum(counts.values())} prompts ({', '.join(f'{c} {k}' for k, c in counts.items())}) -> {out}")


if __name__ == "__main__":
    main()
