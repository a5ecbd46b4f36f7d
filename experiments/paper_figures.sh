#!/usr/bin/env bash
# The paper's figures on the embedded SmolLM2-135M target with the shipped EAGLE-3 drafter: real runs of
# run.py into results/paper/ (runs.parquet, runs.csv), then the four notebooks drawn from that table into
# results/paper/*.png (shown in the README). Every point decodes the same prompts with its method and,
# interleaved prompt by prompt, with AR: speedups are same-run, same-dtype ratios.
#
#   experiments/paper_figures.sh            # MT_PER_CATEGORY=1 (8 MT-Bench first turns), TOKENS=96, PER_CATEGORY=2, fp32
#
# Reruns skip finished points (config hash); FORCE=1 redoes them. Run it alone: timing shares the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/paper}
MT_PER_CATEGORY=${MT_PER_CATEGORY:-1}   # MT-Bench first turns per category (8 categories) for the Pareto, ablation, split
TOKENS=${TOKENS:-96}
PER_CATEGORY=${PER_CATEGORY:-2}         # Spec-Bench first turns per category (13 categories) for the per-category bars
DTYPE=${DTYPE:-float32}
SPEC_BENCH=${SPEC_BENCH:-../shared/data/spec_bench/question.jsonl}
COMMON=(model=smollm2_135m "model.dtype=$DTYPE" dataset.first_turn_only=true "gen.max_new_tokens=$TOKENS"
        "results_dir=$OUT" "force=$([[ ${FORCE:-0} == 1 ]] && echo true || echo false)")

# 1 + 2. Pareto (tau and speedup against K) for 6 methods at K = 16, 32, 60; its K=60 Graft modes are the ablation
"$PY" run.py -m experiment=pareto_sweep "${COMMON[@]}" dataset.limit=null "dataset.per_category=$MT_PER_CATEGORY"
# 3. dyn_depth's draft/retrieval split at K=60: 8/52, 24/36, 40/20 against two others
"$PY" run.py -m experiment=budget_split "${COMMON[@]}" dataset.limit=null "dataset.per_category=$MT_PER_CATEGORY"
# 4. Spec-Bench's 13 categories: dense EAGLE-3, Graft and prompt lookup at K=16
if [[ -f $SPEC_BENCH ]]; then
  "$PY" run.py -m method=eagle3_dense,graft,pld tree=k16 experiment_name=per_category "${COMMON[@]}" \
    dataset=spec_bench "dataset.path=$(realpath "$SPEC_BENCH")" dataset.limit=null "dataset.per_category=$PER_CATEGORY"
  # ... and beside them, the default run (the cost model picks each step's tree)
  "$PY" run.py method=graft_pool tree=auto experiment_name=per_category "${COMMON[@]}" \
    dataset=spec_bench "dataset.path=$(realpath "$SPEC_BENCH")" dataset.limit=null "dataset.per_category=$PER_CATEGORY"
fi
# 5. the default run on the Pareto's prompts: figure 1's reference line (what tree=auto reaches on this machine)
"$PY" run.py method=graft_pool tree=auto experiment_name=hardware_aware "${COMMON[@]}" dataset.limit=null \
  "dataset.per_category=$MT_PER_CATEGORY"

cat >"$OUT/README.md" <<MD
# results/paper

The paper's figures on this project's embedded target: **SmolLM2-135M-Instruct with the shipped EAGLE-3
drafter**, $DTYPE, greedy, $TOKENS new tokens, on $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores),
made by \`experiments/paper_figures.sh\` on $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD).
Pareto, ablation and budget split: MT-Bench first turns, the first $MT_PER_CATEGORY of each of its 8 categories; per
category: the first $PER_CATEGORY first turns of each of Spec-Bench's 13 categories. Speedups are against the AR baseline
decoded in the same run. The runs took $((SECONDS / 60)) minutes.
MD
GRAFT_LAB_RESULTS=$(realpath "$OUT") GRAFT_LAB_FIGURES=$(realpath "$OUT") "$PY" - <<'PYEOF'
from pathlib import Path
import nbformat
from nbclient import NotebookClient
for path in sorted(Path("notebooks").glob("*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
    print("drew", path.stem)
PYEOF
ls "$OUT"/*.png
