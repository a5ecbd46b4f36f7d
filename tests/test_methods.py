"""Methods as presets: every conf/method option sets its parts, every tree preset follows tree_shape(K), every
experiment preset resolves to what its own comment says, and impossible combinations fail naming the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from graft_lab.config import method_label, validate
from graft_lab.data.base import load_questions
from graft_lab.errors import ConfigError
from graft_lab.presets import CONF, method_names, preset
from graft_lab.tree import CHAIN, tree_shape
from harness import compose_cfg, sweep_points

PARTS = ("drafter", "pruner", "retriever", "graft")
EXPECTED = {  # the definitions: drafter, pruner, retriever, graft mode
    "ar": ("none", "none", "none", "root"),
    "pld": ("none", "none", "ngram", "root"),
    "recycle": ("none", "none", "recycle", "root"),
    "sam": ("none", "none", "sam", "root"),
    "eagle3_chain": ("eagle3", "none", "none", "root"),
    "eagle3_dense": ("eagle3", "none", "none", "root"),
    "dyn_depth": ("eagle3", "dyn_depth", "none", "root"),
    "graft_root": ("eagle3", "dyn_depth", "recycle", "root"),
    "graft_tail": ("eagle3", "dyn_depth", "recycle", "tail"),
    "graft_match": ("eagle3", "dyn_depth", "recycle", "match"),
    "graft": ("eagle3", "dyn_depth", "recycle", "root"),
    "graft_pool": ("eagle3", "dyn_depth", "pool", "root"),  # ngram + recycle + sam, weighed per source (tree=auto)
}


def resolved(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_cfg(overrides), resolve=True)


def test_every_method_is_a_preset():
    assert sorted(EXPECTED) == method_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_method_preset_sets_every_part(name):
    cfg = resolved([f"method={name}"])
    assert tuple(cfg[g]["name"] for g in PARTS) == EXPECTED[name]
    assert cfg["method"]["name"] == name and method_label(cfg) == name
    assert cfg["method"]["parts"] == dict(zip(PARTS, EXPECTED[name]))  # the label's reference is the preset itself
    run, _ = validate(compose_cfg([f"method={name}"]))
    if name == "ar":
        assert run.tree.total_tokens == 1
    if name == "eagle3_chain":
        assert (run.tree.total_tokens, run.tree.depth, run.tree.top_k) == (CHAIN.total_tokens, CHAIN.depth, CHAIN.top_k)
    if name == "graft_pool":
        assert run.tree.plan == "auto" and cfg["retriever"]["sources"] == ["ngram", "recycle", "sam"]
        assert validate(compose_cfg([f"method={name}", "tree=k16"]))[0].tree.plan == "fixed"  # a fixed K still works
    if EXPECTED[name][0] == "eagle3":
        assert (cfg["drafter"]["depth"], cfg["drafter"]["top_k"]) == (run.tree.depth, run.tree.top_k)


def test_default_run_is_graft_with_the_retriever_pool_and_tree_auto():
    cfg = resolved([])
    assert cfg["method"]["name"] == "graft_pool" and tuple(cfg[g]["name"] for g in PARTS) == EXPECTED["graft_pool"]
    assert cfg["tree"]["plan"] == "auto" and cfg["retriever"]["sources"] == ["ngram", "recycle", "sam"]


@pytest.mark.parametrize("path", sorted((CONF / "tree").glob("k*.yaml")), ids=lambda p: p.stem)
def test_tree_presets_follow_tree_shape(path):
    node = OmegaConf.load(path)
    k = int(path.stem[1:])
    assert (node.total_tokens, node.depth, node.top_k) == (k, tree_shape(k).depth, tree_shape(k).top_k)


def test_tree_shape_rule():
    assert tree_shape(60) == type(CHAIN)(60, 7, 10)  # the paper's tree
    assert tree_shape(1).total_tokens == 1 and tree_shape(3).depth == 2
    for k in range(1, 200):
        s = tree_shape(k)
        assert 1 <= s.depth <= 7 and 1 <= s.top_k <= 10 and s.depth <= max(1, k - 1)
    with pytest.raises(ValueError):
        tree_shape(0)


def test_graft_ablation_resolves_to_k60_and_the_three_modes():
    points = sweep_points("graft_ablation")
    modes = set()
    for point in points:
        cfg = resolved(["experiment=graft_ablation", *point])
        assert (cfg["tree"]["total_tokens"], cfg["tree"]["depth"], cfg["tree"]["top_k"]) == (60, 7, 10)
        assert (cfg["drafter"]["depth"], cfg["drafter"]["top_k"]) == (7, 10)
        assert cfg["pruner"]["name"] == "dyn_depth" and cfg["retriever"]["name"] == "recycle"
        modes.add(cfg["graft"]["name"])
    assert modes == {"root", "tail", "match"}


def test_budget_split_resolves_to_k60_graft_and_the_papers_split():
    points = sweep_points("budget_split")
    splits = []
    for point in points:
        cfg = resolved(["experiment=budget_split", *point])
        assert cfg["method"]["name"] == "graft" and cfg["tree"]["total_tokens"] == 60
        run, opts = validate(compose_cfg(["experiment=budget_split", *point]))
        splits.append([round(f * 60) for f in opts["pruner"].draft_split[:3]])
    assert [8, 24, 40] in splits  # the paper's 8/52, 24/36, 40/20 (draft nodes incl. the root)
    assert len(splits) == 3 and all(s[0] >= 4 for s in splits)  # no split rounds to a 1-node draft


def test_pareto_sweep_resolves_to_the_methods_at_k16_32_60():
    points = sweep_points("pareto_sweep")
    seen = set()
    for point in points:
        cfg = resolved(["experiment=pareto_sweep", *point])
        k = cfg["tree"]["total_tokens"]
        assert (cfg["tree"]["depth"], cfg["tree"]["top_k"]) == (tree_shape(k).depth, tree_shape(k).top_k)
        seen.add((cfg["method"]["name"], k))
    names = {"eagle3_dense", "dyn_depth", "recycle", "graft_root", "graft_tail", "graft_match"}
    assert seen == {(m, k) for m in names for k in (16, 32, 60)}


@pytest.mark.parametrize("experiment", ["pareto_sweep", "graft_ablation", "budget_split"])
def test_mt_bench_presets_take_the_first_question_of_each_category(experiment):
    """'8 MT-Bench questions (the first of each category)', as the presets say: not the first 8, all writing."""
    picked = load_questions(compose_cfg([f"experiment={experiment}"]).dataset)
    first: dict[str, int] = {}
    for q in load_questions(compose_cfg(["dataset.limit=null"]).dataset):
        first.setdefault(q.category, q.question_id)
    assert len(first) == 8 and sorted(q.question_id for q in picked) == sorted(first.values())


@pytest.mark.parametrize("experiment", ["paper_short", "paper_long"])
def test_paper_presets_run_graft_at_k60(experiment):
    cfg = resolved([f"experiment={experiment}"])
    assert cfg["method"]["name"] == "graft" and method_label(cfg) == "graft"
    assert (cfg["tree"]["total_tokens"], cfg["drafter"]["depth"], cfg["drafter"]["top_k"]) == (60, 7, 10)


def test_an_overridden_part_is_in_the_label():
    cfg = resolved(["method=graft", "retriever=ngram"])
    assert method_label(cfg) == "graft[retriever=ngram]"


@pytest.mark.parametrize("overrides,needle", [
    (["drafter=none"], "pruner=dyn_depth prunes a draft, but drafter=none"),
    (["method=pld", "pruner=dyn_depth"], "add drafter=eagle3"),
    (["method=eagle3_dense", "graft=tail"], "retriever=none"),
    (["method=pld", "graft=match"], "drafter=none: use graft=root"),
    (["model=tiny_random"], "use method=ar"),
])
def test_invalid_combinations_name_the_fix(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        validate(compose_cfg(overrides))


def test_preset_helper_rejects_unknown_names():
    with pytest.raises(ConfigError, match="valid names: ar, dyn_depth"):
        preset("nope")
    run, _ = preset("eagle3_dense", 16)
    assert (run.tree.total_tokens, run.tree.depth, run.tree.top_k) == (16, 7, 3)


@pytest.mark.parametrize("experiment", ["paper_short", "paper_long", "pareto_sweep", "graft_ablation", "budget_split"])
def test_experiment_presets_label_their_runs(experiment):
    """A preset's own keys win over config.yaml's (its `_self_` comes first), so its rows carry its name."""
    assert resolved([f"experiment={experiment}"])["experiment_name"] == experiment
    assert resolved(["debug=quick"])["experiment_name"] == "debug"
