"""model.linear=onednn: every nn.Linear of the target (and of the EAGLE-3 drafter) packed once for oneDNN.
The kernel against torch's F.linear (the reference), its row invariance (a row's result does not depend on the
rows beside it), and the contract: greedy decoding with packed linears equals transformers' generate on the
unpacked model, token for token, across architectures, tree shapes and budgets."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from graft_lab.config import validate
from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.errors import ConfigError, ModelLoadError
from graft_lab.graft import graft_root
from graft_lab.models import linear as linear_mod
from graft_lab.models.linear import LinearTiming, PackedLinear, onednn_supports, pack_linears, resolve_linear, time_linears
from graft_lab.models.target import Target
from graft_lab.pruners import NoPruner
from graft_lab.retrievers import NoRetriever
from graft_lab.verify import SamplingParams
from harness import TINY, compose_cfg
from tiny import VOCAB, hf_greedy, tiny_eagle3, tiny_model

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not onednn_supports(torch.float32, CPU), reason="oneDNN cannot pack fp32 here")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (2, 5, 64)])
def test_packed_linear_matches_torch(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        ref, out = lin(x), PackedLinear(lin)(x)
    assert out.shape == ref.shape == (*shape[:-1], 96)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_packed_rows_do_not_depend_on_their_neighbours():
    """The property that makes a batched verify's linear layers agree exactly with one-token forwards."""
    torch.manual_seed(1)
    packed = PackedLinear(nn.Linear(576, 1536, bias=False))
    x = torch.randn(16, 576)
    with torch.inference_mode():
        batched = packed(x)
        alone = torch.cat([packed(x[i : i + 1]) for i in range(16)])
    assert torch.equal(batched, alone)


def test_pack_linears_keeps_weights_ties_and_counts():
    model = tiny_model("llama", seed=0)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    params = sum(p.numel() for p in model.parameters())
    assert pack_linears(model) == n_linear and any(isinstance(m, PackedLinear) for m in model.modules())
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie holds
    assert sum(p.numel() for p in model.parameters()) == params
    assert "packed" not in "".join(model.state_dict())  # checkpoints are unchanged


def test_resolve_linear_choices(monkeypatch):
    assert resolve_linear("auto", torch.float32, CPU) == "onednn"
    assert resolve_linear("torch", torch.float32, CPU) == "torch"
    assert resolve_linear("auto", torch.float32, torch.device("meta")) == "torch"  # no oneDNN off the CPU
    monkeypatch.setattr(linear_mod, "onednn_supports", lambda dtype, device: False)
    assert resolve_linear("auto", torch.bfloat16, CPU) == "torch"
    with pytest.raises(ValueError, match="linear=onednn is not supported for bfloat16"):
        resolve_linear("onednn", torch.bfloat16, CPU)
    with pytest.raises(ValueError, match="valid: auto, torch, onednn"):
        resolve_linear("mkl", torch.float32, CPU)


def test_target_use_linear():
    target = Target(tiny_model("qwen2", seed=0), tokenizer=None, aux_layers=(1, 2, 3))
    target.use_linear("onednn")
    assert target.linear == "onednn" and isinstance(target.model.lm_head, PackedLinear) and target.linear_timing is None
    with pytest.raises(ModelLoadError, match="load it again for linear=torch"):
        target.use_linear("torch")


def test_time_linears_times_both_kernels_over_every_linear_layer():
    model = tiny_model("llama", seed=0)
    timing, packed = time_linears(model, rows=(1, 4), repeats=1)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert set(packed) == set(linears) and timing.rows == (1, 4)
    assert all(t > 0 for t in (*timing.torch_s, *timing.onednn_s)) and timing.faster in ("torch", "onednn")
    assert pack_linears(model, packed) == len(linears)
    assert all(m.packed is packed[linears[i]] for i, m in enumerate(m for m in model.modules() if isinstance(m, PackedLinear)))


@pytest.mark.parametrize("faster", ["onednn", "torch"])
def test_auto_keeps_the_kernel_that_times_faster_on_this_machine(monkeypatch, faster):
    slow, fast = (0.002, 0.003), (0.001, 0.0015)
    timing = LinearTiming((1, 8), *((slow, fast) if faster == "onednn" else (fast, slow)))
    assert timing.faster == faster and f"{faster} (every linear layer, timed now: 1 row" in timing.describe()
    monkeypatch.setattr(linear_mod, "time_linears", lambda model: (timing, {}))
    target = Target(tiny_model("qwen2", seed=0), tokenizer=None, aux_layers=(1, 2, 3))
    target.use_linear("auto")
    assert target.linear == faster and target.linear_timing is timing
    assert isinstance(target.model.lm_head, PackedLinear) == (faster == "onednn")
    monkeypatch.setattr(linear_mod, "onednn_supports", lambda dtype, device: False)  # bf16 on AVX2, say
    other = Target(tiny_model("qwen2", seed=0), tokenizer=None, aux_layers=(1, 2, 3))
    other.use_linear("auto")
    assert other.linear == "torch" and other.linear_timing is None  # nothing to time


def test_model_linear_config_is_validated_and_defaults_to_auto():
    assert validate(compose_cfg(TINY))[0].model.linear == "auto"
    assert validate(compose_cfg([*TINY, "model.linear=torch"]))[0].model.linear == "torch"
    with pytest.raises(ConfigError, match="model.linear must be one of auto, torch, onednn; got 'mkl'"):
        validate(compose_cfg([*TINY, "model.linear=mkl"]))


CASES = [(arch, seed) for arch in ("llama", "qwen2", "qwen3") for seed in range(4)]


@pytest.mark.parametrize("arch,seed", CASES)
def test_packed_target_and_drafter_are_lossless_against_unpacked_generate(arch, seed):
    rng = random.Random(seed * 7 + len(arch))
    reference = tiny_model(arch, seed=seed)  # torch's kernels, transformers' generate
    target = Target(tiny_model(arch, seed=seed), tokenizer=None, aux_layers=(1, 2, 3))
    target.use_linear("onednn")
    net = tiny_eagle3(target, rng.choice([None, 40]), seed=seed)
    pack_linears(net)
    drafter = Eagle3Drafter(net, target.model.get_input_embeddings(), depth=rng.randint(1, 7), top_k=rng.randint(1, 8))
    for budget in (1, rng.randint(2, 8), rng.randint(9, 64)):
        prompt = torch.tensor([rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 24))])
        new = rng.randint(8, 40)
        out = generate(target, Method(drafter, NoPruner(), NoRetriever(), graft_root, budget), prompt,
                       SamplingParams(), StopRule(max_new_tokens=new))
        assert out.tokens == hf_greedy(reference, prompt, new)
