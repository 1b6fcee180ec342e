#!/usr/bin/env bash
# Issue 32 on one GPU in one command (<= 9 min): seed 001's bf16 plan (P1) by an old tree and this
# tree side by side, and the GPU tests of what changed. Prints per run: exit code, wall time, every
# phase (summary.json "timings"), the verdict and claim (b)'s console lines; console logs and the
# summaries go to $OUT.
#
#   bash tools/gpu/issue32.sh OLD_TREE      # GPU tests, then P1 by OLD_TREE, then P1 by this tree
#   bash tools/gpu/issue32.sh -             # GPU tests and P1 by this tree only
#
# OLD_TREE: a directory holding an older `spectest/` and `protocols/` (e.g. `git archive main
# spectest protocols | tar -x -C gpu_old`). P1 = `spectest run --config
# protocols/openinfer-512.yaml --device cuda --fast --set batch_size=768` at the plan's model
# (realistic:qwen3-0.6b, derived:first_layers,layers=4, bfloat16), as tools/gpu/issue24.sh runs it.
set -u
cd "$(dirname "$0")/../.."
export SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spectest-issue32}"
mkdir -p "$OUT"
OLD="${1:--}"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress --set batch_size=768
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
p1() {  # p1 NAME TREE
  local name="$1" tree="$2" t0 rc
  step "P1 by the $name tree ($tree)"
  t0=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH="$tree" timeout 330 python -m spectest run "${P1[@]}" \
    --out "$OUT/p1-$name" > "$OUT/p1-$name.console.txt" 2>&1)
  rc=$?
  echo "P1 $name: exit $rc, wall $(python -c "import time; print(round(time.time() - $t0, 1))") s"
  grep -iE "numerics|claim|verdict|EQUIVALENT|DIFFERENT|INCONCLUSIVE" "$OUT/p1-$name.console.txt" | head -12
  python - "$OUT/p1-$name" <<'PY' || tail -5 "$OUT/p1-$name.console.txt"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print("decision:", s["verdict"]["decision"])
print("timings:", json.dumps(s.get("timings"), default=str))
PY
  cp "$OUT/p1-$name/summary.json" "$OUT/p1-$name.summary.json" 2>/dev/null
  rm -rf "$OUT/p1-$name"
}
step "GPU tests (numerics replay, fast engine)"
timeout 240 python -m pytest -q -m gpu tests/test_numerics_replay.py tests/test_engine_fast.py \
  tests/test_numerics.py 2>&1 | tail -6
if [ "$OLD" != - ]; then p1 old "$(cd "$OLD" && pwd)"; fi
p1 new "$PWD"
echo; echo "=== done ($(date -u +%H:%M:%S))"
