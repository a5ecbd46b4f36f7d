"""benchmarks/gpu_check.sh: its CPU mode end to end in a real process (tiny shapes, Triton's interpreter), the
one-line refusal of GPU mode without CUDA, and a failing step failing the run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest
import torch

from benchmarks import gpu_check
from graft_lab.profile import grid
from harness import ROOT

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_cpu_mode_end_to_end(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OUT": str(tmp_path / "from_env")}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--mode", "cpu", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (tmp_path / "from_env").exists()  # --out wins over $OUT
    summary = json.loads((tmp_path / "summary.json").read_text())
    plan = gpu_check.CPU
    assert summary["mode"] == "cpu" and summary["ok"] is True and summary["total_s"] > 0
    assert {"device_name", "torch", "transformers", "triton", "started", "budget_s", "within_budget"} <= set(summary)

    names = [s["name"] for s in summary["steps"]]
    assert names[0].startswith("kernel benchmark")
    for model in plan.models:
        assert f"init {model}" in names and all(f"profile {model} {b}" in names for b in gpu_check.BACKENDS)
    want = {"ok"} if HAS_TRITON else {"ok", "skipped"}
    assert {s["status"] for s in summary["steps"]} <= want and all(s["elapsed_s"] >= 0 for s in summary["steps"])
    for step in summary["steps"]:
        if step["status"] == "skipped":
            assert "triton" in step["detail"]  # only the Triton steps may be skipped, and they say why
        assert f"=== {step['name']}: {step['status']} in " in proc.stdout  # per-step elapsed time printed

    if HAS_TRITON:  # the kernel agrees with SDPA on every shape it ran (bf16)
        rows = summary["kernel"]["rows"]
        assert [(r["prefix"], r["nodes"]) for r in rows] == [(p, n) for p in plan.kernel_prefixes
                                                             for n in plan.kernel_nodes]
        assert all(r["max_abs_diff"] < 3e-2 and r["tree_us"] > 0 and r["sdpa_us"] > 0 for r in rows)

    profiles = summary["profiles"]
    assert [(p["model"], p["backend"]) for p in profiles] == [(m, b) for m in plan.models for b in gpu_check.BACKENDS]
    measured = [p for p in profiles if p["status"] == "ok"]
    assert len(measured) == (4 if HAS_TRITON else 2)
    for p in measured:
        assert p["sizes"] == grid(plan.cap) and p["prefixes"] == list(plan.prefixes) and p["repeats"] >= 1
        t = p["verify_ms"]
        assert len(t) == len(plan.prefixes) and all(len(row) == len(p["sizes"]) and min(row) > 0 for row in t)
        env = p["envelope_ms"]  # the lower envelope: never above the curve, never falling with N
        assert all(e <= v + 1e-9 for er, vr in zip(env, t) for e, v in zip(er, vr))
        assert all(a <= b + 1e-9 for row in env for a, b in zip(row, row[1:]))
        assert p["key"]["attn"] == p["backend"] and p["key"]["dtype"] == "bfloat16" and p["key"]["device"] == "cpu"
        assert p["dtype"] == "bfloat16" and p["params"] > 0

    rows = summary["comparison"]
    assert len(rows) == (len(plan.models) * len(plan.prefixes) * len(grid(plan.cap)) if HAS_TRITON else 0)
    assert all(r["sdpa_over_triton"] == pytest.approx(r["sdpa_ms"] / r["triton_ms"]) for r in rows)

    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("# gpu_check (cpu mode)") and "| profile llama-tiny sdpa | ok |" in md
    if HAS_TRITON:
        assert "## Tree-attention kernel vs SDPA" in md and "## Verify cost t(N), ms: SDPA against Triton" in md
        assert md.count("| qwen3-tiny |") == len(plan.prefixes) * len(grid(plan.cap))


def test_gpu_mode_without_cuda_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--mode", "gpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: error: --mode gpu needs CUDA") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_failing_step_is_recorded_and_fails_the_run(tmp_path, monkeypatch):
    def broken(plan):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(gpu_check, "kernel_step", broken)
    monkeypatch.setattr(gpu_check, "CPU", gpu_check.Plan(**{**vars(gpu_check.CPU), "models": {}}))
    assert gpu_check.main(["--mode", "cpu", "--out", str(tmp_path)]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] is False and summary["kernel"] is None
    assert [(s["name"], s["status"], s["detail"]) for s in summary["steps"]] == [
        ("kernel benchmark (tree attention vs SDPA)", "failed", "RuntimeError: kernel exploded")]
    assert "| failed |" in (tmp_path / "summary.md").read_text()


def test_the_gpu_plan_has_the_issues_shapes():
    """Llama-3.1-8B and Qwen3-8B shapes, bf16, prefixes 1k and 4k, cap 64; issue 6's kernel grid."""
    from graft_lab.models.random_model import RandomSpec

    plan = gpu_check.GPU
    assert plan.dtype == torch.bfloat16 and plan.prefixes == (1024, 4096) and plan.cap == 64
    assert plan.kernel_prefixes == (1024, 4096, 16384, 65536) and plan.kernel_nodes == (16, 32, 60)
    llama = RandomSpec.parse(plan.models["llama-3.1-8b"]).config()
    qwen = RandomSpec.parse(plan.models["qwen3-8b"]).config()
    fields = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size")
    assert [getattr(llama, f) for f in fields] == ["llama", 4096, 32, 32, 8, 128, 14336, 128256]
    assert [getattr(qwen, f) for f in fields] == ["qwen3", 4096, 36, 32, 8, 128, 12288, 151936]
    with torch.device("meta"):  # the parameter count, without allocating 8B weights
        from transformers import AutoModelForCausalLM

        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(llama).parameters())
    assert 8.0e9 < n < 8.1e9  # Llama-3.1-8B: 8.03B
