"""Tree-attention kernel against a float64 reference, and its transformers integration.

Without CUDA the kernel runs in Triton's interpreter, which Triton only picks when TRITON_INTERPRET=1
is set before the kernels are defined. The setdefault below does that when this module is the first
to import graft_lab.kernels; run `TRITON_INTERPRET=1 pytest` to be independent of import order.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, StaticCache  # noqa: E402

pytest.importorskip("triton", reason="graft_lab.kernels needs triton (pip install 'graft-lab[kernels]')")

from graft_lab.kernels import (  # noqa: E402
    ATTENTION_NAME,
    TreeMaskBits,
    graft_tree_attention,
    pack_tree_mask,
    register_tree_attention,
    tree_attention,
    tree_attention_reference,
)
from graft_lab.kernels import tree_attention_kernel  # noqa: E402

INTERPRETED = tree_attention_kernel.INTERPRETED
DEVICE = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.fail(
        "graft_lab.kernels was imported before TRITON_INTERPRET=1 was set and there is no GPU: "
        "run `TRITON_INTERPRET=1 pytest`",
        pytrace=False,
    )

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOLERANCE)


def random_parents(num_nodes: int, generator: torch.Generator) -> list[int]:
    """A random tree: node 0 is the root, every other node's parent comes before it."""
    return [-1] + [int(torch.randint(0, i, (), generator=generator)) for i in range(1, num_nodes)]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[T, T] bool, True where node j is node i or one of its ancestors."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node in range(len(parents)):
        ancestor = node
        while ancestor >= 0:
            mask[node, ancestor] = True
            ancestor = parents[ancestor]
    return mask


def random_problem(batch, kv_heads, groups, nodes, prefix, head_dim, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * groups, nodes, head_dim, generator=generator)
    k = torch.randn(batch, kv_heads, prefix + nodes, head_dim, generator=generator)
    v = torch.randn(batch, kv_heads, prefix + nodes, head_dim, generator=generator)
    mask = torch.stack([ancestor_mask(random_parents(nodes, generator)) for _ in range(batch)])
    return (t.to(DEVICE, dtype) for t in (q, k, v)), mask.to(DEVICE)


def run_poisoned(q, k, v, mask, **kwargs) -> torch.Tensor:
    """Run into an output pre-filled with NaN, so any element the kernel misses fails the check."""
    out = torch.full_like(q, float("nan"))
    returned = tree_attention(q, k, v, mask, out=out, **kwargs)
    assert returned is out
    return out


def assert_close_to_reference(out, q, k, v, mask, scale=None):
    assert not out.isnan().any(), "kernel left NaN in the output"
    expected = tree_attention_reference(q, k, v, mask, scale)
    tol = TOLERANCE[q.dtype]
    error = (out.double() - expected).abs() / (1 + expected.abs())
    assert error.max().item() <= tol, f"max relative error {error.max().item():.3g} > {tol:g} for {q.dtype}"


def _grid_cases():
    for nodes, prefix, groups, dtype in itertools.product([1, 7, 60, 64, 100], [0, 1, 37, 300], [1, 3, 4], DTYPES):
        marks = [pytest.mark.slow] if prefix == 300 and nodes >= 60 else []
        yield pytest.param(nodes, prefix, groups, dtype, marks=marks, id=f"T{nodes}-P{prefix}-G{groups}-{dtype}")


@pytest.mark.parametrize("nodes,prefix,groups,dtype", _grid_cases())
def test_matches_reference(nodes, prefix, groups, dtype):
    (q, k, v), mask = random_problem(2, 2, groups, nodes, prefix, 64, dtype, seed=nodes * 7919 + prefix * 31 + groups)
    out = run_poisoned(q, k, v, mask, kv_splits=1)
    assert_close_to_reference(out, q, k, v, mask)


@pytest.mark.parametrize("kv_splits", [2, 3, 8])
@pytest.mark.parametrize("prefix", [37, 300])
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_prefix_merges_exactly(kv_splits, prefix, dtype):
    (q, k, v), mask = random_problem(1, 2, 4, 60, prefix, 64, dtype, seed=kv_splits + prefix)
    out = run_poisoned(q, k, v, mask, kv_splits=kv_splits)
    assert_close_to_reference(out, q, k, v, mask)


@pytest.mark.parametrize("head_dim", [16, 48, 128])
def test_head_dims_and_custom_scale(head_dim):
    (q, k, v), mask = random_problem(1, 1, 2, 13, 70, head_dim, torch.float32, seed=head_dim)
    out = run_poisoned(q, k, v, mask, scale=0.3)
    assert_close_to_reference(out, q, k, v, mask, scale=0.3)


def test_large_logits_stay_finite():
    (q, k, v), mask = random_problem(1, 2, 2, 33, 100, 64, torch.float16, seed=5)
    q = q * 30
    out = run_poisoned(q, k, v, mask, kv_splits=3)
    assert_close_to_reference(out, q, k, v, mask)


def test_any_node_order_and_forests():
    """The kernel reads whatever the bits say: children may precede parents, and a forest works."""
    generator = torch.Generator().manual_seed(3)
    nodes = 70
    parents = random_parents(nodes, generator)
    parents[40] = -1  # a second root
    mask = ancestor_mask(parents)
    order = torch.randperm(nodes, generator=generator)
    mask = mask[order][:, order][None].to(DEVICE)
    (q, k, v), _ = random_problem(1, 2, 3, nodes, 20, 32, torch.float32, seed=3)
    assert_close_to_reference(run_poisoned(q, k, v, mask), q, k, v, mask)


def test_strided_views_and_packed_mask():
    """HF passes transposed q/out views and cache views of a longer buffer; the mask may come pre-packed."""
    (q, k, v), mask = random_problem(1, 2, 2, 40, 50, 32, torch.bfloat16, seed=11)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_buffer, v_buffer = (torch.zeros(1, 2, 128, 32, dtype=q.dtype, device=DEVICE) for _ in range(2))
    k_buffer[:, :, :90], v_buffer[:, :, :90] = k, v
    out = torch.full((1, 40, 4, 32), float("nan"), dtype=q.dtype, device=DEVICE)
    tree_attention(q_strided, k_buffer[:, :, :90], v_buffer[:, :, :90], pack_tree_mask(mask), out=out.transpose(1, 2))
    assert_close_to_reference(out.transpose(1, 2), q, k, v, mask)


@pytest.mark.parametrize("nodes", [1, 31, 32, 33, 64, 100])
def test_pack_tree_mask_bit_layout(nodes):
    generator = torch.Generator().manual_seed(nodes)
    mask = torch.rand(2, nodes, nodes, generator=generator) < 0.5
    words = pack_tree_mask(mask).words
    assert words.dtype == torch.int32 and words.shape == (2, nodes, -(-nodes // 32))
    j = torch.arange(nodes)
    unpacked = ((words.long()[:, :, j // 32] >> (j % 32)) & 1).bool()
    assert torch.equal(unpacked, mask | torch.eye(nodes, dtype=torch.bool))


def _bad_inputs():
    q, k, v = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 5, 16), torch.zeros(1, 2, 5, 16)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    yield "4-D", (q[0], k, v, mask)
    yield "dtype must be one of", (q.double(), k.double(), v.double(), mask)
    yield "share a dtype", (q, k.half(), v, mask)
    yield "same shape", (q, k, v[:, :, :4], mask)
    yield "batch or head dim", (q, k[..., :8], v[..., :8], mask)
    yield "multiple of kv heads", (q[:, :3], k, v, mask)
    yield "exceeds the kv length", (q, k[:, :, :2], v[:, :, :2], mask)
    yield "at least one tree node", (q[:, :, :0], k, v, mask[:, :0, :0])
    yield "bool tensor", (q, k, v, mask.float())
    yield r"\[B, T, T\]", (q, k, v, mask[:, :2, :2])
    yield "packed tree mask", (q, k, v, TreeMaskBits(torch.zeros(1, 3, 1, dtype=torch.int64)))


@pytest.mark.parametrize("match,args", list(_bad_inputs()), ids=[m for m, _ in _bad_inputs()])
def test_invalid_inputs_raise(match, args):
    with pytest.raises(ValueError, match=match):
        tree_attention(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args))


def test_invalid_out_and_splits_raise():
    (q, k, v), mask = random_problem(1, 1, 1, 4, 4, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="out must be"):
        tree_attention(q, k, v, mask, out=torch.empty_like(q, dtype=torch.float16))
    with pytest.raises(ValueError, match="kv_splits"):
        tree_attention(q, k, v, mask, kv_splits=0)


# --- transformers integration -------------------------------------------------------------------

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128,
)
# Branching tree (a chain would equal causal attention and hide a dropped tree_mask): node 0 is the root.
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 6, 8]


def tiny_model(family: str):
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    return model_cls(config_cls(**TINY)).eval().to(DEVICE)


def tree_inputs(prefix_len: int):
    mask = ancestor_mask(TREE_PARENTS)[None].to(DEVICE)
    depth = mask.sum(-1) - 1
    tokens = torch.randint(0, TINY["vocab_size"], (1, len(TREE_PARENTS)), generator=torch.Generator().manual_seed(1))
    return tokens.to(DEVICE), (prefix_len + depth).to(DEVICE), mask


def additive_mask(tree_mask: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The same visibility as a [1, 1, T, S] float mask for SDPA: 0 where allowed, dtype-min elsewhere."""
    nodes = tree_mask.shape[-1]
    allowed = torch.cat([torch.ones(1, nodes, prefix_len, dtype=torch.bool, device=DEVICE), tree_mask], -1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=DEVICE).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def test_register_is_idempotent():
    assert register_tree_attention() == register_tree_attention() == ATTENTION_NAME == "graft_tree"
    assert ATTENTION_NAME in transformers.AttentionInterface._global_mapping
    assert ATTENTION_NAME in transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS


@pytest.mark.parametrize(
    "family,packed", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", False)]
)
@torch.no_grad()
def test_hf_tree_forward_matches_sdpa(family, packed):
    """A tree forward on a prefilled cache through graft_tree equals SDPA with the equivalent float mask."""
    name = register_tree_attention()
    prompt = torch.randint(0, TINY["vocab_size"], (1, 23), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    tokens, positions, tree_mask = tree_inputs(prompt.shape[1])

    model = tiny_model(family)
    sdpa_cache = DynamicCache(config=model.config)
    sdpa_prefill = model(input_ids=prompt, cache=sdpa_cache).logits
    sdpa_tree = model(
        input_ids=tokens,
        position_ids=positions,
        attention_mask=additive_mask(tree_mask, prompt.shape[1], torch.float32),
        cache=sdpa_cache,
    ).logits

    model.set_attn_implementation(name)
    assert model.config._attn_implementation == name
    cache = DynamicCache(config=model.config)
    prefill = model(input_ids=prompt, cache=cache).logits
    kernel_mask = pack_tree_mask(tree_mask) if packed else tree_mask
    tree = model(
        input_ids=tokens, position_ids=positions, attention_mask=None, cache=cache, tree_mask=kernel_mask
    ).logits

    torch.testing.assert_close(prefill, sdpa_prefill, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tree, sdpa_tree, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@torch.no_grad()
def test_hf_without_tree_mask_is_causal_sdpa(cache_kind):
    """Prefill then a causal 4-token chunk on the cache: graft_tree must equal sdpa, static buffer included."""

    def run(model):
        cache = (
            DynamicCache(config=model.config)
            if cache_kind == "dynamic"
            else StaticCache(config=model.config, max_cache_len=64)
        )
        prefill = model(input_ids=ids[:, :19], cache=cache).logits
        return prefill, model(input_ids=ids[:, 19:], cache=cache).logits

    ids = torch.randint(0, TINY["vocab_size"], (1, 23), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    model = tiny_model("llama")
    expected = run(model)
    model.set_attn_implementation(register_tree_attention())
    for got, want in zip(run(model), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dropout": 0.1}, "dropout"),
        ({"sliding_window": 16}, "sliding-window"),
        ({"groups": 3}, "num_key_value_groups"),
    ],
)
def test_hf_attention_rejects_unsupported_tree_calls(kwargs, match):
    (q, k, v), mask = random_problem(1, 2, 2, 5, 3, 16, torch.float32, seed=0)
    module = torch.nn.Module()
    module.num_key_value_groups = kwargs.pop("groups", 2)
    with pytest.raises(ValueError, match=match):
        graft_tree_attention(module, q, k, v, None, tree_mask=mask, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@torch.inference_mode()
def test_engine_verify_matches_sdpa_across_a_commit(arch):
    """Through the engine's Target and TreeKVCache (views of a longer buffer, compacted in place)."""
    from graft_lab.tree import DraftTree
    from tiny import VOCAB, tiny_target

    parents = torch.tensor(TREE_PARENTS)
    depth = ancestor_mask(TREE_PARENTS).sum(-1) - 1
    tokens = torch.randint(3, VOCAB, (len(TREE_PARENTS),), generator=torch.Generator().manual_seed(4))
    tree = DraftTree(tokens, parents, depth, torch.zeros(len(parents)), torch.zeros(len(parents), dtype=torch.int8))
    prompt = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(5))
    logits = {}
    for attn in ("sdpa", "triton"):
        target = tiny_target(arch)
        target.use_attention(attn)
        cache = target.new_cache(128)
        target.prefill(prompt, cache, want_aux=False)
        first = target.verify(tree, cache, want_aux=True)
        target.commit(cache, prompt.numel(), torch.tensor([0, 1, 3, 7]))
        logits[attn] = (first.logits, first.aux, target.verify(tree, cache, want_aux=False).logits)
    for got, want in zip(logits["triton"], logits["sdpa"]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decode_through_triton_accepts_what_sdpa_accepts(arch):
    """Whole speculative steps through the Triton path give the same accepted tokens as the sdpa path."""
    import random

    from graft_lab.decode import Method, StopRule, generate
    from graft_lab.drafters.eagle3 import Eagle3Drafter
    from graft_lab.graft import graft_root
    from graft_lab.pruners import NoPruner
    from graft_lab.retrievers import NoRetriever
    from graft_lab.verify import SamplingParams
    from tiny import hf_greedy, tiny_eagle3, tiny_target

    rng = random.Random(5)
    prompt = torch.tensor([rng.randrange(3, 96) for _ in range(9)])
    runs = {}
    for attn in ("sdpa", "triton"):
        target = tiny_target(arch, seed=2)
        target.use_attention(attn)
        drafter = Eagle3Drafter(tiny_eagle3(target, seed=1), target.model.get_input_embeddings(), depth=4, top_k=3)
        runs[attn] = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, 12), prompt,
                              SamplingParams(), StopRule(max_new_tokens=16))
    assert runs["triton"].tokens == runs["sdpa"].tokens == hf_greedy(tiny_target(arch, seed=2).model, prompt, 16)
    assert [s.accept_length for s in runs["triton"].steps] == [s.accept_length for s in runs["sdpa"].steps]
