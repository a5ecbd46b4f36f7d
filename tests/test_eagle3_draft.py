"""The EAGLE-3 drafter's level loop (preallocated pool, kept attention rows, rotary table) drafts exactly
the tree of a straightforward reference: same tokens, parents, depths, scores and sources, and the same
pruner calls, over many budgets, depths, top-k, draft vocabularies, pruners and drafter dtypes.
The drafter's own dtype (drafter.dtype) never changes the output."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import LlamaConfig

from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters import DRAFTERS
from graft_lab.drafters.base import DraftInput
from graft_lab.drafters.eagle3 import Eagle3Drafter, Eagle3Options
from graft_lab.drafters.eagle3_model import Eagle3Model
from graft_lab.errors import ConfigError
from graft_lab.graft import graft_root
from graft_lab.pruners import NoPruner
from graft_lab.retrievers import NoRetriever
from graft_lab.tree import DraftTree, Source
from graft_lab.verify import SamplingParams, check_finite
from oracle import OracleRetriever
from tiny import VOCAB, hf_greedy, shared_tiny_target, tiny_eagle3, write_eagle3

pytestmark = pytest.mark.usefixtures("one_thread")


class ReferenceDrafter:
    """The plain level loop: Python-list pools concatenated each level, the attention mask over the whole
    cache rebuilt each level, rotary computed from position ids each call."""

    def __init__(self, net: Eagle3Model, embed, depth: int, top_k: int):
        self.net, self.embed, self.depth, self.top_k = net, embed, depth, top_k

    def reset(self, max_len: int) -> None:
        from graft_lab.models.cache import TreeKVCache

        self.cache = TreeKVCache(1, max_len + self.depth * self.top_k + 1)

    def _step(self, tokens, hidden, positions, mask):
        dtype = self.net.fc.weight.dtype
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
        out = self.net(self.embed(tokens)[None].to(dtype), hidden[None].to(dtype), positions[None],
                       additive[None, None], self.cache)
        return out[0]

    def _top_k(self, hidden, k):
        logits = self.net.logits(hidden).float()
        check_finite(logits, "the reference drafter's logits")
        vals, ids = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
        return self.net.to_target_ids(ids), vals

    @torch.inference_mode()
    def draft(self, inp: DraftInput, budget: int, pruner) -> DraftTree:
        self.cache.crop(inp.start)
        m = inp.next_tokens.numel()
        committed = inp.start + m
        causal = torch.ones(m, committed, dtype=torch.bool).tril(inp.start)
        h = self._step(inp.next_tokens, inp.features, torch.arange(inp.start, committed), causal)[-1:]
        if budget <= 1:
            return DraftTree.root(inp.root)
        k = min(self.top_k, self.net.draft_vocab_size)
        tok, lp = self._top_k(h, k)
        pool_tok, pool_score = [tok[0]], [lp[0]]
        pool_par, pool_depth = [torch.zeros(k, dtype=torch.long)], [torch.ones(k, dtype=torch.long)]
        frontier, frontier_h = torch.arange(1, k + 1), h.expand(k, -1)
        frontier_anc = torch.zeros(k, 0, dtype=torch.bool)
        n_nodes, level = 1 + k, 0
        while level + 1 < self.depth and pruner.keep_drafting(level, float(pool_score[-1].max())):
            f = frontier.numel()
            anc = torch.cat([frontier_anc, torch.eye(f, dtype=torch.bool)], dim=1)
            mask = torch.cat([torch.ones(f, committed, dtype=torch.bool), anc], dim=1)
            flat_tok, flat_score = torch.cat(pool_tok), torch.cat(pool_score)
            out = self._step(flat_tok[frontier - 1], frontier_h, torch.full((f,), committed + level), mask)
            child_tok, child_lp = self._top_k(out, k)
            child_score = (flat_score[frontier - 1][:, None] + child_lp).flatten()
            pool_tok.append(child_tok.flatten())
            pool_score.append(child_score)
            pool_par.append(frontier.repeat_interleave(k))
            pool_depth.append(torch.full((f * k,), level + 2, dtype=torch.long))
            best = torch.topk(child_score, min(k, child_score.numel())).indices
            frontier, frontier_h, frontier_anc = n_nodes + best, out[best // k], anc[best // k]
            n_nodes += child_score.numel()
            level += 1
        self.cache.crop(committed)
        source = torch.full((n_nodes,), int(Source.DRAFT), dtype=torch.int8)
        source[0] = int(Source.ROOT)
        tree = DraftTree(torch.cat([torch.tensor([inp.root]), *pool_tok]), torch.cat([torch.tensor([-1]), *pool_par]),
                         torch.cat([torch.zeros(1, dtype=torch.long), *pool_depth]),
                         torch.cat([torch.zeros(1), *pool_score]).float(), source)
        return tree.cut(pruner.draft_budget(budget, level))


class RecordingPruner:
    """Stops below a score threshold and keeps fewer nodes the deeper it went; records every call."""

    def __init__(self, threshold: float):
        self.threshold, self.calls = threshold, []

    def keep_drafting(self, level: int, best_score: float) -> bool:
        self.calls.append(("keep", level, best_score))
        return best_score >= self.threshold

    def draft_budget(self, total: int, last_level: int) -> int:
        self.calls.append(("budget", total, last_level))
        return max(1, total - 3 * last_level)


class HalfBudget(NoPruner):
    """Leaves half of the budget to retrieval, so drafted and retrieved nodes share every tree."""

    def draft_budget(self, total: int, last_level: int) -> int:
        return max(1, total // 2)


def assert_same_tree(got: DraftTree, want: DraftTree, where: str) -> None:
    for field in ("tokens", "parents", "depth", "score", "source"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where}: {field} differs\n{a}\n{b}"


def dynamic_rope_net(target, seed: int) -> Eagle3Model:
    """A tiny drafter whose RoPE table changes with the sequence length (no kept table: the per-step path)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=96,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=24,
                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    net = Eagle3Model(cfg, target_hidden_size=target.hidden_size)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    return net.eval()


def compare_drafts(net: Eagle3Model, target, depth: int, top_k: int, seed: int, steps: int = 8) -> int:
    """Drive the drafter and the reference (each on its own copy of `net`) through one random sequence of
    committed pairs and budgets; every tree and pruner call must match. Returns the nodes compared."""
    rng = random.Random(seed)
    embed = target.model.get_input_embeddings()
    new, ref = Eagle3Drafter(net, embed, depth, top_k), ReferenceDrafter(copy.deepcopy(net), embed, depth, top_k)
    width = len(target.aux_layers) * target.hidden_size
    gen = torch.Generator().manual_seed(seed)
    max_len = 160
    new.reset(max_len), ref.reset(max_len)
    start, m, nodes = 0, rng.randint(1, 12), 0
    for step in range(steps):
        feats = torch.randn(m, width, generator=gen, dtype=target.dtype)
        inp = DraftInput(feats, torch.randint(0, target.vocab_size, (m,), generator=gen), start)
        budget = rng.choice([1, 2, 3, rng.randint(4, 20), rng.randint(20, 90)])
        threshold = rng.choice([None, -1.0, -4.0, -12.0])
        pruner = NoPruner if threshold is None else (lambda: RecordingPruner(threshold))
        p_new, p_ref = pruner(), pruner()
        got, want = new.draft(inp, budget, p_new), ref.draft(inp, budget, p_ref)
        where = f"seed {seed} step {step} depth {depth} top_k {top_k} budget {budget} threshold {threshold}"
        assert_same_tree(got, want, where)
        assert getattr(p_new, "calls", None) == getattr(p_ref, "calls", None), where
        got.check()
        nodes += got.size
        start, m = start + m, rng.randint(1, 4)
    return nodes


@pytest.mark.parametrize("arch,draft_vocab,dtype", [
    ("llama", None, torch.float32), ("qwen2", 40, torch.float32), ("qwen3", 7, torch.float32),
    ("llama", 40, torch.bfloat16), ("qwen3", None, torch.float16),
])
def test_draft_equals_the_reference(arch, draft_vocab, dtype):
    target = shared_tiny_target(arch)
    rng = random.Random(f"{arch}-{draft_vocab}-{dtype}")
    nodes = 0
    for case in range(8):
        net = tiny_eagle3(target, draft_vocab, seed=case).to(dtype)
        depth, top_k = rng.choice([1, 2, rng.randint(3, 8)]), rng.choice([1, 2, rng.randint(3, 10), 12])
        nodes += compare_drafts(net, target, depth, top_k, seed=100 * case + depth)
    assert nodes > 150  # real trees were compared, not only roots


def test_draft_equals_the_reference_with_a_dynamic_rope():
    target = shared_tiny_target("llama")
    net = dynamic_rope_net(target, seed=3)
    assert net.rope_table(8, torch.float32) is None  # the per-step path, past the 24 original positions
    for seed in range(3):
        compare_drafts(copy.deepcopy(net), target, depth=4, top_k=3, seed=seed, steps=10)


def test_rope_table_matches_rotary_per_position():
    net = tiny_eagle3(shared_tiny_target("llama"))
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = net.rope_table(300, dtype)
        probe = torch.zeros(1, dtype=dtype)
        for p in (0, 1, 17, 255, 299):
            c, s = net.rotary_emb(probe, position_ids=torch.tensor([[p]]))
            assert torch.equal(c, cos[:, p : p + 1]) and torch.equal(s, sin[:, p : p + 1])


def test_drafter_dtype_option(tmp_path):
    target = shared_tiny_target("llama")
    path = write_eagle3(target, tmp_path / "d")
    for name, want in (("auto", torch.float32), ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                       ("float16", torch.float16), ("float32", torch.float32)):
        drafter = DRAFTERS.build({"name": "eagle3", "path": str(path), "depth": 2, "top_k": 2, "dtype": name}, target=target)
        assert drafter.dtype == want and drafter.net.lm_head.weight.dtype == want
    with pytest.raises(ConfigError, match=r"drafter.dtype must be one of auto, float32, .*bfloat16.*; got 'int8'"):
        Eagle3Options(path=str(path), dtype="int8")


@pytest.mark.parametrize("arch,dtype", [("llama", torch.bfloat16), ("qwen2", torch.float16), ("qwen3", torch.bfloat16)])
def test_a_drafter_in_another_dtype_is_lossless(arch, dtype):
    """A bf16 / fp16 drafter beside an fp32 target: greedy output is transformers' own, token for token. An
    oracle retriever shares the budget, so multi-token steps feed fp32 features back into the drafter."""
    target = shared_tiny_target(arch)
    drafter = Eagle3Drafter(tiny_eagle3(target, seed=4).to(dtype), target.model.get_input_embeddings(), depth=4, top_k=3)
    rng = random.Random(7)
    drafted = longest = 0
    for q in range(4):
        prompt = torch.tensor([rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 20))])
        ref = hf_greedy(target.model, prompt, 24)
        oracle = OracleRetriever(ref, VOCAB, seed=q, error_rate=0.2)
        method = Method(drafter, HalfBudget(), oracle, graft_root, 16)
        gen = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=24))
        assert gen.tokens == ref
        drafted += sum(s.drafted for s in gen.steps)
        longest = max([longest, *(s.accept_length for s in gen.steps)])
    assert drafter.cache.layers[0].keys.dtype == dtype and drafted > 0  # it drafted, in its own dtype
    assert longest >= 3


@pytest.mark.parametrize("linear, op", [("torch", "aten::mm"), ("onednn", "mkldnn::_linear_pointwise")])
def test_draft_ops_table_lists_the_level_ops(tmp_path, capsys, linear, op):
    """benchmarks/draft_ops.py: per further level, every op's share of the op time and its calls. The linear
    kernel is named, not `auto`, which picks oneDNN's packed GEMM for bf16 only on CPUs that support it."""
    from benchmarks.draft_ops import main
    from graft_lab.models.linear import onednn_supports
    from graft_lab.models.target import Target, load_model

    if linear == "onednn" and not onednn_supports(torch.bfloat16, torch.device("cpu")):
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU")
    model = "random:llama?seed=0&hidden=64&layers=4"
    path = write_eagle3(Target(*load_model(model)), tmp_path / "d")
    assert main(["--model", model, "--drafter", str(path), "--depth", "3", "--top-k", "2", "--repeats", "2",
                 "--drafter-dtype", "bfloat16", "--rows", "1000", "--linear", linear]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out[3:] if line.strip()}
    assert "(bfloat16)" in out[0] and f"linear {linear}," in out[0] and op in rows
    assert rows[op][1] == 8.0  # fc is skipped after level 0: q, k, v, o, gate, up, down, head
    # each share is printed to 0.1: the printed sum is 100 within half that per row
    assert sum(share for share, _ in rows.values()) == pytest.approx(100, abs=0.05 * len(rows) + 1e-6)
