"""The real embedded target, SmolLM2-135M-Instruct: lossless against transformers' generate, and the
minimal run.py contract end to end (any local target + EAGLE-3 checkpoint + question.jsonl file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft_lab.data import DATASETS
from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab.graft import graft_root
from graft_lab.models.embedded import embedded_dir
from graft_lab.models.linear import onednn_supports, pack_linears
from graft_lab.models.target import EMBEDDED, Target, load_model
from graft_lab.pruners import NoPruner
from graft_lab.retrievers import NoRetriever
from graft_lab.runner import chat_prompt
from graft_lab.verify import SamplingParams
from tiny import hf_greedy, tiny_eagle3, write_eagle3

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smollm2() -> Target:
    model, tok = load_model(EMBEDDED)
    return Target(model, tok)


@pytest.fixture(scope="module")
def prompts(smollm2):
    questions = DATASETS.build({"name": "mt_bench", "limit": 3})
    return [chat_prompt(smollm2, [{"role": "user", "content": q.turns[0]}]) for q in questions]


def test_embedded_target_shapes(smollm2):
    cfg = smollm2.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, smollm2.vocab_size) == (30, 576, 49152)
    assert smollm2.tokenizer.chat_template


@pytest.mark.parametrize("kind", ["ar", "eagle3_dense", "eagle3_chain"])
def test_smollm2_greedy_is_lossless(smollm2, prompts, kind):
    eos = (smollm2.tokenizer.eos_token_id,)
    if kind == "ar":
        method = Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, 1)
    else:
        net = tiny_eagle3(smollm2, draft_vocab=2048, seed=0)  # random but real-sized: exercises the d2t path
        top_k, budget = (10, 60) if kind == "eagle3_dense" else (1, 8)
        method = Method(Eagle3Drafter(net, smollm2.model.get_input_embeddings(), 7, top_k), NoPruner(), NoRetriever(),
                        graft_root, budget)
    for prompt in prompts:
        ref = hf_greedy(smollm2.model, prompt, 48, eos=eos[0])
        out = generate(smollm2, method, prompt, SamplingParams(), StopRule(48, eos))
        assert out.tokens == ref


@pytest.mark.skipif(not onednn_supports(torch.float32, torch.device("cpu")), reason="oneDNN cannot pack fp32 here")
def test_packed_linears_are_lossless_against_unpacked_generate(smollm2, prompts):
    """model.linear=onednn (what auto keeps where it times faster): the packed target and drafter against transformers'
    generate on the unpacked model, with a dense tree (many rows per verify) and AR."""
    packed = Target(*load_model(EMBEDDED))
    packed.use_linear("onednn")
    net = tiny_eagle3(packed, draft_vocab=2048, seed=0)
    pack_linears(net)
    eos = (packed.tokenizer.eos_token_id,)
    dense = Method(Eagle3Drafter(net, packed.model.get_input_embeddings(), 7, 10), NoPruner(), NoRetriever(), graft_root, 60)
    ar = Method(NoDrafter(), NoPruner(), NoRetriever(), graft_root, 1)
    for prompt in prompts:
        ref = hf_greedy(smollm2.model, prompt, 48, eos=eos[0])
        for method in (ar, dense):
            assert generate(packed, method, prompt, SamplingParams(), StopRule(48, eos)).tokens == ref


def test_run_py_contract(tmp_path, smollm2):
    """run.py with a local target dir, a local EAGLE-3 checkpoint and a question.jsonl file."""
    drafter_dir = write_eagle3(smollm2, tmp_path / "drafter", draft_vocab=1024)
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(r) for r in [
        {"question_id": 1, "category": "writing", "turns": ["Say hi.", "Now say bye."]},
        {"question_id": 2, "category": "math", "turns": ["What is 2+2?"]},
    ]) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "run.py"), "model=local", f"model.path={embedded_dir()}", "drafter=eagle3",
           f"drafter.path={drafter_dir}", "dataset=jsonl", f"dataset.path={questions}", "dataset.limit=2",
           "gen.max_new_tokens=12", "gen.temperature=0", f"output_dir={out}", "tree.total_tokens=16", "tree.top_k=4",
           "tree.depth=4", f"results_dir={tmp_path / 'results'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in rows] == [1, 2]
    choice = rows[0]["choices"][0]
    for key in ("turns", "new_tokens", "wall_time", "decoding_steps", "accept_lengths", "output_ids"):
        assert len(choice[key]) == 2, key
    assert all(len(ids) == n for ids, n in zip(choice["output_ids"], choice["new_tokens"]))
    assert rows[0]["model_id"] == "local" and rows[0]["category"] == "writing"
    summary = json.loads((out / "summary.json").read_text())
    for key in ("tau", "tokens_per_s", "baseline_tokens_per_s", "speedup"):
        assert isinstance(summary[key], float), key
    assert summary["matches_baseline"] is True and summary["complete"] is True
    assert summary["tau"] >= 1.0
