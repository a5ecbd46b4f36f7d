"""The cost profile: its curve, lower envelope and online refinement on synthetic numbers, and one real
measurement of a tiny target (structure, the on-disk cache and its key), plus `python -m graft_lab.profile`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graft_lab.drafters.eagle3 import Eagle3Drafter
from graft_lab.drafters.none import NoDrafter
from graft_lab import profile as profile_mod
from graft_lab.profile import CostProfile, agrees, check, grid, main, measure, probe_tree, profile_for
from tiny import tiny_eagle3, tiny_target


def synthetic(times: dict[int, float], prefixes=(100,), growth: float = 0.0) -> CostProfile:
    """A profile with t(N) = times[N] at the first prefix, + growth per token of prefix after it."""
    sizes = sorted(times)
    rows = [[times[n] + growth * (p - prefixes[0]) for n in sizes] for p in prefixes]
    return CostProfile({}, sizes, list(prefixes), rows, draft_base_s=0.002, draft_level_s=0.001)


def test_grid_ends_at_the_cap():
    assert grid(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert grid(10) == [1, 2, 3, 4, 6, 8, 10]
    assert grid(1) == [1]


def test_curve_interpolates_and_the_envelope_fills_up_to_the_cheapest_size():
    # the CPU: 3 nodes cost more than 4 or 8
    prof = synthetic({1: 39.7, 2: 61.2, 3: 77.0, 4: 59.9, 6: 59.5, 8: 59.0})
    t = prof.curve(100)
    assert t.shape == (8,) and t[0] == 39.7 and t[2] == 77.0
    assert t[4] == pytest.approx((59.9 + 59.5) / 2)  # N=5 lies between the grid sizes 4 and 6
    env = prof.envelope(100)
    assert env.tolist() == [min(t[i:]) for i in range(8)]
    assert env[2] == 59.0 and env[0] == 39.7  # 3 nodes cost what 8 do; 1 stays the AR step
    assert prof.fill_to(100).tolist() == [1, 8, 8, 8, 8, 8, 8, 8]


def test_prefix_interpolation_and_extrapolation_never_falls():
    prof = synthetic({1: 1.0, 4: 2.0}, prefixes=(100, 300), growth=0.01)
    assert prof.verify_time(1, 50) == pytest.approx(1.0)  # flat below the first prefix
    assert prof.verify_time(1, 200) == pytest.approx(2.0)
    assert prof.verify_time(4, 500) == pytest.approx(2.0 + 0.01 * 400)  # extrapolated linearly
    falling = CostProfile({}, [1, 4], [100, 300], [[2.0, 3.0], [1.0, 2.0]], 0.0, 0.0)
    assert falling.verify_time(1, 200) == pytest.approx(1.5)  # measured noise inside the range: interpolated
    assert falling.verify_time(1, 5000) == pytest.approx(1.0)  # but never extrapolated downwards


def test_online_refinement_moves_the_level_then_the_shape():
    prof = synthetic({1: 10.0, 8: 20.0, 16: 40.0})
    for _ in range(80):
        prof.observe(8, 100, 30.0)  # the machine runs 1.5x slower than profiled (seen at 8 nodes only)
    assert prof.verify_time(8, 100) == pytest.approx(30.0, rel=0.01)
    assert prof.level == pytest.approx(1.5, rel=0.02)  # read as the whole machine: every size follows
    assert prof.verify_time(1, 100) == pytest.approx(15.0, rel=0.02) and prof.verify_time(16, 100) == pytest.approx(60.0, rel=0.02)
    assert prof.draft_level_now == pytest.approx(1.5 * prof.draft_level_s, rel=0.02)
    for _ in range(300):  # then 1 node runs at its profiled 1.5x and 16 nodes at 3x: the shape learns it
        prof.observe(1, 100, 15.0)
        prof.observe(16, 100, 120.0)
    assert prof.verify_time(1, 100) == pytest.approx(15.0, rel=0.05) and prof.verify_time(16, 100) == pytest.approx(120.0, rel=0.05)
    prof.observe(1, 100, 1e6)  # one stall moves the curve a bounded step
    assert prof.verify_time(1, 100) < 15.0 * 1.5


def test_json_round_trip_leaves_out_the_online_correction():
    prof = synthetic({1: 1.0, 2: 2.0})
    prof.observe(2, 100, 3.0)
    prof.note = "measured"
    back = CostProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert back.verify_s == prof.verify_s and back.shape == [1.0, 1.0] and back.level == 1.0 and back.note == ""


def test_probe_tree_has_the_size_and_a_valid_shape():
    for n in (1, 2, 5, 33):
        tree = probe_tree(n, 100)
        tree.check()
        assert tree.size == n


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_LAB_PROFILES", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def test_a_real_profile_is_measured_once_then_read_from_the_cache(cache_dir):
    torch.manual_seed(0)
    target = tiny_target("llama")
    drafter = Eagle3Drafter(tiny_eagle3(target), target.model.get_input_embeddings(), depth=3, top_k=2)
    prof, path, cached = profile_for(target, drafter, "tiny", "eagle3-tiny", cap=12, repeats=2, budget_s=2.0)
    assert not cached and path.parent == cache_dir and path.is_file()
    assert prof.sizes == grid(12) and len(prof.prefixes) == 2 and prof.prefixes[1] <= target.max_context - 13
    assert np.asarray(prof.verify_s).shape == (2, len(prof.sizes)) and min(min(r) for r in prof.verify_s) > 0
    assert prof.draft_base_s > 0 and prof.draft_level_s >= 0 and prof.repeats >= 1
    assert prof.key["dtype"] == "float32" and prof.key["threads"] == torch.get_num_threads()
    assert prof.key["attn"] == "sdpa" and prof.key["device_name"] and len(prof.key["fingerprint"]) == 12
    again, path2, cached2 = profile_for(target, drafter, "tiny", "eagle3-tiny", cap=12, verify_cache=False)
    assert cached2 and path2 == path and again.verify_s == prof.verify_s and again.note == "read from the cache"
    # another dtype, cap or drafter is another profile
    half = tiny_target("llama")
    half.model.to(torch.bfloat16)
    key_bf16 = profile_for(half, NoDrafter(), "tiny", "none", cap=4, repeats=1, budget_s=1.0)
    assert key_bf16[0].key["dtype"] == "bfloat16" and key_bf16[1] != path and not key_bf16[2]
    assert profile_for(target, drafter, "tiny", "eagle3-tiny", cap=8, repeats=1)[1] != path
    assert prof.key["drafter_dtype"] == "float32" and key_bf16[0].key["drafter_dtype"] is None
    # a drafter in its own dtype (drafter.dtype=bfloat16 beside the fp32 target) is measured as it runs
    half_drafter = Eagle3Drafter(tiny_eagle3(target).to(torch.bfloat16), target.model.get_input_embeddings(), depth=3, top_k=2)
    prof_hd, path_hd, cached_hd = profile_for(target, half_drafter, "tiny", "eagle3-tiny", cap=12, repeats=1, budget_s=1.0)
    assert not cached_hd and path_hd != path and prof_hd.key["drafter_dtype"] == "bfloat16" and prof_hd.draft_base_s > 0
    # a damaged cache file is measured again, not trusted
    path.write_text("{not json")
    fresh, _, cached3 = profile_for(target, drafter, "tiny", "eagle3-tiny", cap=12, repeats=1, budget_s=1.0)
    assert not cached3 and fresh.sizes == grid(12)


def test_a_cached_profile_is_checked_against_the_machine_now_and_measured_again_when_it_is_off(cache_dir, monkeypatch):
    target = tiny_target("llama")
    prof, path, _ = profile_for(target, NoDrafter(), "tiny", "none", cap=8, repeats=1, budget_s=1.0)
    stale = json.loads(path.read_text())
    stale["verify_s"] = [[10 * t for t in row] for row in stale["verify_s"]]  # taken on a machine 10x slower
    path.write_text(json.dumps(stale))
    again, _, cached = profile_for(target, NoDrafter(), "tiny", "none", cap=8, repeats=1, budget_s=1.0)
    assert not cached and again.note.startswith("measured again: the cached profile is off")
    assert again.verify_s != stale["verify_s"] and json.loads(path.read_text())["verify_s"] == again.verify_s
    # a check that agrees keeps the cached measurement (the timing is faked: tiny models are too noisy to agree)
    seen = []
    monkeypatch.setattr(profile_mod, "check", lambda p, t, aux: seen.append(p.sizes) or {1: 1.1, 4: 0.9, 8: 1.2})
    kept, _, cached = profile_for(target, NoDrafter(), "tiny", "none", cap=8)
    assert cached and seen == [grid(8)] and kept.verify_s == again.verify_s and "checked now" in kept.note
    monkeypatch.setattr(profile_mod, "check", lambda p, t, aux: {1: 1.0, 4: 1.3, 8: 1.0})  # the shape moved
    assert not profile_for(target, NoDrafter(), "tiny", "none", cap=8, repeats=1, budget_s=1.0)[2]


def test_check_times_three_sizes_against_the_profile():
    target = tiny_target("llama")
    prof = measure(target, NoDrafter(), cap=8, repeats=1, budget_s=1.0)
    ratios = check(prof, target, want_aux=False, rounds=1)
    assert sorted(ratios) == [1, 4, 8] and all(r > 0 for r in ratios.values())
    assert agrees({1: 1.2, 8: 0.81}) and not agrees({1: 1.3}) and not agrees({8: 0.7})


def test_measure_honours_its_time_budget():
    target = tiny_target("llama")
    prof = measure(target, NoDrafter(), cap=4, repeats=1000, budget_s=0.0)
    assert prof.repeats == 1 and prof.draft_level_s == 0.0  # one measured round always runs, no second one
    assert all(t > 0 for row in prof.verify_s for t in row)


def test_profile_cli_prints_the_curve_and_its_envelope(cache_dir, capsys):
    args = ["--model", "random:llama?seed=0&hidden=64&layers=4", "--cap", "8", "--drafter", "none", "--linear", "torch"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "measured in" in out and "env ms" in out and "fill" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == grid(8)
    assert main([*args, "--no-check"]) == 0 and "read from the cache" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0 and json.loads(capsys.readouterr().out)["sizes"] == grid(8)


def test_profile_cli_bad_model_is_one_line(cache_dir, capsys):
    assert main(["--model", "/no/such/model", "--drafter", "none"]) == 2
    assert capsys.readouterr().err.startswith("graft-lab: error:")
