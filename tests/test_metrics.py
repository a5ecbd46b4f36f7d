"""Run-level figures from synthetic turns: decode-only speedup beside end-to-end, prefill's share, and the
planner's calibration and efficiency (tree=auto)."""

from __future__ import annotations

import pytest

from graft_lab.metrics import TurnStats, aggregate


def turn(tokens: int, wall: float, prefill: float, lengths: list[int], predicted=None, times=None, ratios=None) -> TurnStats:
    n = len(lengths)
    return TurnStats(new_tokens=tokens, wall_time=wall, accept_lengths=lengths, phase_times={"prefill": prefill},
                     drafted=0, retrieved=0, accepted_retrieved=0, tree_sizes=[4] * n,
                     step_times=times or [1.0] * n, predicted_tokens=predicted or [None] * n,
                     predicted_times=[1.0] * n if predicted else [None] * n, verify_ratios=ratios or [None] * n)


def test_decode_only_speedup_excludes_prefill():
    # 101 tokens each; method: 10 s prefill + 10 s decoding, AR: 10 s prefill + 40 s decoding
    method = turn(101, 20.0, 10.0, [4] * 25)
    ar = turn(101, 50.0, 10.0, [1] * 100)
    s = aggregate([method], [ar])
    assert s["speedup"] == pytest.approx(50 / 20)  # end to end
    assert s["decode_speedup"] == pytest.approx(40 / 10)  # decoding alone
    assert s["prefill_share"] == pytest.approx(0.5) and s["baseline_prefill_share"] == pytest.approx(0.2)
    assert s["decode_tokens_per_s"] == pytest.approx(100 / 10)
    assert s["calibration"] is None and s["efficiency"] is None and s["mean_tree_size"] == 4
    alone = aggregate([method], None)
    assert alone["decode_speedup"] is None and alone["prefill_share"] == pytest.approx(0.5)


def test_calibration_and_efficiency_of_predicted_steps():
    lengths = [1, 2, 3, 4]
    predicted = [1.0, 2.0, 2.0, 6.0]
    times = [1.0, 1.0, 2.0, 2.0]  # predicted 1.0 each
    method = turn(11, 7.0, 1.0, lengths, predicted, times, ratios=[1.0, 1.5, 1.5, 1.0])
    ar = turn(11, 21.0, 1.0, [1] * 10)
    s = aggregate([method], [ar])
    cal = s["calibration"]
    assert cal["steps"] == 4 and cal["predicted_tau"] == pytest.approx(11 / 4) and cal["realised_tau"] == pytest.approx(10 / 4)
    assert cal["tokens_error"] == pytest.approx((0 + 0 + 1 + 2) / 4)
    assert cal["tokens_ratio"] == pytest.approx(10 / 11)
    assert cal["time_ratio"] == pytest.approx(6 / 4) and cal["time_error"] == pytest.approx(0.25)
    # bins by predicted tokens: [lower edge, mean predicted, mean realised, steps]
    assert cal["bins"] == [[1.0, 1.0, 1.0, 1], [2.0, 2.0, 2.5, 2], [6.0, 6.0, 4.0, 1]]
    # ideal speedup: tokens per AR-step equivalent of verification = 10 / 5; decode speedup 20/6 / (10/20)
    assert s["ideal_speedup"] == pytest.approx(2.0)
    assert s["decode_speedup"] == pytest.approx((10 / 6) / (10 / 20))
    assert s["efficiency"] == pytest.approx(s["decode_speedup"] / 2.0)
