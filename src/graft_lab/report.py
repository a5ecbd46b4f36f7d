"""Console output: the short table a run ends with."""

from __future__ import annotations

from pathlib import Path

from .metrics import PHASES


def audit_line(summary: dict) -> str:
    """`5/6 turns; 1 numeric tie (gap 0.03 <= 2 x bound 0.06); 0 unexplained`: the divergence audit (audit.py)."""
    if summary.get("match_share") is None:
        return {True: "yes", False: "NO", None: "-"}[summary.get("matches_baseline")]
    turns, divergences = summary["audited_turns"], summary["divergences"]
    ties_ = [d for d in divergences if d["verdict"] == "numeric_tie"]
    ties = f"{len(ties_)} numeric tie{'' if len(ties_) == 1 else 's'}"
    if ties_:  # the widest tie, against the bound its verdict used (audit.py: the top-k bound where it applies)
        d = max(ties_, key=lambda d: d["ar_margin"] / max(d.get("bound") or summary["noise_bound"], 1e-30))
        ties += (f" (gap{' max' if len(ties_) > 1 else ''} {d['ar_margin']:.3g} <= 2 x bound "
                 f"{d.get('bound') or summary['noise_bound']:.3g})")
    else:
        ties += f" (noise bound {summary['noise_bound']:.3g})"
    return f"{turns - len(divergences)}/{turns} turns; {ties}; {summary['unexplained_divergences']} unexplained"


def print_summary(summary: dict, out_dir: Path) -> None:
    speed = summary.get("speedup")
    rows = [
        ("method", f"{summary.get('method', '-')}, K={summary.get('tree', {}).get('total_tokens', '-')}"),
        ("tau (tokens / verify step, bonus incl.)", f"{summary['tau']:.2f}"),
        ("tokens/s", f"{summary['tokens_per_s']:.1f}"),
        ("AR baseline tokens/s", f"{summary['baseline_tokens_per_s']:.1f}" if summary.get("baseline_tokens_per_s") else "-"),
        ("speedup vs AR (same run)", f"{speed:.2f}x" if speed else "-"),
        ("decode-only speedup (prefill excluded)", f"{d:.2f}x" if (d := summary.get("decode_speedup")) else "-"),
        ("prefill share of wall time", f"{100 * summary.get('prefill_share', 0.0):.0f}%"),
        ("drafted / retrieved nodes per step", f"{summary['drafted_per_step']:.1f} / {summary['retrieved_per_step']:.1f}"),
        ("output identical to AR", audit_line(summary)),
    ]
    cal = summary.get("calibration")
    if cal:  # tree=auto: what the planner chose and how well it predicted
        eff = summary.get("efficiency")
        rows += [
            ("verified nodes per step (chosen N)", f"{summary['mean_tree_size']:.1f}"),
            ("tokens per step predicted / realised", f"{cal['predicted_tau']:.2f} / {cal['realised_tau']:.2f} "
                                                     f"(mean error {cal['tokens_error']:.2f})"),
            ("step time measured / predicted", f"{cal['time_ratio']:.2f}"),
            ("efficiency (speedup / tau x t(1)/t(N))", f"{eff:.2f}" if eff else "-"),
        ]
    share = summary.get("phase_share", {})
    rows.append(("phase shares", "  ".join(f"{p} {100 * share.get(p, 0):.0f}%" for p in ("prefill", *PHASES) if p in share)))
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"\n  {summary['n_questions']} questions, {summary['n_turns']} turns -> {out_dir}/answers.jsonl, summary.json")
    if not summary.get("complete", True):
        print("  (incomplete: interrupted)")
