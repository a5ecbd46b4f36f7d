#!/usr/bin/env bash
# Regenerate results/sample/ (the small results table the notebooks and their CI test read) with real runs.
# With the shipped SmolLM2 EAGLE-3 drafter the runs use the embedded SmolLM2 target (real numbers); without
# it (or TINY=1) the tiny random target with a random EAGLE-3 drafter (real pipeline, meaningless numbers).
# The table is built in $BUILD, then runs.parquet / runs.csv are copied with a README saying which it was.
#
#   experiments/make_sample.sh          # QUESTIONS_PER_CATEGORY=1 TOKENS=16 by default
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUILD=$(realpath -m "${BUILD:-results/sample_build}")
DEST=results/sample
PER_CATEGORY=${QUESTIONS_PER_CATEGORY:-1}
TOKENS=${TOKENS:-16}
SHIPPED=src/graft_lab/assets/drafters/smollm2-135m-instruct-eagle3

rm -rf "$BUILD"
mkdir -p "$BUILD"
if [[ -f $SHIPPED/config.json && ${TINY:-0} != 1 ]]; then
  MODEL=(model=smollm2_135m); KIND="embedded SmolLM2-135M-Instruct with the shipped EAGLE-3 drafter"
else
  "$PY" experiments/random_drafter.py "$BUILD/random-eagle3" >/dev/null
  MODEL=(model=tiny_random drafter=eagle3 "drafter.path=$BUILD/random-eagle3")
  KIND="tiny random Llama (random:llama?seed=0&hidden=64&layers=4) with a random EAGLE-3 drafter"
fi
COMMON=("${MODEL[@]}" dataset.limit=null "dataset.per_category=$PER_CATEGORY" dataset.first_turn_only=true
        "gen.max_new_tokens=$TOKENS" "results_dir=$BUILD" experiment_name=sample)

# 1. Pareto: dense / pruned / retrieval without pruning / Graft, at three budgets
"$PY" run.py -m "${COMMON[@]}" pruner=none,dyn_depth retriever=none,ngram tree.total_tokens=8,16,32
# 2. grafting modes, with and without pruning
"$PY" run.py -m "${COMMON[@]}" retriever=ngram graft=root,tail,match pruner=none,dyn_depth tree.total_tokens=32
# 3. the per-stage budget split of dyn_depth
"$PY" run.py -m "${COMMON[@]}" retriever=ngram pruner=dyn_depth tree.total_tokens=32 \
  'pruner.draft_split=[0.067,0.2,0.5,1.0],[0.133333,0.4,0.666667,1.0],[0.25,0.6,0.833,1.0]'

mkdir -p "$DEST"
cp "$BUILD/runs.parquet" "$BUILD/runs.csv" "$DEST/"
cat >"$DEST/README.md" <<MD
# results/sample

A small results table for the notebooks in notebooks/ and their CI test, made by
\`experiments/make_sample.sh\` on $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD).

**Real runs** of run.py (8 MT-Bench categories x $PER_CATEGORY first turn, $TOKENS new tokens, greedy,
interleaved AR baseline, CPU) on the **$KIND**.
$([[ $KIND == tiny* ]] && echo "The pipeline is real; the numbers are not: a random target and drafter say nothing about
speedups. Rerun the script once the shipped drafter exists to replace them with SmolLM2 numbers.")

Files: runs.parquet and runs.csv (one row per run, the schema of results/runs.parquet). The run
directories (run_dir) are not shipped.
MD
echo "sample: $(wc -l <"$DEST/runs.csv") lines -> $DEST"
