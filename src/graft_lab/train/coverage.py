"""How often the token a drafter must propose lies outside its draft vocabulary: such a position can never be
accepted from the drafter, whatever it learns. Measured on what the target itself writes, and for supersets
of the vocabulary grown by training-label frequency (vocab.grow), to size a larger one:

    python -m graft_lab.train.coverage --drafter builtin:smollm2-135m-instruct-eagle3 \\
        --sizes 8192,16384,24576,32768 --mt-bench 16 --per-category 4 --new-tokens 64

Sources: the fp32 target's greedy replies to MT-Bench and Spec-Bench first turns (per category), and its
argmax at every assistant position of the held-out ShareGPT conversations (teacher-forced).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from ..drafters.eagle3_checkpoint import load_eagle3
from ..models.target import EMBEDDED, load_model
from .data import HELDOUT, heldout_end, mtbench_questions, render, sharegpt_conversations, user_prompt
from .decontaminate import SPEC_BENCH
from .vocab import count_labels, grow


def covered(wanted: dict[str, torch.Tensor], vocabs: dict[int, torch.Tensor], vocab_size: int) -> dict[str, dict]:
    """{source: {"tokens": n, size: share of `wanted` ids inside the vocab of that size}}."""
    rows = {}
    for source, ids in wanted.items():
        row = {"tokens": ids.numel()}
        for size, keep in vocabs.items():
            inside = torch.zeros(vocab_size, dtype=torch.bool)
            inside[keep] = True
            row[size] = round(float(inside[ids].float().mean()), 4) if ids.numel() else None
        rows[source] = row
    return rows


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The target's greedy reply ids [<= new_tokens] to prompt ids [T]."""
    p = prompt[None]
    return model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens, do_sample=False)[0, p.shape[1]:]


@torch.no_grad()
def teacher_forced(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The target's argmax at the positions that predict an assistant token: ids [T], mask [T] -> [n]."""
    return model(ids[None]).logits[0, :-1].argmax(-1)[mask[1:]]


def wanted_tokens(model, tokenizer, mt_bench: int, per_category: int, new_tokens: int, max_len: int = 768,
                  spec_bench=SPEC_BENCH) -> dict[str, torch.Tensor]:
    from ..data.base import read_question_jsonl

    out = {}
    if mt_bench:
        out["mt_bench"] = torch.cat([greedy(model, user_prompt(tokenizer, q["turns"][0]), new_tokens)
                                     for q in mtbench_questions()[:mt_bench]])
    if per_category and spec_bench.is_file():
        by_cat: dict[str, list] = {}
        for q in read_question_jsonl(spec_bench):
            if len(by_cat.setdefault(q.category, [])) < per_category:
                by_cat[q.category].append(greedy(model, user_prompt(tokenizer, q.turns[0]), new_tokens))
        out.update({f"spec_bench/{c}": torch.cat(v) for c, v in by_cat.items()})
    held = [render(tokenizer, msgs, max_len) for _, msgs in itertools.islice(sharegpt_conversations(), HELDOUT)]
    out["sharegpt_heldout"] = torch.cat([teacher_forced(model, ids, mask) for ids, mask in held])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", default="builtin:smollm2-135m-instruct-eagle3")
    ap.add_argument("--target", default=EMBEDDED)
    ap.add_argument("--sizes", default="8192,16384,24576,32768", help="vocab sizes: the drafter's, grown to each")
    ap.add_argument("--label-sequences", type=int, default=2000, help="training conversations whose labels rank the "
                                                                      "added tokens (after the held-out ones)")
    ap.add_argument("--mt-bench", type=int, default=16, help="MT-Bench first turns")
    ap.add_argument("--per-category", type=int, default=4, help="Spec-Bench first turns per category (0: none)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", help="also write the table as JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.target, dtype="float32")
    net, _ = load_eagle3(args.drafter)
    keep = net.t2d.nonzero().flatten()
    labels = ((ids[1:], mask[1:]) for _, msgs in itertools.islice(sharegpt_conversations(skip=heldout_end(HELDOUT)),
                                                                   args.label_sequences)
              for ids, mask in [render(tok, msgs, 768)])
    counts = count_labels(labels, model.config.vocab_size)
    sizes = sorted({keep.numel(), *(int(s) for s in args.sizes.split(",") if int(s) >= keep.numel())})
    vocabs = {n: grow(keep, counts, n) for n in sizes}
    rows = {"training_labels": {"tokens": int(counts.sum()),
                                **{n: round(float(counts[k].sum() / counts.sum()), 4) for n, k in vocabs.items()}}}
    rows.update(covered(wanted_tokens(model, tok, args.mt_bench, args.per_category, args.new_tokens), vocabs,
                        model.config.vocab_size))
    print(f"{'source':32s} {'tokens':>7s} " + " ".join(f"{n:>7d}" for n in sizes))
    for source, row in rows.items():
        print(f"{source:32s} {row['tokens']:7d} " + " ".join(f"{row[n]:7.3f}" for n in sizes))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
