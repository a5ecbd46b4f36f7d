"""benchmarks/__main__.py (make bench): transformers' rows run in the same dtype as ours, and outside fp32 our tree
methods are audited against our AR instead of being required to match token for token."""

from __future__ import annotations

import json

import torch
import transformers

from benchmarks.__main__ import main

TINY_MODEL = "random:llama?seed=0&hidden=64&layers=4"


def test_bench_runs_transformers_in_our_dtype_and_audits_outside_fp32(tmp_path, monkeypatch, capsys):
    seen = []
    real = transformers.GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen.append(self.dtype)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", spy)
    out = tmp_path / "bench.json"
    main(["--model", TINY_MODEL, "--drafter", "", "--prompts", "1", "--max-new-tokens", "12", "--budget", "8",
          "--dtype", "bfloat16", "--device", "cpu", "--out", str(out)])
    rows = {r["method"]: r for r in json.loads(out.read_text())}
    assert seen and set(seen) == {torch.bfloat16}  # HF generate and HF prompt lookup, warm-up included
    assert {r["dtype"] for r in rows.values()} == {"bfloat16"}
    assert rows["graft-lab AR"]["identical"]  # both 1-token forwards: equal even in bf16
    audited = [r for r in rows.values() if r["audit"]]
    assert {r["method"] for r in audited} == {"pld K=8", "recycle K=8"}
    assert all(r["audit"]["unexplained_divergences"] == 0 for r in audited)
    assert "our AR equals HF AR, no unexplained divergence (bfloat16): PASS" in capsys.readouterr().out


def test_bench_has_the_default_run_row_and_it_is_lossless_in_fp32(tmp_path, monkeypatch, capsys):
    """With a drafter, `make bench` also runs what `make run` runs (the default method on tree=auto)."""
    from graft_lab.models.target import Target, load_model
    from graft_lab.presets import compose_run
    from test_eagle3_draft import write_eagle3

    monkeypatch.setenv("GRAFT_LAB_PROFILES", str(tmp_path / "profiles"))
    drafter = write_eagle3(Target(*load_model(TINY_MODEL)), tmp_path / "drafter")
    out = tmp_path / "bench.json"
    main(["--model", TINY_MODEL, "--drafter", str(drafter), "--prompts", "2", "--max-new-tokens", "16", "--budget", "8",
          "--device", "cpu", "--out", str(out)])
    rows = {r["method"]: r for r in json.loads(out.read_text())}
    default = f"default: {compose_run([]).method.name} tree=auto"
    assert list(rows)[3] == default and rows[default]["identical"] and rows[default]["tokens"] > 0
    text = capsys.readouterr().out
    assert default in text and "vs our AR" in text and "every output equals HF AR token for token: PASS" in text


def test_prefill_cost_times_ar_and_a_method_through_the_decode_loop(capsys):
    """benchmarks.prefill_cost: AR is 1.000x of itself, the method's prefill and its first draft are timed."""
    from benchmarks.prefill_cost import main as prefill_cost

    prefill_cost(["--methods", "graft_pool", "--lengths", "128", "--repeats", "1"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[1:2] in (["ar"], ["graft_pool"])]
    assert [r[1] for r in rows] == ["ar", "graft_pool"]
    ar, method = rows
    assert ar[3] == "1.000x" and ar[4] == "0"  # AR has no draft
    assert float(method[2]) > 0 and float(method[4]) > 0  # prefill ms, first draft ms (the drafter read the prompt)
