#!/usr/bin/env bash
# Issue 15's GPU check in one run (< 8 minutes on one H200): the tree-attention kernel against SDPA, then the cost
# profile of 8B-shaped random Llama-3.1-8B and Qwen3-8B targets in bf16 at prefixes 1k and 4k, SDPA against Triton.
# Without CUDA it runs the same steps with tiny shapes (Triton's interpreter). The work is benchmarks/gpu_check.py.
#
#   benchmarks/gpu_check.sh [--mode auto|gpu|cpu] [--out DIR]     # DIR default: $OUT, else results/gpu_check
#   PYTHON=python3 benchmarks/gpu_check.sh                          # another interpreter than .venv/bin/python
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # benchmarks/ is a package of the repository, not installed
if ! "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('graft_lab') is None)" 2>/dev/null; then
  echo "gpu_check: error: $PYTHON cannot import graft_lab; run make setup (or pip install -e .), or set PYTHON to an interpreter that has it" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" -m benchmarks.gpu_check "$@"
