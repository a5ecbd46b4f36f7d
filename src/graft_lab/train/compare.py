"""Paired A/B of two drafters from their `evaluate --out` files, prompt by prompt:

    python -m graft_lab.train.compare runs/eval/base.json runs/eval/new.json [--trees dense]

For each tree both files measured: each run's tau, and the mean over prompts of (tau_new - tau_base) per prompt with
its standard error (the "paired" figure of the model card), how many prompts got better and worse, and the same per
category. Two runs pair only if they measured the same prompts in the same order (the same `categories`, counts).

A run of the shipping rule's prompts (`evaluate --questions 80 --turns 2 --spec-bench ... --per-category 10`) also
gets the rule's parts, pooled over categories: "mt first turns" (Spec-Bench's eight MT-Bench categories are
MT-Bench's first turns, as is category "mt_bench"), "mt both turns" (with "mt_bench_turn2": all 160 turns of 80
questions) and "spec-bench" (every prompt but the second turns).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .data import MT_BENCH_CATEGORIES, MT_BENCH_FIRST as FIRST, MT_BENCH_SECOND as SECOND


@dataclass(frozen=True)
class Paired:
    base: float  # tau of each run: tokens / verifications over all prompts
    new: float
    mean: float  # mean over prompts of the per-prompt tau difference (new - base)
    se: float  # its standard error (sample standard deviation / sqrt(n)); 0 for one prompt
    better: int
    worse: int
    n: int

    def line(self, label: str) -> str:
        return (f"{label:<16} n={self.n:<4} base {self.base:.3f}  new {self.new:.3f}  "
                f"paired {self.mean:+.3f} +- {self.se:.3f}  ({self.better} better, {self.worse} worse)")


def paired(base: list[list[int]], new: list[list[int]]) -> Paired:
    """`base`, `new`: [tokens, verifications] per prompt, the same prompts in the same order."""
    if len(base) != len(new) or not base:
        raise ValueError(f"cannot pair {len(base)} prompts with {len(new)}")
    d = [t1 / max(s1, 1) - t0 / max(s0, 1) for (t0, s0), (t1, s1) in zip(base, new)]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else 0.0

    def tau(rows):
        return sum(t for t, _ in rows) / max(sum(s for _, s in rows), 1)
    return Paired(tau(base), tau(new), mean, se, sum(x > 0 for x in d), sum(x < 0 for x in d), n)


def parts(categories: list[str]) -> dict[str, list[int]]:
    """The shipping rule's pooled parts that `categories` hold, each as prompt indices: the MT-Bench first turns
    (category "mt_bench", or else Spec-Bench's prompts in MT-Bench's own categories), when there is more than
    them; all MT-Bench turns, when there are second turns too; and Spec-Bench (all but the second turns), when it
    is there beside the second turns. A part equal to a category row or to "all" is left out."""
    first = [i for i, c in enumerate(categories) if c == FIRST]  # MT-Bench's own first turns, else Spec-Bench's
    first = first or [i for i, c in enumerate(categories) if c in MT_BENCH_CATEGORIES]
    second = [i for i, c in enumerate(categories) if c == SECOND]
    spec = [i for i, c in enumerate(categories) if c != SECOND and c != FIRST]
    out = {}
    if first and len(first) < len(categories) and len({categories[i] for i in first}) > 1:
        out["mt first turns"] = first
    if first and second:
        turns = sorted(first + second)
        if len(turns) < len(categories):
            out["mt both turns"] = turns
    if second and spec:  # every category but evaluate's two MT-Bench ones is Spec-Bench's
        out["spec-bench"] = spec
    return out


def compare(base: dict, new: dict, trees: list[str] | None = None) -> dict[str, dict[str, Paired]]:
    """tree -> {"all": Paired, pooled part: Paired, ..., category: Paired, ...} for two `evaluate --out` results
    (the pooled parts: `parts`)."""
    for res, name in ((base, "base"), (new, "new")):
        if "categories" not in res:
            raise ValueError(f"the {name} file has no per-prompt figures: rerun evaluate --out with this version")
    if base["categories"] != new["categories"]:
        raise ValueError(f"the two runs measured different prompts ({len(base['categories'])} and "
                         f"{len(new['categories'])}, or other categories): pair runs of one evaluate command")
    common = [t for t in ("dense", "chain", "wide") if t in base and t in new]  # wide: evaluate --forced
    trees = trees or common
    missing = [t for t in trees if t not in common]
    if missing:
        raise ValueError(f"trees {missing} are not in both files; both have: {', '.join(common) or 'none'}")
    cats = base["categories"]
    out = {}
    for tree in trees:
        b, n = base[tree]["per_prompt"], new[tree]["per_prompt"]
        rows = {"all": paired(b, n)}
        for label, idx in parts(cats).items():
            rows[label] = paired([b[i] for i in idx], [n[i] for i in idx])
        for c in dict.fromkeys(cats) if len(set(cats)) > 1 else ():  # one category: "all" says it
            idx = [i for i, ci in enumerate(cats) if ci == c]
            rows[c] = paired([b[i] for i in idx], [n[i] for i in idx])
        out[tree] = rows
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path, help="evaluate --out JSON of the reference drafter")
    ap.add_argument("new", type=Path, help="evaluate --out JSON of the drafter under test")
    ap.add_argument("--trees", help="comma-separated (default: every tree both files measured)")
    args = ap.parse_args(argv)
    try:
        base, new = (json.loads(p.read_text()) for p in (args.base, args.new))
        if base.get("dtype") != new.get("dtype") or base.get("new_tokens") != new.get("new_tokens"):
            print(f"note: dtype {base.get('dtype')} / {new.get('dtype')}, new tokens {base.get('new_tokens')} / "
                  f"{new.get('new_tokens')}: the runs differ in more than the drafter")
        table = compare(base, new, args.trees.split(",") if args.trees else None)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    print(f"base {base['drafter']}\nnew  {new['drafter']}")
    for tree, rows in table.items():
        print(f"[{tree}]")
        for label, p in rows.items():
            print("  " + p.line(label))


if __name__ == "__main__":
    main()
