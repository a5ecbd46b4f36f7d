"""Every config option composes and validates on CPU; every bad input fails before any model loads, with
exit code 2, one line naming the field, and no result files; missing weights are all named at once."""

from __future__ import annotations

import time

import pytest
import torch
from omegaconf import OmegaConf

from harness import CONF, TINY, compose_cfg, run_py, run_py_subprocess, sweep_points, written
from graft_lab.config import validate
from graft_lab.errors import ModelLoadError
from graft_lab.models.random_model import RandomSpec
from graft_lab.models.target import load_model

# every group in config.yaml's defaults list (experiment, debug, local included), not Hydra's own
RUN_GROUPS = sorted(g for g in compose_cfg([], hydra_config=True).hydra.runtime.choices if not g.startswith("hydra/"))
# values a few options leave as ??? (the user must give them)
REQUIRED = {"model=local": ["model.path=models/any"], "dataset=spec_bench": ["dataset.path=q.jsonl"],
            "dataset=jsonl": ["dataset.path=q.jsonl"], "pruner=cost": ["tree=auto"]}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def overrides_for(group: str, option: str) -> list[str]:
    base = [f"{group}={option}"] + REQUIRED.get(f"{group}={option}", [])
    # a model without a known EAGLE-3 checkpoint needs another drafter than the default
    if group == "model" and OmegaConf.load(CONF / "model" / f"{option}.yaml").get("eagle3_drafter") is None:
        base.append("method=ar")
    if (group, option) == ("drafter", "none"):
        base.append("pruner=none")  # the default method's pruner prunes a draft
    return base


def test_groups_found():
    assert {"model", "drafter", "pruner", "retriever", "graft", "tree", "dataset", "logger", "experiment", "debug"} <= set(RUN_GROUPS)


@pytest.mark.parametrize("group,option", [(g, o) for g in RUN_GROUPS if g != "experiment" for o in options(g)])
def test_every_option_composes_and_validates(group, option):
    cfg = compose_cfg(overrides_for(group, option))
    run, opts = validate(cfg)
    if group in opts:
        assert cfg[group]["name"] == OmegaConf.load(CONF / group / f"{option}.yaml")["name"]


@pytest.mark.parametrize("preset", options("experiment"))
def test_every_experiment_preset_and_sweep_point_validates(preset):
    for point in sweep_points(preset):
        validate(compose_cfg([f"experiment={preset}", *point]))


@pytest.mark.parametrize("launcher,target", [
    ("basic", "BasicLauncher"), ("joblib", "JoblibLauncher"), ("submitit_slurm", "SlurmLauncher")])
def test_launchers_compose(launcher, target):
    cfg = compose_cfg([f"hydra/launcher={launcher}", "experiment=pareto_sweep"], hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    validate(compose_cfg([f"hydra/launcher={launcher}", "experiment=pareto_sweep"]))


def test_logger_options():
    cfg = compose_cfg(["logger=wandb", "results_dir=out/x", "experiment_name=e1", "tags=[a,b]"])
    opts = validate(cfg)[1]["logger"]
    assert (opts.mode, opts.dir, opts.group, opts.tags) == ("offline", "out/x", "e1", ["a", "b"])
    assert validate(compose_cfg(["logger=wandb", "logger.mode=online"]))[1]["logger"].mode == "online"


BAD = [
    (["tree.total_tokens=-1"], "tree.total_tokens"),
    (["tree.foo=1"], "tree.foo"),
    (["+tree.foo=1"], "tree.foo"),
    (["+bogus=1"], "bogus"),
    (["model=nonexistent"], "model/nonexistent"),
    (["pruner=dyn_depth", "pruner.thresholds=[1.5,0.3,0.1]"], "pruner.thresholds"),
    (["pruner=dyn_depth", "pruner.thresholds=[0.5,-0.1,0.1]"], "pruner.thresholds"),
    (["model=tiny_random", "method=ar", "tree.top_k=50000"], "tree.top_k"),
    (["model=tiny_random", "method=ar", "gen.top_k=60000"], "gen.top_k"),
    (["gen.top_p=0"], "gen.top_p"),
    (["gen.max_new_tokens=0"], "gen.max_new_tokens"),
    (["dataset.limit=0"], "dataset.limit"),
    (["retriever=ngram", "retriever.n_min=9"], "n_min"),
    (["logger=wandb", "logger.mode=sometimes"], "logger.mode"),
    (["verify.attn=flash"], "verify.attn"),
    (["model=tiny_random", "method=ar", "model.max_context=100000"], "model.max_context"),
]


@pytest.mark.parametrize("args,field", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_fails_cleanly_before_loading(args, field, tmp_path, monkeypatch):
    loads = []
    monkeypatch.setattr("graft_lab.runner.load_model", lambda *a, **k: loads.append(a))
    code, out, err = run_py(args, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("graft-lab: error:") and field in lines[0], err
    assert "Traceback" not in err and not loads and not written(tmp_path)


def test_missing_weights_are_named_with_how_to_get_them(tmp_path, monkeypatch):
    """Offline (tests set HF_HUB_OFFLINE): a hub target and its drafter, both missing, in one message."""
    loads = []
    monkeypatch.setattr("graft_lab.runner.load_model", lambda *a, **k: loads.append(a))
    t0 = time.perf_counter()
    code, _, err = run_py(["model=qwen3_8b", "pruner=dyn_depth", "retriever=ngram"], tmp_path)
    assert code == 2 and time.perf_counter() - t0 < 60 and not loads and not written(tmp_path)
    for needle in ("Qwen/Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3", "hf download", "model.path=", "drafter.path="):
        assert needle in err, err


def test_missing_shipped_drafter_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr("graft_lab.drafters.eagle3_checkpoint.ASSETS", tmp_path / "no-assets")
    code, _, err = run_py(["dataset.limit=1"], tmp_path)
    assert code == 2 and "builtin:smollm2-135m-instruct-eagle3" in err and not written(tmp_path)


def test_cli_contract_in_a_real_process(tmp_path):
    proc = run_py_subprocess(["tree.total_tokens=-5"], tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "graft-lab: error: tree.total_tokens must be >= 1, got -5"
    assert not written(tmp_path)


def test_random_model_is_seeded_and_tiny():
    a, tok = load_model("random:llama?seed=3&hidden=32&layers=4")
    b, _ = load_model("random:llama?seed=3&hidden=32&layers=4")
    c, _ = load_model("random:llama?seed=4&hidden=32&layers=4")
    wa, wb, wc = (m.get_output_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.config.vocab_size == len(tok) == 49152 and a.config.hidden_size == 32
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")
    with pytest.raises(ModelLoadError, match="unknown option 'width'"):
        RandomSpec.parse("random:llama?width=3")
    spec = RandomSpec.parse("random:qwen3?hidden=64&heads=4&head_dim=32&intermediate=96&vocab=300")
    cfg = spec.config()  # no tokenizer needed when vocab is given
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (32, 96, 300)
    with pytest.raises(ModelLoadError, match="needs vocab"):
        RandomSpec.parse("random:llama").config()


def test_tiny_overrides_validate():
    validate(compose_cfg(TINY))
