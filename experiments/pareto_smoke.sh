#!/usr/bin/env bash
# Issue 5's acceptance check, rerunnable: a 3 x 3 sweep (tree.total_tokens x dyn_depth thresholds, the
# experiment=pareto_sweep preset) on 8 MT-Bench questions -> results table, Pareto PNG and offline W&B runs.
# The sweep is first interrupted (SIGINT, as Ctrl-C) once a run has landed, then rerun: the table must end
# with 18 complete rows (6 methods x 3 budgets), one per config hash.
#
#   experiments/pareto_smoke.sh                     # embedded SmolLM2 + shipped drafter when it exists, else tiny
#   TINY=1 QUESTIONS=2 TOKENS=4 experiments/pareto_smoke.sh   # the pipeline check the slow test runs
#
# Without the shipped EAGLE-3 drafter (or with TINY=1) the target is the tiny random Llama with a random
# EAGLE-3 drafter: the pipeline is exercised end to end, the speedups mean nothing.
set -euo pipefail
set -m  # background jobs get their own process group and keep SIGINT, as in a terminal
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/pareto_smoke}
QUESTIONS=${QUESTIONS:-8}
TOKENS=${TOKENS:-32}
LAUNCHER=${LAUNCHER:-basic}
SHIPPED=src/graft_lab/assets/drafters/smollm2-135m-instruct-eagle3

OUT=$(realpath -m "$OUT")
rm -rf "$OUT"
mkdir -p "$OUT"
if [[ -f $SHIPPED/config.json && ${TINY:-0} != 1 ]]; then
  MODEL=(model=smollm2_135m)
else
  echo "[smoke] tiny random target with a random EAGLE-3 drafter (pipeline check; speedups are meaningless)"
  "$PY" experiments/random_drafter.py "$OUT/random-eagle3" >/dev/null
  MODEL=(model=tiny_random drafter=eagle3 "drafter.path=$OUT/random-eagle3")
fi
ARGS=(experiment=pareto_sweep "${MODEL[@]}" "dataset.limit=$QUESTIONS" "gen.max_new_tokens=$TOKENS"
      logger=wandb "results_dir=$OUT" "hydra/launcher=$LAUNCHER")

rows() { "$PY" -c "import sys, pandas as pd; df = pd.read_parquet(sys.argv[1]); print(len(df), int(df.complete.sum()), df.config_hash.nunique())" "$OUT/runs.parquet" 2>/dev/null || echo "0 0 0"; }

# mid-run: a run has answered a question (non-empty answers.jsonl) but has no table row yet
mid_run() { [[ $(find "$OUT/multirun" -name answers.jsonl -size +0 2>/dev/null | wc -l) -gt $(rows | cut -d' ' -f1) ]]; }

echo "[smoke] sweep, interrupted (SIGINT) in the middle of its second run"
"$PY" run.py "${ARGS[@]}" >"$OUT/sweep1.log" 2>&1 &
pid=$!
until { [[ $(rows | cut -d' ' -f1) -ge 1 ]] && mid_run; } || ! kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
kill -INT -- "-$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
read -r n complete unique < <(rows)
echo "[smoke] interrupted (exit $rc): $n rows, $complete complete (an incomplete row is the interrupted run)"

echo "[smoke] rerun: complete points are skipped"
"$PY" run.py "${ARGS[@]}" >"$OUT/sweep2.log" 2>&1
read -r n complete unique < <(rows)
skipped=$(grep -c "graft-lab: skipped" "$OUT/sweep2.log" || true)
echo "[smoke] after the rerun: $n rows, $complete complete, $unique config hashes, $skipped points skipped"
[[ $n == 18 && $complete == 18 && $unique == 18 && $skipped -ge 1 ]] || { echo "[smoke] FAILED: expected 18 complete unique rows"; exit 1; }

"$PY" -m graft_lab.plot pareto --results "$OUT"
runs=$(find "$OUT/wandb" -maxdepth 1 -name 'offline-run-*' | wc -l)
echo "[smoke] $runs offline W&B runs in $OUT/wandb"
[[ -s $OUT/pareto.png && -s $OUT/runs.csv && $runs -ge 18 ]] || { echo "[smoke] FAILED: missing outputs"; exit 1; }
echo "[smoke] OK: $OUT/runs.parquet, $OUT/runs.csv, $OUT/pareto.png, $OUT/wandb/"
