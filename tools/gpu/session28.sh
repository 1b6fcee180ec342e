#!/usr/bin/env bash
# Session 28 on the device: the deferred shortlist reads
# (docs/internals.md "Deferred shortlist reads"). STEPS picks (default "gpu sync redos bench"):
#   gpu    the -m gpu tests of the deferred reads, the fast engine, the loops' host work and
#          claim (b)'s kept verify logits
#   sync   tools/gpu/sync_cost.py at 1024 and 256 rows (sync / deferred / nosync, 3 rounds)
#   redos  tools/gpu/deferred_redos.py: P1's configs, 768 rows, chunks redone and walls
#   bench  P2: `spectest bench` fast-plain, fast-spec and transformers' generate, 5 rounds, at
#          1024 and 256 rows (records to OUT/bench.jsonl)
#   p1s    P1's plan at 32 seeds (96-row batches; fits an H100), OLD_TREE against this tree
#          (tools/gpu/identity.sh, new side first)
#   p1     P1 itself (peak ~95 GB: an H200), OLD_TREE against this tree, new side first
#
#   bash tools/gpu/session28.sh OLD_TREE [OUT]   (OLD_TREE: `git archive COMMIT spectest protocols`)
set -uo pipefail
OLD="$1"
cd "$(dirname "$0")/../.."
OUT="${2:-${OUT:-/tmp/spectest-session28}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1 PYTHONPATH="$PWD"
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for step in ${STEPS:-gpu sync redos bench}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    gpu)
      timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/test_engine_deferred.py \
        ${GPU_TESTS-tests/test_engine_fast.py tests/test_engine_host_work.py tests/test_numerics_replay.py} \
        > "$OUT/gpu.txt" 2>&1 < /dev/null
      echo "exit $?"; tail -n 15 "$OUT/gpu.txt" ;;
    sync)
      timeout 200 python tools/gpu/sync_cost.py --rows 1024,256 --repeat 3 > "$OUT/sync.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^rows|Error" "$OUT/sync.txt" ;;
    redos)
      timeout 150 python tools/gpu/deferred_redos.py --rows 768 > "$OUT/redos.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "walls|Error" "$OUT/redos.txt" ;;
    bench)
      for rows in ${BENCH_ROWS:-1024 256}; do
        timeout 150 python -m spectest bench --device cuda --target realistic:qwen3-0.6b \
          --draft derived:first_layers,layers=4 --positions 32 --k 4 --peak-tflops 800 \
          --drafter sampled --repeat 5 --arms fast-plain,fast-spec,hf-generate --rows "$rows" \
          --out "$OUT/bench.jsonl" > "$OUT/bench-$rows.txt" 2>&1 < /dev/null
        echo "exit $?"; tail -n 14 "$OUT/bench-$rows.txt"
      done ;;
    p1s)
      P1=1 EXTRA="--set seeds.per_arm=32" SIDE_TIMEOUT=150 ORDER="new old" PYC=1 \
        bash tools/gpu/identity.sh "$OLD" "$OUT/p1s" ;;
    p1)
      P1=1 SIDE_TIMEOUT=200 ORDER="new old" PYC=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
