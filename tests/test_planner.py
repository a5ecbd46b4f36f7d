"""tree=auto: the acceptance model, the planner's choice of N on faked cost profiles (deterministic), the
cost-aware pruner, and the contract: whatever the planner keeps, the output is the target's own greedy
output (tiny random targets against transformers' generate)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from graft_lab.acceptance import AcceptanceModel, NodeArrays
from graft_lab.config import validate
from graft_lab.decode import Method, StopRule, generate
from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab.errors import ConfigError
from graft_lab.graft import GRAFTS
from graft_lab.planner import CostPlanner, FixedPlanner, Plan
from graft_lab.profile import CostProfile, grid
from graft_lab.pruners import PRUNERS
from graft_lab.retrievers import RETRIEVERS
from graft_lab.tree import DraftTree, Source, retrieved_by
from graft_lab.verify import SamplingParams
from harness import compose_cfg
from tiny import hf_greedy, repetitive_prompt, shared_tiny_target, tiny_eagle3

MS = 1e-3


def fake_profile(cost, cap: int, level_s: float = 0.2 * MS) -> CostProfile:
    """A profile whose verify cost is cost(N) seconds at every prefix (one measured prefix)."""
    sizes = grid(cap)
    return CostProfile({"fake": True}, sizes, [128], [[cost(n) for n in sizes]], draft_base_s=0.5 * MS,
                       draft_level_s=level_s)


def tree_of(parents: list[int], conds: list[float], sources: list[Source] | None = None) -> DraftTree:
    """Node i hangs under parents[i] with conditional (draft or retrieval) probability conds[i]; node 0 is
    the root. Scores are cumulative log-probabilities, as drafters and retrievers give them."""
    n = len(parents)
    score, depth = [0.0] * n, [0] * n
    for i in range(1, n):
        score[i] = score[parents[i]] + math.log(conds[i])
        depth[i] = depth[parents[i]] + 1
    src = sources or [Source.ROOT] + [Source.DRAFT] * (n - 1)
    return DraftTree(torch.arange(n) + 3, torch.tensor(parents), torch.tensor(depth), torch.tensor(score),
                     torch.tensor([int(s) for s in src], dtype=torch.int8))


def chain(conds: list[float]) -> DraftTree:
    return tree_of(list(range(-1, len(conds))), [1.0, *conds])


def planner(cost, cap: int = 16, **kw) -> CostPlanner:
    return CostPlanner(fake_profile(cost, cap, **kw), AcceptanceModel(), cap)


def random_tree(rng: random.Random, n: int) -> DraftTree:
    parents, conds, sources = [-1], [1.0], [Source.ROOT]
    for i in range(1, n):
        parents.append(rng.randrange(i))
        conds.append(rng.uniform(0.01, 1.0))
        sources.append(rng.choice([Source.DRAFT, Source.RETRIEVED]))
    return tree_of(parents, conds, sources)


# ---- the acceptance model -------------------------------------------------------------------------
def test_priors_follow_the_draft_probability_and_the_retrieval_rank():
    model = AcceptanceModel()
    tree = tree_of([-1, 0, 0, 0, 0], [1.0, 0.95, 0.05, 0.5, 0.2],
                   [Source.ROOT, Source.DRAFT, Source.DRAFT, Source.RETRIEVED, Source.RETRIEVED])
    cond = model.conditional(tree)
    assert cond[0] == 1.0
    assert cond[1] == pytest.approx(0.95) and cond[2] == pytest.approx(0.05)  # the bucket's middle
    assert cond[3] == pytest.approx(0.3) and cond[4] == pytest.approx(0.15)  # retrieved rank 0, rank 1


def test_path_probability_is_the_product_and_never_rises_along_a_path():
    model = AcceptanceModel()
    tree = chain([0.95, 0.95, 0.55])
    p = model.path_probs(tree)
    assert p.tolist() == pytest.approx([1.0, 0.95, 0.95 ** 2, 0.95 ** 2 * 0.55])
    assert model.expected_tokens(tree) == pytest.approx(1 + float(p[1:].sum()))
    rng = random.Random(0)
    for _ in range(20):
        t = random_tree(rng, rng.randint(2, 40))
        q = model.path_probs(t)
        assert (q[1:] <= q[t.parents[1:].numpy()]).all()


def test_observing_acceptance_calibrates_each_cell():
    model = AcceptanceModel()
    tree = tree_of([-1, 0, 0, 1], [1.0, 0.55, 0.55, 0.55],
                   [Source.ROOT, Source.DRAFT, Source.RETRIEVED, Source.DRAFT])
    before = model.conditional(tree)
    nodes = NodeArrays.of(tree)
    for _ in range(50):  # the draft chain is always accepted, the retrieved sibling never
        model.observe(nodes, np.array([0, 1, 3]), model.predict(nodes))
    after = model.conditional(tree)
    assert after[1] > 0.9 and after[3] > 0.9 and after[1] > before[1]
    assert after[2] < before[2] and after[2] < 0.05
    rel = model.reliability()
    assert sum(r[2] for r in rel) == 150 and all(0 <= r[0] <= 1 and 0 <= r[1] <= 1 for r in rel)
    # a node whose parent was rejected was never tried: it teaches nothing
    fresh = AcceptanceModel()
    fresh.observe(nodes, np.array([0, 2]), fresh.predict(nodes))
    assert fresh.conditional(tree)[3] == pytest.approx(before[3])


def old_cells(nodes: NodeArrays) -> np.ndarray:
    """The acceptance model's cells before retrievers were told apart (one retriever per method), kept
    as the reference: a single-retriever method must predict exactly as it did."""
    from graft_lab.acceptance import BUCKETS, DEPTHS, RANKS

    parents = np.maximum(nodes.parents, 0)
    depth = np.clip(nodes.depth, 1, DEPTHS) - 1
    cond = np.exp(np.minimum(nodes.score - nodes.score[parents], 0.0))
    draft_cell = depth * BUCKETS + np.minimum((cond * BUCKETS).astype(np.int64), BUCKETS - 1)
    group = parents * 2 + nodes.retrieved
    order = np.lexsort((-nodes.score, group))
    g = group[order]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - np.searchsorted(g, g)
    return np.where(nodes.retrieved, DEPTHS * BUCKETS + depth * RANKS + np.minimum(rank, RANKS - 1), draft_cell)


def test_one_retriever_keeps_its_cells_and_predictions():
    rng = random.Random(3)
    model, trained = AcceptanceModel(), AcceptanceModel()
    cells = len(trained.rates)
    for _ in range(30):
        t = random_tree(rng, rng.randint(2, 40))
        nodes = NodeArrays.of(t)
        assert np.array_equal(model.cells(nodes)[1:], old_cells(nodes)[1:])
        trained.observe(nodes, np.array([0]), trained.predict(nodes))
    assert len(trained.rates) == cells == len(model.rates)  # no cells added for other sources


def test_each_retriever_of_a_pool_is_calibrated_apart():
    """Source 0 is always accepted, source 1 never, at the same depth and rank: the model separates them
    (keyed by depth and rank alone, they would share one cell and both predict about a half)."""
    model = AcceptanceModel()
    ngram = tree_of([-1, 0, 1], [1.0, 0.5, 0.5], [Source.ROOT, retrieved_by(0), retrieved_by(0)])
    sam = tree_of([-1, 0, 1], [1.0, 0.5, 0.5], [Source.ROOT, retrieved_by(1), retrieved_by(1)])
    assert model.conditional(ngram).tolist() == pytest.approx(model.conditional(sam).tolist())  # the same prior
    for _ in range(60):
        for tree, path in ((ngram, [0, 1, 2]), (sam, [0])):
            nodes = NodeArrays.of(tree)
            model.observe(nodes, np.array(path), model.predict(nodes))
    assert model.retrievers == 2
    assert (model.conditional(ngram)[1:] > 0.9).all() and model.conditional(sam)[1] < 0.1
    assert model.conditional(sam)[2] == pytest.approx(0.3)  # never tried (its parent always failed): the prior
    # in one tree the sources are siblings, each at rank 0 of its own: the ngram chain is expected, sam's not
    both = tree_of([-1, 0, 1, 0, 3], [1.0, 0.5, 0.5, 0.5, 0.5],
                   [Source.ROOT, retrieved_by(0), retrieved_by(0), retrieved_by(1), retrieved_by(1)])
    p = model.path_probs(both)
    assert p[1] > 0.9 and p[2] > 0.8 and p[3] < 0.1 and p[4] < 0.01
    # the planner spends a tight budget on the source that has been right
    plan = CostPlanner(fake_profile(lambda n: 10 * MS * (1 + 0.5 * (n - 1)), 8), model, 8).plan(both, 100, 0.0)
    assert plan.tree.size == 3 and plan.tree.source.tolist() == [0, retrieved_by(0), retrieved_by(0)]


# ---- the planner's choice on faked profiles -------------------------------------------------------
def test_ar_wins_when_a_step_costs_n_times_an_ar_step():
    p = planner(lambda n: 10 * MS * n)
    plan = p.plan(chain([0.95] * 10), prefix=100, spent=0.0)
    assert plan.tree.size == 1 and plan.expected_tokens == 1.0 and plan.verify_ratio == 1.0


def test_flat_to_eight_then_steep_verifies_eight():
    p = planner(lambda n: 10 * MS if n <= 8 else 10 * MS + 5 * MS * (n - 8))
    tree = chain([0.95] * 12)
    plan = p.plan(tree, prefix=100, spent=0.0)
    assert plan.tree.size == 8
    assert torch.equal(plan.tree.tokens, tree.tokens[:8])
    assert plan.expected_tokens == pytest.approx(sum(0.95 ** k for k in range(8)))
    assert plan.expected_time == pytest.approx(10 * MS) and plan.verify_ratio == pytest.approx(1.0)
    # the same tree with weak candidates: nothing beyond the root pays even on a flat curve
    weak = p.plan(chain([0.05] * 12), prefix=100, spent=0.0)
    assert weak.tree.size == 8  # flat: extra nodes are free, so it fills up to the cheapest size
    steep = planner(lambda n: 10 * MS * (1 + 0.5 * (n - 1))).plan(chain([0.05] * 12), prefix=100, spent=0.0)
    assert steep.tree.size == 1


def test_the_choice_fills_up_to_the_cheapest_size():
    """The issue's CPU: 3 nodes cost more than 4. The planner never verifies 3."""
    costs = {1: 10.0, 2: 10.0, 3: 100.0, 4: 10.5, 6: 200.0}
    p = planner(lambda n: costs[n] * MS, cap=6)
    plan = p.plan(chain([0.95] * 5), prefix=100, spent=0.0)
    assert plan.tree.size == 4
    rng = random.Random(1)
    for _ in range(30):  # random curves and trees: the chosen N is never beaten by a bigger, cheaper size
        table = {n: rng.uniform(5, 50) for n in grid(24)}
        p = planner(lambda n: table[n] * MS, cap=24)
        tree = random_tree(rng, rng.randint(1, 24))
        plan = p.plan(tree, prefix=rng.randint(0, 500), spent=rng.uniform(0, 10) * MS)
        curve = p.profile.curve(0)[: tree.size]
        n = plan.tree.size
        assert curve[n - 1] <= curve[n - 1 :].min() + 1e-12


def test_the_kept_nodes_are_the_ancestor_closed_top_n_by_path_probability():
    rng = random.Random(2)
    for _ in range(40):
        table = {n: rng.uniform(5, 20) * n ** rng.uniform(0, 1) for n in grid(32)}
        p = planner(lambda n: table[n] * MS, cap=32)
        tree = random_tree(rng, rng.randint(1, 60))
        plan = p.plan(tree, prefix=100, spent=rng.uniform(0, 5) * MS)
        plan.tree.check()
        assert plan.tree.size <= 32
        full = p.acceptance.path_probs(tree)
        kept = plan.prediction.probs
        assert plan.expected_tokens == pytest.approx(1 + float(kept[1:].sum()))
        assert kept == pytest.approx(p.acceptance.path_probs(plan.tree))  # the same prediction on the kept tree
        if plan.tree.size < tree.size:  # nothing left out is likelier than what was kept
            assert kept.min() >= np.sort(full)[::-1][plan.tree.size]


def test_time_spent_drafting_favours_bigger_trees():
    """Sunk cost counts in the step's time: the more a step has already spent, the more a bigger tree pays."""
    p = planner(lambda n: 10 * MS * (1 + 0.2 * (n - 1)))
    tree = chain([0.55] * 10)
    sizes = [p.plan(tree, prefix=100, spent=s * MS).tree.size for s in (0, 20, 200)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_observe_refines_the_profile_and_the_overhead():
    p = planner(lambda n: 10 * MS)
    tree = chain([0.95] * 4)
    plan = p.plan(tree, prefix=100, spent=0.0)
    for _ in range(150):
        p.observe(plan, torch.tensor([0, 1]), {"draft": 1 * MS, "verify": 20 * MS, "accept": 2 * MS, "update": 1 * MS})
    assert p.profile.verify_time(plan.tree.size, 100) == pytest.approx(20 * MS, rel=0.05)
    assert p.rest_s == pytest.approx(3 * MS, rel=0.05)
    assert p.seconds_per_token == pytest.approx(12 * MS, rel=0.05)


def test_a_fixed_tree_is_verified_as_it_is():
    tree = chain([0.5] * 3)
    plan = FixedPlanner().plan(tree, prefix=5, spent=1.0)
    assert plan.tree is tree and plan.expected_tokens is None and plan.prediction is None


# ---- the cost-aware pruner ------------------------------------------------------------------------
def test_cost_pruner_drafts_while_the_next_level_pays():
    cheap = PRUNERS.build({"name": "cost"}, planner=planner(lambda n: 10 * MS, level_s=0.01 * MS))
    dear = PRUNERS.build({"name": "cost"}, planner=planner(lambda n: 10 * MS, level_s=50 * MS))
    assert cheap.keep_drafting(0, math.log(0.9)) and not dear.keep_drafting(0, math.log(0.9))
    mid = planner(lambda n: 10 * MS, level_s=2 * MS)
    gains = [mid.acceptance.next_level_gain(2, math.log(c)) for c in (0.001, 0.1, 0.5, 0.99)]
    assert gains == sorted(gains) and gains[-1] > 0.5 and gains[0] < 0.01
    confident = PRUNERS.build({"name": "cost"}, planner=mid)
    assert confident.keep_drafting(2, math.log(0.9)) and not confident.keep_drafting(2, math.log(0.001))
    assert confident.draft_budget(40, 3) == 40  # the planner cuts, not the pruner


def test_cost_pruner_needs_tree_auto():
    with pytest.raises(ConfigError, match="tree=auto"):
        PRUNERS.build({"name": "cost"}, planner=FixedPlanner())
    with pytest.raises(ConfigError, match="tree=auto"):
        validate(compose_cfg(["pruner=cost", "tree=k16"]))
    run, opts = validate(compose_cfg(["pruner=cost", "tree=auto"]))
    assert run.tree.plan == "auto" and opts["pruner"].margin == 1.0
    with pytest.raises(ConfigError, match="tree.plan"):
        validate(compose_cfg(["tree=auto", "tree.plan=sometimes"]))


# ---- the contract: the choice of tree never changes the output -------------------------------------
ARCHS = ("llama", "qwen2", "qwen3")
CURVES = {
    "ar_cheap": lambda n: 10 * MS * n,
    "flat_to_8": lambda n: 10 * MS if n <= 8 else 10 * MS * (1 + 0.3 * (n - 8)),
    "dip": lambda n: {1: 10, 2: 14, 3: 30, 4: 15, 6: 16}.get(n, 16 + n) * MS,
    "flat": lambda n: 10 * MS,
}




target_for = shared_tiny_target
pytestmark = pytest.mark.usefixtures("one_thread")


class CheckedPlanner:
    """Wraps a planner: every plan is a valid tree within the cap, ancestor-closed inside the grafted one."""

    def __init__(self, inner: CostPlanner, cap: int):
        self.inner, self.cap, self.sizes = inner, cap, []

    def plan(self, tree: DraftTree, prefix: int, spent: float) -> Plan:
        plan = self.inner.plan(tree, prefix, spent)
        plan.tree.check()
        assert plan.tree.size <= self.cap and int(plan.tree.tokens[0]) == int(tree.tokens[0])
        self.sizes.append(plan.tree.size)
        return plan

    def observe(self, plan, path, times) -> None:
        self.inner.observe(plan, path, times)

    def next_level_pays(self, level, best_score, margin=1.0) -> bool:
        return self.inner.next_level_pays(level, best_score, margin)




CASES = [(arch, curve, seed) for arch in ARCHS for curve in CURVES for seed in range(2)]


@pytest.mark.parametrize("arch,curve,seed", CASES)
def test_tree_auto_is_lossless(arch, curve, seed):
    rng = random.Random(CASES.index((arch, curve, seed)))
    target = target_for(arch)
    cap = rng.choice([4, 8, 16, 40])
    inner = CostPlanner(fake_profile(CURVES[curve], cap, level_s=rng.choice([0.01, 1.0, 10.0]) * MS),
                        AcceptanceModel(), cap)
    checked = CheckedPlanner(inner, cap)
    drafter = NoDrafter() if rng.random() < 0.2 else Eagle3Drafter(
        tiny_eagle3(target, rng.choice([None, 40]), seed=seed), target.model.get_input_embeddings(),
        depth=rng.randint(1, 6), top_k=rng.randint(1, 8))
    retriever = RETRIEVERS.build({"name": rng.choice(["none", "recycle", "ngram", "sam"])}, vocab_size=target.vocab_size,
                                 device=target.device)
    graft = GRAFTS.build({"name": rng.choice(["root", "tail", "match"])}, retriever=retriever)
    pruner = PRUNERS.build({"name": rng.choice(["none", "cost"])}, planner=checked)
    prompt = repetitive_prompt(rng)
    new = rng.randint(8, 32)
    out = generate(target, Method(drafter, pruner, retriever, graft, cap, checked), prompt, SamplingParams(),
                   StopRule(max_new_tokens=new))
    assert out.tokens == hf_greedy(target.model, prompt, new)
    assert len(checked.sizes) == len(out.steps)
    assert all(s.predicted_tokens is not None and s.predicted_time > 0 for s in out.steps)


def test_tree_auto_changes_its_choice_as_it_learns():
    """With a retriever that is always right, the planner learns to verify longer retrieved chains."""
    target = target_for("llama")
    prompt = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12] * 4)
    cap = 16
    checked = CheckedPlanner(CostPlanner(fake_profile(lambda n: 10 * MS * (1 + 0.1 * (n - 1)), cap), AcceptanceModel(), cap), cap)
    retriever = RETRIEVERS.build({"name": "ngram"}, vocab_size=target.vocab_size, device=target.device)
    method = Method(NoDrafter(), PRUNERS.build({"name": "none"}), retriever,
                    GRAFTS.build({"name": "root"}, retriever=retriever), cap, checked)
    out = generate(target, method, prompt, SamplingParams(), StopRule(max_new_tokens=40))
    assert out.tokens == hf_greedy(target.model, prompt, 40)
    assert len(set(checked.sizes)) > 1


def test_a_tree_auto_run_reports_its_choices_and_calibration(tmp_path, monkeypatch, capsys):
    """run.py's path end to end on the tiny random target: the profile is measured once and cached, every
    step records the chosen N and the predictions, and the summary carries calibration and efficiency."""
    import json

    from graft_lab.experiment import run_experiment
    from graft_lab.plot import calibration_figure
    from graft_lab.report import print_summary
    from harness import TINY

    monkeypatch.setenv("GRAFT_LAB_PROFILES", str(tmp_path / "profiles"))
    cfg = compose_cfg([*TINY, "tree=auto", "tree.total_tokens=8", "retriever=recycle",
                       "gen.max_new_tokens=24", f"results_dir={tmp_path}"])
    outcome = run_experiment(cfg, tmp_path / "runs" / "r0")
    s = outcome.summary
    assert s["matches_baseline"] is True
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1
    cal = s["calibration"]
    assert cal["steps"] == s["steps"] > 0 and cal["predicted_tau"] >= 1.0 and cal["realised_tau"] == pytest.approx(s["tau"])
    assert cal["tokens_ratio"] > 0 and cal["time_ratio"] > 0 and sum(b[3] for b in cal["bins"]) == cal["steps"]
    assert 1.0 <= s["mean_tree_size"] <= 8
    assert s["decode_speedup"] > 0 and 0 < s["prefill_share"] < 1 and s["ideal_speedup"] > 0 and s["efficiency"] > 0
    assert s["acceptance_reliability"] and s["per_category"]
    record = json.loads((outcome.out_dir / "answers.jsonl").read_text().splitlines()[0])
    ch = record["choices"][0]
    assert len(ch["tree_sizes"][0]) == len(ch["predicted_tokens"][0]) == len(ch["accept_lengths"][0])
    assert all(1 <= n <= 8 for n in ch["tree_sizes"][0]) and all(t > 0 for t in ch["predicted_step_times"][0])
    print_summary(s, outcome.out_dir)
    out = capsys.readouterr().out
    assert "decode-only speedup" in out and "predicted / realised" in out and "efficiency" in out
    calibration_figure(s)
    # a fixed tree predicts nothing; its summary still splits decode from prefill
    fixed = run_experiment(compose_cfg([*TINY, "retriever=ngram", f"results_dir={tmp_path}"]), tmp_path / "runs" / "r1").summary
    assert fixed["calibration"] is None and fixed["efficiency"] is None and fixed["acceptance_reliability"] is None
    assert fixed["decode_speedup"] > 0
