#!/usr/bin/env bash
# Issue 32's load / analyze / write phases of seed 001's bf16 plan (P1) on one GPU (about 4 min on
# one H200): P1 once by this tree (its phase line), then, on that stored run and side by side in
# one sitting, the report rendering by OLD_TREE and by this tree (tools/bench_report.py, 3 each,
# CPU seconds by part), `spectest analyze` by each (wall), and a cProfile of P1's model loading.
# Prints: P1's exit, wall and summary "timings"; one JSON line per render; analyze walls; the load
# profile's 25 costliest calls (cumulative). Logs and the run go to $OUT.
#
#   bash tools/gpu/issue32_write.sh OLD_TREE   # OLD_TREE: e.g. `git archive main spectest
#                                              # protocols | tar -x -C gpu_old`
set -u
cd "$(dirname "$0")/../.."
export SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spectest-issue32-write}"
OLD="$(cd "${1:?OLD_TREE}" && pwd)"
HERE="$(pwd)"
mkdir -p "$OUT"
P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress --set batch_size=768
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
echo "=== P1 by this tree ($(date -u +%H:%M:%S))"
t0=$(date +%s.%N)
PYTHONPATH="$HERE" timeout 300 python -m spectest run "${P1[@]}" --out "$OUT/p1" \
  > "$OUT/p1.console.txt" 2>&1
echo "P1: exit $?, wall $(python -c "import time; print(round(time.time() - $t0, 1))") s"
python -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['verdict']['decision'], \
json.dumps(s.get('timings')))" "$OUT/p1/summary.json" || tail -5 "$OUT/p1.console.txt"
echo "=== report rendering, old and this tree alternating ($(date -u +%H:%M:%S))"
python tools/bench_report.py "$OUT/p1" --before "$OLD" --after "$HERE" --reps 3 \
  --out "$OUT/report.jsonl"
echo "=== spectest analyze, old and this tree ($(date -u +%H:%M:%S))"
for tree in "$OLD" "$HERE" "$OLD" "$HERE"; do
  t0=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH="$tree" timeout 120 python -m spectest analyze "$OUT/p1" \
    --no-progress > "$OUT/analyze.txt" 2>&1)
  echo "analyze by $tree: exit $?, wall $(python -c "import time; print(round(time.time() - $t0, 1))") s"
done
echo "=== P1's model loading under cProfile ($(date -u +%H:%M:%S))"
PYTHONPATH="$HERE" python - "${P1[@]}" <<'PY'
import cProfile, pstats, sys, time
from spectest.generation import load_models
from spectest.plan import make_plan
from spectest.protocol import load_protocol
args = sys.argv[1:]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
sets += ["models.device=cuda"]
proto = load_protocol(args[1], sets=sets)
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
models = load_models(proto)
pr.disable()
print(f"load_models: {time.perf_counter() - t0:.2f} s")
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
PY
