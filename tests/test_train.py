"""The training code on a tiny random target (< 1 minute): TTT matches inference, data streaming, the
draft vocabulary, a short run with resume, and the exported drafter decoding losslessly."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Options, build_eagle3
from graft_lab.drafters.eagle3_checkpoint import load_eagle3
from graft_lab.graft import graft_root
from graft_lab.models.cache import TreeKVCache
from graft_lab.pruners.base import NoPruner
from graft_lab.retrievers.base import NoRetriever
from graft_lab.data.json_stream import stream_json_array
from graft_lab.train.features import target_features
from graft_lab.train.loop import TrainConfig, batches, export, train
from graft_lab.train.ttt import ttt_forward, ttt_loss
from graft_lab.train.vocab import coverage, draft_vocab, grow, grow_head, maps
from graft_lab.train.widen import mlp_width, widen_mlp
from graft_lab.verify import SamplingParams
from tiny import hf_greedy, tiny_eagle3, tiny_target

ROOT = Path(__file__).resolve().parent.parent


def _inference_chain(net, aux, emb, i, steps):
    """What drafters.eagle3 computes for anchor i: step 0 over the prefix 0..i, then a chain of steps
    each attending to the cache (prefix + its ancestors)."""
    cache = TreeKVCache(1, 64)
    causal = torch.ones(i + 1, i + 1, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, i + 1, i + 1).masked_fill(~causal, torch.finfo(torch.float32).min)
    h = net(emb[None, 1 : i + 2], aux[None, : i + 1], torch.arange(i + 1)[None], mask, cache)[:, -1:]
    outs = [h[0, 0]]
    for j in range(1, steps):
        h = net(emb[None, i + j + 1 : i + j + 2], h, torch.tensor([[i + j]]), torch.zeros(1, 1, 1, cache.length + 1), cache)
        outs.append(h[0, 0])
    return outs


@torch.no_grad()
def test_ttt_matches_inference_attention():
    target = tiny_target()
    net = tiny_eagle3(target)
    torch.manual_seed(1)
    t, steps, hsz = 12, 4, target.hidden_size
    aux, emb = torch.randn(t, 3 * hsz), torch.randn(t + steps, hsz)
    n = t - 2
    outs = ttt_forward(net, aux[None, :n], emb[None, 1 : n + steps], steps)
    sel = torch.tensor([0, 3, 4, 9])
    sub = ttt_forward(net, aux[None, :n], emb[None, 1 : n + steps], steps, sel)
    for i in range(n):
        ref = _inference_chain(net, aux, emb, i, steps)
        for j in range(steps):
            torch.testing.assert_close(outs[j][0, i], ref[j], atol=1e-4, rtol=1e-4)
    for j in range(1, steps):
        torch.testing.assert_close(sub[j][0], outs[j][0, sel], atol=1e-5, rtol=1e-5)


def test_ttt_loss_masks_and_labels():
    target = tiny_target()
    net = tiny_eagle3(target)
    t = 20
    ids = torch.randint(3, 96, (t,))
    mask = torch.zeros(t, dtype=torch.bool)
    mask[10:] = True
    t2d_index = torch.arange(96)
    aux, emb, logits = torch.randn(t, 3 * 64), torch.randn(t, 64), torch.randn(t, 96)
    loss, stats = ttt_loss(net, ids, mask, aux, emb, logits, t2d_index, 3, "soft")
    assert loss.isfinite() and loss.requires_grad
    assert [s[3] for s in stats] == [10, 9, 8]  # step j predicts x_{i+j+2}: fewer labels inside the sequence
    loss_h, _ = ttt_loss(net, ids, mask, aux, emb, logits, t2d_index, 3, "hard")
    assert loss_h.isfinite()
    # agreement over the full vocabulary: a position whose target token is outside the draft vocab is a miss
    assert [s[4] for s in stats] == [s[1] for s in stats]
    for inside in (torch.ones(t, dtype=torch.bool), torch.zeros(t, dtype=torch.bool), torch.arange(t) % 2 == 0):
        _, st = ttt_loss(net, ids, mask, aux, emb, logits, t2d_index, 3, "soft", top_in_vocab=inside)
        assert [s[1] for s in st] == [s[1] for s in stats] and all(s[4] <= s[1] for s in st)
        assert [s[4] for s in st] == ([s[1] for s in stats] if inside.all() else [0, 0, 0] if not inside.any()
                                      else [s[4] for s in st])
    _, odd = ttt_loss(net, ids, mask, aux, emb, logits, t2d_index, 3, "soft", top_in_vocab=torch.arange(t) % 2 == 1)
    _, even = ttt_loss(net, ids, mask, aux, emb, logits, t2d_index, 3, "soft", top_in_vocab=torch.arange(t) % 2 == 0)
    assert [a[4] + b[4] for a, b in zip(odd, even)] == [s[1] for s in stats]  # each position counted once


def _ragged(seed=0):
    """Three sequences of different lengths and label spans (one with two spans), right-padded to a batch."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for t, spans in ((23, [(8, 23)]), (14, [(3, 7), (9, 14)]), (30, [(12, 26)])):
        ids = torch.randint(3, 96, (t,), generator=g)
        mask = torch.zeros(t, dtype=torch.bool)
        for a, b in spans:
            mask[a:b] = True
        rows.append((ids, mask))
    return rows


@pytest.mark.parametrize("anchor_frac", [1.0, 0.6])
def test_a_padded_batch_trains_as_its_sequences_one_by_one(anchor_frac):
    """The GPU path stacks right-padded sequences: the batched prefill gives each row's features, and the batched
    loss, its stats and its gradient are the sum of the per-sequence ones (each sequence's loss times its step
    weight), with the same anchors drawn for anchor_frac < 1 (the batch draws row by row)."""
    target = tiny_target()
    net = tiny_eagle3(target, draft_vocab=64).train()
    keep = net.t2d.nonzero().flatten()
    t2d_index = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d_index[keep] = torch.arange(keep.numel())
    rows = _ragged()
    batch = next(batches(((i, ids, m) for i, (ids, m) in enumerate(rows)), 3, "cpu"))
    assert batch.last == 2 and batch.tokens == 23 + 14 + 30 and batch.ids.shape == (3, 30)
    assert not batch.mask[1, 14:].any() and torch.equal(batch.ids[1, :14], rows[1][0])
    fb = target_features(target, batch.ids, keep, full=True)
    steps, weight = 4, sum(0.8**j for j in range(4))  # every sequence here has labels at every step
    loss_b, stats_b = ttt_loss(net, batch.ids, batch.mask, fb.aux, fb.embeds, fb.draft_logits, t2d_index, steps,
                               anchor_frac=anchor_frac, generator=torch.Generator().manual_seed(5),
                               top_in_vocab=fb.top_in_vocab)
    (loss_b * weight).backward()
    grad_b = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    sizes = [int(m[2:].sum()) for _, m in rows]  # one draw of them all is the draws of each in turn:
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(torch.rand(sum(sizes), generator=g1), torch.cat([torch.rand(k, generator=g2) for k in sizes]))
    gen, total, stats = torch.Generator().manual_seed(5), 0.0, [[0.0, 0, 0, 0, 0] for _ in range(steps)]
    for b, (ids, mask) in enumerate(rows):
        f = target_features(target, ids, keep, full=True)
        for name in ("aux", "draft_logits", "embeds"):
            torch.testing.assert_close(getattr(fb, name)[b, : ids.numel()], getattr(f, name), atol=1e-5, rtol=1e-5)
        assert torch.equal(fb.top_in_vocab[b, : ids.numel()], f.top_in_vocab)
        loss, st = ttt_loss(net, ids, mask, f.aux, f.embeds, f.draft_logits, t2d_index, steps,
                            anchor_frac=anchor_frac, generator=gen, top_in_vocab=f.top_in_vocab)
        total = total + loss * weight
        for acc, one in zip(stats, st):
            for i in range(5):
                acc[i] += one[i]
    total.backward()
    assert [tuple(s[1:]) for s in stats_b] == [tuple(s[1:]) for s in stats] and stats_b[0][3] == sum(sizes)
    assert (stats_b[1][3] < 0.8 * stats_b[0][3]) == (anchor_frac < 1)  # fewer anchors run steps >= 1
    torch.testing.assert_close(torch.tensor([s[0] for s in stats_b]), torch.tensor([s[0] for s in stats]))
    torch.testing.assert_close(loss_b * weight, total)
    for mine, ref in zip(grad_b, (p.grad for p in net.parameters())):
        torch.testing.assert_close(mine, ref, atol=1e-5, rtol=1e-4)


def test_batches_group_the_stream_and_keep_a_short_last_one():
    rows = _ragged()
    got = list(batches(((i, ids, m) for i, (ids, m) in enumerate(rows)), 2, "cpu"))
    assert [(g.last, tuple(g.ids.shape), g.tokens) for g in got] == [(1, (2, 23), 37), (2, (1, 30), 30)]
    assert [int(g.mask.sum()) for g in got] == [int(rows[0][1].sum() + rows[1][1].sum()), int(rows[2][1].sum())]


def test_stream_json_array_survives_truncation(tmp_path):
    items = [{"id": i, "conversations": [{"from": "human", "value": "x" * (i * 50)}]} for i in range(30)]
    text = json.dumps(items, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 40])  # cut inside the last element
    got = list(stream_json_array(path, chunk=256))
    assert [g["id"] for g in got] == list(range(29))


def test_draft_vocab_and_maps():
    counts = torch.tensor([5, 0, 9, 1, 7, 0])
    keep = draft_vocab(counts, 3, always=(1,))
    assert keep.tolist() == [1, 2, 4]
    d2t, t2d = maps(keep, 6)
    assert (torch.arange(3) + d2t).tolist() == keep.tolist()
    assert t2d.tolist() == [False, True, True, False, True, False]
    assert coverage(counts, keep) == pytest.approx(16 / 22)


def test_grow_vocab_keeps_the_trained_rows_and_maps_the_new_ones():
    counts = torch.tensor([5, 0, 9, 1, 7, 0, 3, 2])
    keep = torch.tensor([1, 4])
    assert grow(keep, counts, 4).tolist() == [0, 1, 2, 4]  # keep (1, 4), then the most frequent others (2, 0)
    for size in (1, 9):  # fewer tokens than it has, more than the target has
        with pytest.raises(ValueError, match="give a size from 2 to the target's 8"):
            grow(keep, counts, size)
    g = torch.Generator().manual_seed(0)
    head = torch.randn(8, 5, generator=g)  # the target's output rows [V, H]
    a, b = torch.randn(5, 5, generator=g), torch.randn(5, generator=g)
    keep = torch.tensor([0, 2, 3, 5, 6, 7])  # more trained rows than the map's 6 parameters per output
    state = {"lm_head.weight": head[keep] @ a + b, "fc.weight": torch.ones(1)}
    grown = grow_head(state, keep, torch.arange(8), head, ridge=1e-9)
    torch.testing.assert_close(grown["lm_head.weight"][keep], state["lm_head.weight"])  # trained rows kept as they are
    torch.testing.assert_close(grown["lm_head.weight"][[1, 4]], head[[1, 4]] @ a + b, atol=1e-4, rtol=1e-4)
    assert grown["t2d"].all() and grown["d2t"].eq(0).all() and grown["fc.weight"] is state["fc.weight"]


def test_grow_vocab_without_an_init_is_a_one_line_error():
    from graft_lab.train.__main__ import main

    with pytest.raises(SystemExit, match="give --init too"):
        main(["--grow-vocab", "16384"])


def test_coverage_is_the_share_of_wanted_tokens_inside_each_vocab():
    from graft_lab.train.coverage import covered, teacher_forced

    rows = covered({"a": torch.tensor([0, 1, 1, 5]), "b": torch.tensor([4])},
                   {2: torch.tensor([0, 1]), 3: torch.tensor([0, 1, 5])}, 6)
    assert rows == {"a": {"tokens": 4, 2: 0.75, 3: 1.0}, "b": {"tokens": 1, 2: 0.0, 3: 0.0}}
    target = tiny_target()
    ids, mask = torch.randint(3, 96, (12,)), torch.arange(12) >= 5
    want = teacher_forced(target.model, ids, mask)
    assert want.tolist() == target.model(ids[None]).logits[0, 4:11].argmax(-1).tolist()


def _sequences(seed=0, n=40, t=48):
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(n):
        ids = torch.randint(3, 96, (t,), generator=g)
        mask = torch.zeros(t, dtype=torch.bool)
        mask[t // 3 :] = True
        data.append((ids, mask))

    def sequences(skip):
        for i in range(skip, n):
            yield i, *data[i]

    return sequences, data


def test_train_resume_export_and_lossless_decode(tmp_path):
    torch.manual_seed(0)
    target = tiny_target()
    sequences, data = _sequences()
    cfg = TrainConfig(out=str(tmp_path / "run"), draft_vocab=64, vocab_sequences=20, ttt_steps=3, lr=3e-3,
                      warmup_tokens=50, labels_per_step=64, max_tokens=600, ckpt_every=2, log_every=1,
                      eval_every_tokens=0, eval_new_tokens=8, progress=False, autocast=False)
    prompts = [data[0][0][:10]]
    train(cfg, target, sequences, val=data[:2], eval_prompts=prompts, eos_ids=(2,))
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert ck["state"]["tokens"] >= 600
    curve = [json.loads(line) for line in (tmp_path / "run" / "curve.jsonl").read_text().splitlines()]
    assert curve[-1]["final"] and len(curve[-1]["val_acc"]) == 3 and curve[-1]["tau_dense"] >= 1.0
    # resume with a larger budget continues from the saved step and source position
    cfg.max_tokens = 1200
    net = train(cfg, target, sequences, val=(), eos_ids=(2,), resume=True)
    ck2 = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert ck2["state"]["step"] > ck["state"]["step"]
    assert ck2["state"]["consumed"] > ck["state"]["consumed"]
    # the exported drafter is the official format and decodes losslessly through the engine
    out = export(net, tmp_path / "drafter", target, dtype=torch.float32)
    loaded, raw = load_eagle3(str(out))
    assert loaded.draft_vocab_size == 64 and int(loaded.t2d.sum()) == 64
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    drafter = build_eagle3(Eagle3Options(path=str(out), depth=4, top_k=3), target)
    for prompt in (data[5][0][:12], data[7][0][:7]):
        gen = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, 12), prompt,
                       SamplingParams(), StopRule(max_new_tokens=24))
        assert gen.tokens == hf_greedy(target.model, prompt, 24)
    # a later stage grows the draft vocab: the drafter's scores of its old tokens are unchanged at the start
    grown = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "grown"), "init": str(tmp_path / "run"),
                           "grow_vocab": 80, "lr": 0.0, "max_tokens": 100})
    big = train(grown, target, sequences, eos_ids=(2,))
    vocab = torch.load(tmp_path / "grown" / "vocab.pt")
    small_keep = torch.load(tmp_path / "run" / "vocab.pt")["keep"]
    assert vocab["keep"].numel() == 80 and vocab["grown_from"] == 64 and torch.isin(small_keep, vocab["keep"]).all()
    h = torch.randn(3, target.hidden_size)
    old_rows = torch.searchsorted(vocab["keep"], small_keep)
    with torch.no_grad():
        torch.testing.assert_close(big.logits(h)[:, old_rows], net.logits(h))
    drafter = build_eagle3(Eagle3Options(path=str(export(big, tmp_path / "big", target, dtype=torch.float32)),
                                         depth=3, top_k=2), target)
    gen = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, 8), data[9][0][:9],
                   SamplingParams(), StopRule(max_new_tokens=16))
    assert gen.tokens == hf_greedy(target.model, data[9][0][:9], 16)



def test_batched_training_counts_real_tokens_and_resumes_where_it_stopped(tmp_path):
    """batch_sequences > 1 (the GPU setting): the token budget and the stream position count sequences, not
    padding, and a resume continues after the last batch trained."""
    target = tiny_target()
    g = torch.Generator().manual_seed(3)
    data = []
    for i in range(40):
        t = 20 + (7 * i) % 29
        ids, mask = torch.randint(3, 96, (t,), generator=g), torch.zeros(t, dtype=torch.bool)
        mask[t // 3:] = True
        data.append((ids, mask))

    def sequences(skip):
        for i in range(skip, len(data)):
            yield i, *data[i]

    cfg = TrainConfig(out=str(tmp_path / "run"), draft_vocab=64, vocab_sequences=20, ttt_steps=3, lr=3e-3,
                      warmup_tokens=50, labels_per_step=64, max_tokens=400, batch_sequences=4, ckpt_every=1,
                      log_every=1, eval_every_tokens=0, progress=False, autocast=False)
    train(cfg, target, sequences, eos_ids=(2,))
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]
    assert state["consumed"] % 4 == 0 and state["tokens"] == sum(data[i][0].numel() for i in range(state["consumed"]))
    cfg.max_tokens = 900
    train(cfg, target, sequences, eos_ids=(2,), resume=True)
    again = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]
    assert again["consumed"] > state["consumed"] and again["tokens"] == sum(
        data[i][0].numel() for i in range(again["consumed"]))
    with pytest.raises(ValueError, match="batch_sequences 0"):
        train(TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "bad"), "batch_sequences": 0}), target, sequences)


def test_widen_mlp_keeps_the_output_then_trains_the_new_units(tmp_path):
    """A later stage widens the init's MLP: the drafter computes the same at the start, the new units
    train, the export records the width and decodes losslessly, and a resume keeps the width."""
    torch.manual_seed(0)
    target = tiny_target()
    sequences, data = _sequences()
    base = dict(draft_vocab=64, vocab_sequences=20, ttt_steps=2, lr=3e-3, warmup_tokens=50, labels_per_step=64,
                ckpt_every=2, log_every=1, eval_every_tokens=0, progress=False, autocast=False)
    small = train(TrainConfig(out=str(tmp_path / "run"), max_tokens=300, **base), target, sequences, eos_ids=(2,))
    width = small.midlayer.mlp.gate_proj.weight.shape[0]
    state = {k: v.clone() for k, v in small.state_dict().items()}
    wide_state = widen_mlp(state, 3 * width, torch.Generator().manual_seed(0))
    assert mlp_width(wide_state) == 3 * width and wide_state["midlayer.mlp.up_proj.weight"][width:].abs().sum() > 0
    with pytest.raises(ValueError, match=f"give a width of at least {width}"):
        widen_mlp(state, width - 1)
    zero = TrainConfig(out=str(tmp_path / "zero"), init=str(tmp_path / "run"), mlp_width=3 * width,
                       **{**base, "lr": 0.0}, max_tokens=64)
    wide0 = train(zero, target, sequences, eos_ids=(2,))  # lr 0: the widened init, unchanged
    assert wide0.config.intermediate_size == 3 * width
    aux, emb = torch.randn(1, 5, 3 * target.hidden_size), torch.randn(1, 5, target.hidden_size)
    causal = torch.zeros(1, 1, 5, 5).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -1e9)
    with torch.no_grad():
        torch.testing.assert_close(wide0(emb, aux, torch.arange(5)[None], causal),
                                   small(emb, aux, torch.arange(5)[None], causal))
    cfg = TrainConfig(out=str(tmp_path / "wide"), init=str(tmp_path / "run"), mlp_width=3 * width,
                      max_tokens=300, **base)
    wide = train(cfg, target, sequences, eos_ids=(2,))
    assert wide.midlayer.mlp.down_proj.weight[:, width:].abs().sum() > 0  # the new units learned
    cfg.max_tokens, cfg.mlp_width = 450, 0  # a resume takes the run's own width
    wide = train(cfg, target, sequences, eos_ids=(2,), resume=True)
    assert wide.config.intermediate_size == 3 * width
    out = export(wide, tmp_path / "wide_export", target, dtype=torch.float32)
    loaded, raw = load_eagle3(str(out))
    assert raw["intermediate_size"] == 3 * width
    from graft_lab.train.__main__ import main

    with pytest.raises(SystemExit, match=f"the --init drafter's MLP has {3 * width} units; give at least"):
        main(["--init", str(out), "--mlp-width", str(width), "--out", str(tmp_path / "narrow")])
    again = train(TrainConfig(out=str(tmp_path / "again"), init=str(out), **{**base, "lr": 0.0}, max_tokens=64),
                  target, sequences, eos_ids=(2,))
    assert again.config.intermediate_size == 3 * width  # an exported wide drafter starts a stage as it is
    drafter = build_eagle3(Eagle3Options(path=str(out), depth=3, top_k=2), target)
    gen = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, 8), data[9][0][:9],
                   SamplingParams(), StopRule(max_new_tokens=16))
    assert gen.tokens == hf_greedy(target.model, data[9][0][:9], 16)

def test_regenerate_then_train_from_a_run(tmp_path):
    """Stage two of the shipped recipe on a tiny random target: the target's own replies are written
    resumably, then a run starts from another run's weights and draft vocab and trains on them."""
    from graft_lab.models.random_model import random_tokenizer
    from graft_lab.train.__main__ import main as train_main
    from graft_lab.train.data import heldout_end, regenerated_conversations, render
    from graft_lab.train.regenerate import main as regen_main

    tgt = "random:llama?seed=0&hidden=64&layers=4"
    regen = tmp_path / "regen.jsonl"
    common = ["--out", str(regen), "--target", tgt, "--dtype", "float32", "--batch", "2", "--sort-window", "2",
              "--max-new-tokens", "6", "--max-prompt-tokens", "96"]
    regen_main(common + ["--max-prompts", "4"])
    regen_main(common + ["--max-prompts", "6"])  # resumes after the last index, up to 6 in the file
    regen_main(common + ["--max-prompts", "6"])  # already there: nothing to do
    rows = [json.loads(line) for line in regen.read_text().splitlines()]
    idx = [r["index"] for r in rows]
    assert len(rows) == 6 and idx == sorted(set(idx)) and idx[0] >= heldout_end(16)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
    tok = random_tokenizer()
    pos, msgs, complete = next(regenerated_conversations(regen, skip=7, epochs=2))
    assert pos == 7 and msgs == rows[1]["messages"]
    ids, mask = render(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there"}], 64)
    cut_ids, cut_mask = render(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there"}],
                               64, complete=False)
    assert torch.equal(ids, cut_ids) and int(mask.sum()) == int(cut_mask.sum()) + 1  # no end-of-turn label

    base = ["--target", tgt, "--target-dtype", "float32", "--draft-vocab", "64", "--vocab-sequences", "4",
            "--eval-questions", "0", "--val-sequences", "2", "--max-len", "64", "--labels-per-step", "16",
            "--progress", "false", "--autocast", "false", "--eval-every-tokens", "0", "--ttt-steps", "2",
            "--max-tokens", "200", "--warmup-tokens", "10"]
    train_main(base + ["--out", str(tmp_path / "run1")])
    train_main(base + ["--out", str(tmp_path / "run2"), "--init", str(tmp_path / "run1"), "--data", str(regen),
                       "--epochs", "3", "--lr", "0"])
    one, two = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=False) for r in ("run1", "run2"))
    assert two["state"]["consumed"] > 0 and two["state"]["step"] > 0
    assert all(torch.equal(one["model"][k], two["model"][k]) for k in one["model"])  # lr 0: the init's weights
    assert torch.equal(torch.load(tmp_path / "run1" / "vocab.pt")["keep"], torch.load(tmp_path / "run2" / "vocab.pt")["keep"])
    with pytest.raises(FileNotFoundError, match="neither a training run directory .* nor an exported EAGLE-3 drafter"):
        train_main(base + ["--out", str(tmp_path / "run3"), "--init", str(tmp_path / "nothing")])
    # a later stage may start from an exported drafter (the shipped one is builtin:NAME): its bf16 weights and d2t
    train_main(base + ["--out", str(tmp_path / "run1"), "--export-only", "--export", str(tmp_path / "exp1")])
    train_main(base + ["--out", str(tmp_path / "run6"), "--init", str(tmp_path / "exp1"), "--lr", "0"])
    six = torch.load(tmp_path / "run6" / "checkpoint.pt", weights_only=False)
    assert six["state"]["step"] > 0
    assert torch.equal(torch.load(tmp_path / "run6" / "vocab.pt")["keep"], torch.load(tmp_path / "run1" / "vocab.pt")["keep"])
    for k, v in one["model"].items():
        assert torch.equal(six["model"][k], v.to(torch.bfloat16).float() if v.is_floating_point() else v), k
    # stage three: fresh ShareGPT interleaved with the own replies
    train_main(base + ["--out", str(tmp_path / "run4"), "--init", str(tmp_path / "run2"), "--data", "sharegpt",
                       "--data", str(regen), "--epochs", "5", "--sharegpt-skip", "100"])
    assert torch.load(tmp_path / "run4" / "checkpoint.pt", weights_only=False)["state"]["consumed"] >= 2
    with pytest.raises(SystemExit, match="neither 'sharegpt' nor a file"):
        train_main(base + ["--out", str(tmp_path / "run5"), "--data", str(tmp_path / "missing.jsonl")])


def test_interleave_resumes_every_source_where_it_stopped():
    from graft_lab.train.data import interleave

    def source(name, n):
        return lambda start: (([name, i], True) for i in range(start, n))

    full = [(p, msgs) for p, msgs, _ in interleave([source("a", 4), source("b", 9)])]
    assert [m for _, m in full] == [["a", 0], ["b", 0], ["a", 1], ["b", 1], ["a", 2], ["b", 2], ["a", 3], ["b", 3]]
    assert [p for p, _ in full] == list(range(8))  # stops with the first source that runs out
    for skip in range(9):
        assert [(p, m) for p, m, _ in interleave([source("a", 4), source("b", 9)], skip)] == full[skip:]


def test_evaluate_cli_reports_tau_per_category(tmp_path, capsys):
    from graft_lab.models.target import Target, load_model
    from graft_lab.train.evaluate import main as evaluate_main
    from tiny import write_eagle3

    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt)
    drafter = write_eagle3(Target(model, tok), tmp_path / "drafter")
    bench = tmp_path / "question.jsonl"
    bench.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"Question {i} about {c}?"]})
                               for i, c in enumerate(["qa", "qa", "rag", "rag"])))
    out = tmp_path / "tau.json"
    evaluate_main(["--drafter", str(drafter), "--target", tgt, "--questions", "2", "--spec-bench", str(bench),
                   "--per-category", "1", "--new-tokens", "6", "--trees", "dense,chain", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["prompts"] == 4
    for tree in ("dense", "chain"):
        assert set(res[tree]["by_category"]) == {"mt_bench", "qa", "rag"}
        assert all(v >= 1.0 for v in res[tree]["by_category"].values()) and res[tree]["tau"] >= 1.0
    assert res["categories"] == ["mt_bench"] * 2 + ["qa", "rag"]
    for tree in ("dense", "chain"):  # the per-prompt figures that compare pairs add up to the totals
        each = res[tree]["per_prompt"]
        assert len(each) == 4 and [sum(c) for c in zip(*each)] == [res[tree]["tokens"], res[tree]["steps"]]
    with pytest.raises(SystemExit):
        evaluate_main(["--drafter", str(drafter), "--target", tgt, "--trees", "bushy"])
    assert "valid: dense, chain" in capsys.readouterr().err


def test_rank_temperature_experiment_is_the_drafter_at_t1_and_pairs_with_evaluate(tmp_path, capsys):
    """experiments/rank_temperature.py at T=1 gives evaluate's dense figures prompt for prompt; another T
    changes only which branches the tree keeps, so it still runs and pairs."""
    import importlib.util

    from graft_lab.models.target import Target, load_model
    from graft_lab.train.compare import compare
    from graft_lab.train.evaluate import main as evaluate_main
    from tiny import write_eagle3

    spec = importlib.util.spec_from_file_location("rank_temperature", ROOT / "experiments" / "rank_temperature.py")
    rank = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rank)
    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt)
    drafter = write_eagle3(Target(model, tok), tmp_path / "drafter")
    common = ["--target", tgt, "--dtype", "float32", "--questions", "3", "--new-tokens", "8"]
    evaluate_main(["--drafter", str(drafter), "--trees", "dense", "--out", str(tmp_path / "ev.json")] + common)
    rank.main(["--drafter", str(drafter), "--temperatures", "1,0.2", "--out-dir", str(tmp_path / "t")] + common)
    ev, t1, t02 = (json.loads(p.read_text()) for p in (tmp_path / "ev.json", tmp_path / "t" / "t1.json",
                                                        tmp_path / "t" / "t0.2.json"))
    assert t1["dense"]["per_prompt"] == ev["dense"]["per_prompt"] and t1["categories"] == ev["categories"]
    assert compare(ev, t02)["dense"]["all"].n == 3
    d = build_eagle3(Eagle3Options(path=str(drafter), depth=2, top_k=3), Target(model, tok))
    h = torch.randn(2, d.net.config.hidden_size)
    ids, lp = rank.tempered(d, 0.5)._top_k(h, 3)  # the same children, scored by softmax(logits / 0.5)
    want = torch.log_softmax(d.net.lm_head(d.net.norm(h)).float() / 0.5, -1).topk(3, -1)
    assert torch.equal(ids, d.to_target[want.indices]) and torch.allclose(lp, want.values, atol=1e-5)
    with pytest.raises(SystemExit):
        rank.main(["--drafter", str(drafter), "--temperatures", "0", "--out-dir", str(tmp_path / "t")])
    assert "must be > 0" in capsys.readouterr().err


def test_compare_pairs_two_evaluate_runs_prompt_by_prompt(tmp_path, capsys):
    from graft_lab.train.compare import compare, main as compare_main, paired

    # per-prompt tau 2, 3, 2 against 3, 3, 1: differences +1, 0, -1
    p = paired([[2, 1], [3, 1], [4, 2]], [[3, 1], [3, 1], [2, 2]])
    assert (p.base, p.new, p.mean, p.better, p.worse, p.n) == (2.25, 2.0, 0.0, 1, 1, 3)
    assert p.se == pytest.approx((2 / 2 / 3) ** 0.5)
    p = paired([[2, 1], [2, 1]], [[3, 1], [5, 2]])  # +1 and +0.5
    assert (p.mean, p.better) == (0.75, 2) and p.se == pytest.approx(0.25)

    def run(cats, dense, chain=None):
        res = {"drafter": "d", "dtype": "bfloat16", "new_tokens": 8, "categories": cats, "dense": {"per_prompt": dense}}
        if chain:
            res["chain"] = {"per_prompt": chain}
        return res
    base = run(["a", "a", "b"], [[2, 1], [3, 1], [4, 2]], [[1, 1]] * 3)
    new = run(["a", "a", "b"], [[3, 1], [3, 1], [2, 2]])
    table = compare(base, new)
    assert list(table) == ["dense"]  # only the trees both measured
    assert table["dense"]["a"].mean == 0.5 and table["dense"]["b"].mean == -1.0 and table["dense"]["all"].n == 3
    one = compare(run(["a"] * 3, base["dense"]["per_prompt"]), run(["a"] * 3, new["dense"]["per_prompt"]))
    assert list(one["dense"]) == ["all"]  # one category: no per-category rows
    with pytest.raises(ValueError, match="not in both files"):
        compare(base, new, ["chain"])
    with pytest.raises(ValueError, match="different prompts"):
        compare(base, run(["a", "b", "b"], [[1, 1]] * 3))
    with pytest.raises(ValueError, match="no per-prompt figures"):
        compare({k: v for k, v in base.items() if k != "categories"}, new)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    compare_main([str(tmp_path / "base.json"), str(tmp_path / "new.json")])
    out = capsys.readouterr().out
    assert "paired +0.000 +- 0.577  (1 better, 1 worse)" in out and "paired -1.000" in out
    with pytest.raises(SystemExit):
        compare_main([str(tmp_path / "base.json"), str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err


def test_compare_pools_the_shipping_rules_parts_of_one_run():
    from graft_lab.train.compare import compare, parts
    from graft_lab.train.data import MT_BENCH_CATEGORIES, mtbench_questions

    assert {q["category"] for q in mtbench_questions()} == MT_BENCH_CATEGORIES  # the names Spec-Bench borrows
    # the rule's run: Spec-Bench's MT-Bench categories (= the first turns), two others, then the second turns
    cats = ["writing", "writing", "coding", "qa", "translation", "mt_bench_turn2", "mt_bench_turn2", "mt_bench_turn2"]
    assert parts(cats) == {"mt first turns": [0, 1, 2], "mt both turns": [0, 1, 2, 5, 6, 7],
                           "spec-bench": [0, 1, 2, 3, 4]}
    # MT-Bench's own first turns are their category row, and Spec-Bench's copies of them are not pooled in
    assert parts(["mt_bench", "mt_bench", "writing", "coding", "mt_bench_turn2", "mt_bench_turn2"]) == {
        "mt both turns": [0, 1, 4, 5], "spec-bench": [2, 3]}
    assert parts(["mt_bench", "mt_bench", "mt_bench_turn2"]) == {}  # each part is a category row or "all"
    assert parts(["writing", "coding"]) == {}  # the first turns are every prompt: "all" says it
    base = {"categories": cats, "dense": {"per_prompt": [[2, 1]] * 8}}
    new = {"categories": cats, "dense": {"per_prompt": [[3, 1]] * 3 + [[2, 1]] * 2 + [[1, 1]] * 3}}
    rows = compare(base, new)["dense"]
    assert list(rows)[:4] == ["all", "mt first turns", "mt both turns", "spec-bench"]
    assert (rows["mt first turns"].mean, rows["mt both turns"].mean) == (1.0, 0.0)
    assert rows["spec-bench"].mean == pytest.approx(0.6) and rows["spec-bench"].n == 5


def test_evaluate_second_turns_follow_the_targets_own_first_reply(tmp_path, capsys, monkeypatch):
    from graft_lab.models.target import Target, load_model
    from graft_lab.train.data import mtbench_questions
    from graft_lab.train.evaluate import main as evaluate_main, second_turns
    from tiny import write_eagle3

    monkeypatch.setenv("GRAFT_LAB_CACHE", str(tmp_path / "cache"))
    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt)
    cache = tmp_path / "first"
    turns = second_turns(model, tok, 2, 5, tgt, cache)
    files = sorted(cache.glob("*.json"))
    assert len(files) == 2
    assert [(c, i.tolist()) for c, i in second_turns(model, tok, 2, 5, tgt, cache)] == [
        (c, i.tolist()) for c, i in turns]  # read back: the same prompts
    for f in files:  # a cached reply is what the next run uses: mark it, and the prompt carries the mark
        f.write_text(json.dumps({**json.loads(f.read_text()), "reply": "CACHED"}))
    assert all("CACHED" in tok.decode(i) for _, i in second_turns(model, tok, 2, 5, tgt, cache))
    assert not any("CACHED" in tok.decode(i) for _, i in second_turns(model, tok, 2, 6, tgt, cache))  # own key
    assert not any("CACHED" in tok.decode(i) for _, i in second_turns(model, tok, 2, 5, "other", cache))
    assert len(list(cache.glob("*.json"))) == 6
    qs = mtbench_questions()[:2]
    for (cat, ids), q in zip(turns, qs):
        text = tok.decode(ids)
        assert cat == "mt_bench_turn2" and text.index(q["turns"][0]) < text.index(q["turns"][1])
        first = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
        reply = model.generate(torch.tensor([first]), max_new_tokens=5, do_sample=False)[0, len(first):]
        assert tok.decode(reply, skip_special_tokens=True) in text  # the target's greedy reply sits between them
    drafter = write_eagle3(Target(model, tok), tmp_path / "drafter")
    out = tmp_path / "tau.json"
    evaluate_main(["--drafter", str(drafter), "--target", tgt, "--questions", "2", "--turns", "1,2",
                   "--new-tokens", "5", "--trees", "chain", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["prompts"] == 4 and set(res["chain"]["by_category"]) == {"mt_bench", "mt_bench_turn2"}
    evaluate_main(["--drafter", str(drafter), "--target", tgt, "--questions", "2", "--turns", "2",
                   "--new-tokens", "5", "--trees", "chain", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["prompts"] == 2 and set(res["chain"]["by_category"]) == {"mt_bench_turn2"}


def test_data_sources_from_config_or_command_line(tmp_path):
    """A config may list the sources; --data on the command line replaces them (it does not append)."""
    from graft_lab.train.__main__ import parse

    cfg = tmp_path / "stage.yaml"
    cfg.write_text("data: [sharegpt, replies.jsonl]\nsharegpt_skip: 7\n")
    assert parse(["--out", "x"]).data == ["sharegpt"]
    assert parse(["--config", str(cfg), "--out", "x"]).data == ["sharegpt", "replies.jsonl"]
    args = parse(["--config", str(cfg), "--out", "x", "--data", "other.jsonl"])
    assert args.data == ["other.jsonl"] and args.sharegpt_skip == 7


def test_training_dtypes_are_chosen_by_what_they_took_here():
    """`--target-dtype auto --autocast auto`: the probe runs every option once on the tiny target and keeps the
    fastest of each; the timings are faked so that the choice is deterministic."""
    from graft_lab.train.__main__ import parse
    from graft_lab.train.loop import build_drafter
    from graft_lab.train.probe import choose

    target = tiny_target()
    keep = torch.arange(64)
    net = build_drafter(target, keep, "rows", 0)
    for fake, want in (([1.0, 0.5, 0.2, 0.4], ("bfloat16", False)), ([0.3, 0.9, 0.8, 0.1], ("float32", True))):
        calls = []

        def timer(fn, repeats, fake=fake):
            fn()  # every option really runs
            calls.append(fn)
            return fake[len(calls) - 1]

        choice = choose(target, net, keep, tokens=12, timer=timer)
        assert (choice.target_dtype, choice.autocast) == want and len(calls) == 4
        assert "target " + want[0] in choice.line() and all(p.grad is None for p in net.parameters())
    only = choose(target, net, keep, tokens=12, dtypes=("float32",), autocasts=(True,), timer=lambda fn, r: 0.0)
    assert (only.target_dtype, only.autocast) == ("float32", True)
    args = parse(["--out", "x", "--target-dtype", "auto", "--autocast", "auto"])
    assert (args.target_dtype, args.autocast) == ("auto", "auto")
    assert parse(["--out", "x", "--autocast", "false"]).autocast is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without CUDA")
def test_device_flags_pick_cpu_here_and_refuse_cuda_in_one_line(tmp_path, capsys):
    """--device of train, regenerate and selfprompt: auto is cpu without CUDA; cuda fails at once, in one line,
    before any model loads; an unknown name lists the valid ones."""
    from graft_lab.errors import ConfigError
    from graft_lab.preflight import resolve_device
    from graft_lab.train.__main__ import main as train_main
    from graft_lab.train.regenerate import main as regen_main
    from graft_lab.train.selfprompt import main as self_main

    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="valid: auto, cpu, cuda, cuda:N"):
        resolve_device("tpu")
    with pytest.raises(SystemExit, match=r"^--device cuda: this machine \(or this torch build\) has no CUDA device"):
        train_main(["--out", str(tmp_path / "run"), "--device", "cuda"])
    assert not (tmp_path / "run").exists()
    for main, argv in ((regen_main, ["--out", str(tmp_path / "r.jsonl")]), (self_main, ["--out", str(tmp_path / "s.jsonl"),
                                                                                       "--prompts", "4"])):
        with pytest.raises(SystemExit) as exc:
            main(argv + ["--device", "cuda:1"])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exc.value.code == 2 and err.endswith("--device cuda:1: this machine (or this torch build) has no CUDA "
                                                    "device; use --device cpu or auto"), err


def test_regenerate_samples_the_targets_own_tempered_distribution(tmp_path):
    """`--temperature T`: each first reply token is drawn from softmax(logits / T) over the whole vocabulary (no
    top-k or top-p cut), checked against the target's own logits on a peaked random target; a file is the same
    for the same seed, also when resumed, and another seed gives other replies."""
    from collections import Counter

    from graft_lab.models.target import load_model
    from graft_lab.train.regenerate import main as regen_main
    from graft_lab.train.regenerate import regenerate_batch

    tgt = "random:llama?seed=0&hidden=64&layers=4"
    model, tok = load_model(tgt, dtype="float32")
    tok.padding_side = "left"
    with torch.no_grad():
        model.lm_head.weight.mul_(5)  # top token 0.98 / 0.75 / 0.22 of the mass at T 0.6 / 1 / 1.7, a long tail at 1.7
    chat = [{"role": "user", "content": "Name three rivers in Spain."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    text = tok.batch_decode([[i] for i in range(logits.numel())], skip_special_tokens=True)
    text[tok.eos_token_id] = ""  # an end of turn at once: an empty reply
    n = 2000
    for temperature in (0.6, 1.0, 1.7):
        law = Counter()
        for i, q in enumerate(torch.softmax(logits / temperature, -1).tolist()):
            law[text[i]] += q
        torch.manual_seed(0)
        seen = Counter(reply for reply, _, _ in regenerate_batch(model, tok, [chat] * n, 1, temperature))
        top = law.most_common(4)
        tail = (1 - sum(q for _, q in top), n - sum(seen[r] for r, _ in top))  # a top-k or top-p cut shows here
        for reply, (q, k) in [(r, (q, seen[r])) for r, q in top] + [("<tail>", tail)]:
            assert abs(k / n - q) < 5 * (q * (1 - q) / n) ** 0.5 + 1e-3, (temperature, reply, k, q)
    greedy = regenerate_batch(model, tok, [chat] * 4, 1)
    assert {r for r, _, _ in greedy} == {text[int(logits.argmax())]}

    rows = [{"question_id": i, "category": "chat", "turns": [t]} for i, t in enumerate(
        ["Name three rivers in Spain.", "Write a haiku about rain.", "Explain a hash map.", "Say hello."])]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--target", tgt, "--dtype", "float32", "--batch", "2", "--sort-window", "1", "--max-new-tokens", "8",
              "--prompts", str(questions), "--temperature", "1.0"]

    def replies(name: str, *flags: str) -> list[str]:
        regen_main(common + ["--out", str(tmp_path / name), *flags])
        return [json.loads(line)["messages"][1]["content"] for line in (tmp_path / name).read_text().splitlines()]

    one = replies("s3.jsonl", "--seed", "3")
    replies("s3r.jsonl", "--seed", "3", "--max-prompts", "2")  # interrupted after one window, then resumed
    assert replies("s3r.jsonl", "--seed", "3") == one and len(one) == 4
    assert replies("s4.jsonl", "--seed", "4") != one
    assert json.loads((tmp_path / "s4.jsonl.meta.json").read_text())["runs"][0]["flags"]["temperature"] == 1.0
    with pytest.raises(SystemExit):
        regen_main(common + ["--out", str(tmp_path / "bad.jsonl"), "--temperature", "-0.5"])


def test_regenerate_a_later_turn_keeps_the_conversation_before_it_as_context(tmp_path):
    """`--turn 2`: the prompt is a ShareGPT conversation up to its second user turn, ShareGPT's first reply
    marked as context; the trainer's mask labels the target's reply alone, and a question file is refused."""
    from graft_lab.models.random_model import random_tokenizer
    from graft_lab.train.data import render, sharegpt_conversations
    from graft_lab.train.regenerate import main as regen_main
    from graft_lab.train.regenerate import prompt_turns

    out = tmp_path / "turn2.jsonl"
    common = ["--target", "random:llama?seed=0&hidden=64&layers=4", "--dtype", "float32", "--batch", "2",
              "--sort-window", "2", "--max-new-tokens", "5", "--max-prompt-tokens", "400"]
    regen_main(common + ["--out", str(out), "--turn", "2", "--max-prompts", "3"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    convs = dict(itertools.islice(sharegpt_conversations(skip=rows[0]["index"]), rows[-1]["index"] - rows[0]["index"] + 1))
    assert len(rows) == 3
    for r in rows:
        msgs, source = r["messages"], convs[r["index"]]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
        assert [m["content"] for m in msgs[:3]] == [m["content"] for m in source[:3]]  # ShareGPT's own turns
        assert msgs[1]["label"] is False and "label" not in msgs[3]
    tok = random_tokenizer()
    msgs = rows[0]["messages"]
    ids, mask = render(tok, msgs, 4096)
    _, both = render(tok, [{k: v for k, v in m.items() if k != "label"} for m in msgs], 4096)
    reply = tok(msgs[3]["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert int(mask.sum()) == len(reply) and ids[mask].tolist() == reply  # the target's reply, nothing before it
    assert int(both.sum()) > int(mask.sum()) and bool((both | ~mask).all())  # unmarked, ShareGPT's reply is a label
    one = next(prompt_turns(None, rows[0]["index"], 1))[1]
    assert [m["role"] for m in one] == ["user"]  # turn 1: the first user turn alone, as before
    with pytest.raises(SystemExit):
        regen_main(common + ["--out", str(tmp_path / "q.jsonl"), "--turn", "2", "--prompts", str(out)])
    with pytest.raises(SystemExit):
        regen_main(common + ["--out", str(tmp_path / "q.jsonl"), "--turn", "0"])


def test_regenerate_reads_a_question_file_and_leaves_evaluation_prompts_out(tmp_path):
    """`--prompts FILE`: the first turns of a question.jsonl are the prompts, except one that is an MT-Bench
    question pasted with a greeting; a rerun resumes after the last line written."""
    from graft_lab.train.data import mtbench_questions
    from graft_lab.train.regenerate import main as regen_main

    mt = mtbench_questions()[3]["turns"][0]
    rows = [{"question_id": i, "category": "chat", "turns": [text, "and then?"]}
            for i, text in enumerate(["Name three rivers in Spain.", "Hello! " + mt, "Write a haiku about rain.",
                                      "Explain what a hash map is."])]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "regen.jsonl"
    common = ["--out", str(out), "--target", "random:llama?seed=0&hidden=64&layers=4", "--dtype", "float32",
              "--batch", "2", "--sort-window", "1", "--max-new-tokens", "4", "--prompts", str(questions)]
    regen_main(common + ["--max-prompts", "2"])
    regen_main(common)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in written] == [0, 2, 3]
    assert [r["messages"][0]["content"] for r in written] == [rows[i]["turns"][0] for i in (0, 2, 3)]
    later = tmp_path / "later.jsonl"  # --start: a new file from a source index on (the next stage's replies)
    regen_main(common[2:] + ["--out", str(later), "--start", "2"])
    assert [json.loads(line)["index"] for line in later.read_text().splitlines()] == [2, 3]
    with pytest.raises(SystemExit):
        regen_main(["--out", str(out), "--prompts", str(tmp_path / "missing.jsonl")])
    with pytest.raises(SystemExit):
        regen_main(common[2:] + ["--out", str(later), "--start", "-1"])
    from graft_lab.models.target import load_model
    from graft_lab.train.regenerate import prompts

    _, tok = load_model("random:llama?seed=0&hidden=64&layers=4", dtype="float32")
    lengths = {idx: n for idx, _, n in prompts(tok, 0, 1000, None, questions)}  # all four: no screen
    cut = min(lengths[i] for i in (0, 2, 3))  # --min-prompt-tokens: the longer prompts only (a next stage's pool)
    longer = tmp_path / "longer.jsonl"
    regen_main(common[2:] + ["--out", str(longer), "--min-prompt-tokens", str(cut)])
    kept = [i for i in (0, 2, 3) if lengths[i] > cut]
    assert 0 < len(kept) < 3 and [json.loads(line)["index"] for line in longer.read_text().splitlines()] == kept
    with pytest.raises(SystemExit):
        regen_main(common[2:] + ["--out", str(longer), "--min-prompt-tokens", "192"])  # not below the maximum


def test_the_moving_average_is_of_every_step_survives_a_resume_and_is_what_exports(tmp_path):
    """--ema d: after one step the average is d * start + (1 - d) * the stepped weights; a run resumed after its
    first step ends with the same average (and raw weights) as one that ran through; the result, the final
    validation and --export-only are the average, and --export-only --ema 0 the raw weights."""
    from graft_lab.train.__main__ import main as train_main

    target = tiny_target()
    sequences, data = _sequences()
    base = dict(draft_vocab=64, vocab_sequences=20, ttt_steps=2, lr=3e-3, warmup_tokens=0, min_lr_ratio=1.0,
                labels_per_step=64, ckpt_every=1, log_every=1, eval_every_tokens=0, progress=False, autocast=False)

    def run(name, **kw):
        return train(TrainConfig(out=str(tmp_path / name), **{**base, **kw}), target, sequences, val=data[:2],
                     eos_ids=(2,))

    def weights(net):
        return {k: p.detach().clone() for k, p in net.named_parameters()}

    start = weights(run("still", lr=0.0, max_tokens=1))
    stepped = weights(run("one", max_tokens=1))
    avg = weights(run("avg", max_tokens=1, ema=0.75))
    assert any(not torch.equal(start[k], stepped[k]) for k in start)
    for k in start:
        torch.testing.assert_close(avg[k], 0.75 * start[k] + 0.25 * stepped[k], rtol=0, atol=1e-6)
    raw = torch.load(tmp_path / "avg" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(raw[k], stepped[k]) for k in stepped)  # the checkpoint resumes from the raw weights
    curve = [json.loads(line) for line in (tmp_path / "avg" / "curve.jsonl").read_text().splitlines()]
    assert [r["weights"] for r in curve] == ["raw", "ema"] and curve[0]["val_loss"] != curve[1]["val_loss"]

    through = weights(run("through", max_tokens=400, ema=0.9))
    steps = torch.load(tmp_path / "through" / "checkpoint.pt", weights_only=False)["state"]["step"]
    run("resumed", max_tokens=1, ema=0.9)
    again = train(TrainConfig(out=str(tmp_path / "resumed"), **{**base, "max_tokens": 400, "ema": 0.9}), target,
                  sequences, eos_ids=(2,), resume=True)
    ck = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    assert steps >= 3 and ck["state"]["step"] == steps
    assert all(torch.equal(p, through[k]) for k, p in again.named_parameters())
    with pytest.raises(ValueError, match=r"ema 1.0: give a decay in \[0, 1\)"):
        run("bad", max_tokens=1, ema=1.0)

    from safetensors.torch import load_file

    cli = ["--target", "random:llama?seed=0&hidden=64&layers=4", "--target-dtype", "float32", "--draft-vocab", "64",
           "--vocab-sequences", "4", "--eval-questions", "0", "--val-sequences", "2", "--max-len", "64",
           "--labels-per-step", "16", "--progress", "false", "--autocast", "false", "--eval-every-tokens", "0",
           "--ttt-steps", "2", "--max-tokens", "300", "--warmup-tokens", "10", "--out", str(tmp_path / "cli"),
           "--ema", "0.8"]
    train_main(cli + ["--export", str(tmp_path / "cli_end")])
    train_main(cli + ["--export-only", "--export", str(tmp_path / "cli_ema")])
    train_main(cli + ["--export-only", "--export", str(tmp_path / "cli_raw"), "--ema", "0"])
    end, avg, raw = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("cli_end", "cli_ema", "cli_raw"))
    model = torch.load(tmp_path / "cli" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(end[k], avg[k]) for k in end) and any(not torch.equal(avg[k], raw[k]) for k in raw)
    assert all(torch.equal(raw[k], model[k].to(raw[k].dtype)) for k in raw if k in model)
