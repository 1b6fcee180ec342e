#!/usr/bin/env bash
# Session 29 on the device: the shortlist's and the draw's host ops trimmed (top-p-only calls
# skip the top-k and min-p steps; the draw's fix-up in a cumsum and a search; per-position
# parameters made once). STEPS picks (default "gpu p1 sync bench"):
#   gpu    the -m gpu tests of the sampling pipeline, the deferred reads and the fast engine
#   p1     P1 itself (peak ~95 GB: an H200), OLD_TREE against this tree, new side first, warm-ups
#   sync   tools/gpu/sync_cost.py at 1024 and 256 rows, modes deferred and old (deferred with
#          S28_TREE's shortlist.py): the shortlist's own host work, A/B in one process
#   bench  P2: `spectest bench` fast-plain, fast-spec and transformers' generate, 5 rounds, at
#          1024 and 256 rows (OUT/bench.jsonl); then S28_TREE's (OUT/bench-s28.jsonl)
#   host   tools/gpu/host_profile.py: the fast arms under cProfile at HOST_ROWS (256) rows
#
#   bash tools/gpu/session29.sh OLD_TREE S28_TREE [OUT]
#   (each tree: `git archive COMMIT spectest protocols | tar -x -C TREE`)
set -uo pipefail
OLD="$1"
S28="$(cd "$2" && pwd)"
cd "$(dirname "$0")/../.."
OUT="${3:-${OUT:-/tmp/spectest-session29}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bench() {  # TREE ROWS ARMS RECORD
  (cd "$1" && PYTHONPATH="$1" timeout 150 python -m spectest bench --device cuda \
    --target realistic:qwen3-0.6b --draft derived:first_layers,layers=4 --positions 32 --k 4 \
    --peak-tflops 800 --drafter sampled --repeat 5 --arms "$3" --rows "$2" --out "$4" \
    > "$4.$2.txt" 2>&1 < /dev/null)
  echo "exit $?"; tail -n 12 "$4.$2.txt"
}
for step in ${STEPS:-gpu p1 sync bench}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    gpu)
      PYTHONPATH="$PWD" timeout 240 python -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_sampling_fast.py tests/test_sampling_native.py tests/test_sampling_kernels.py \
        tests/test_engine_deferred.py tests/test_engine_fast.py > "$OUT/gpu.txt" 2>&1 < /dev/null
      echo "exit $?"; tail -n 12 "$OUT/gpu.txt" ;;
    p1)
      P1=1 WARMUP=1 SIDE_TIMEOUT=200 ORDER="new old" PYC=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    sync)
      PYTHONPATH="$PWD" timeout 240 python tools/gpu/sync_cost.py --rows 1024,256 --repeat 3 \
        --modes deferred,old --old "$S28/spectest/sampling/shortlist.py" > "$OUT/sync.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^rows|Error" "$OUT/sync.txt" ;;
    bench)
      for rows in ${BENCH_ROWS:-1024 256}; do
        bench "$PWD" "$rows" fast-plain,fast-spec,hf-generate "$OUT/bench.jsonl"
        bench "$S28" "$rows" fast-plain,fast-spec "$OUT/bench-s28.jsonl"
      done ;;
    host)
      PYTHONPATH="$PWD" timeout 200 python tools/gpu/host_profile.py --rows "${HOST_ROWS:-256}" \
        --top 40 > "$OUT/host.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^== " "$OUT/host.txt" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
