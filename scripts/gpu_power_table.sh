#!/usr/bin/env bash
# Issue 14's power table on the bundled pair, on one H200 in one command (pools on the GPU, the
# 480 analyses on the CPU cores beside it). Resumable: pools are one Parquet file per arm ×
# prompt, analyses one JSON line each; re-run the same command if a step timed out.
#
#   bash scripts/gpu_power_table.sh      # from the repository root, on the GPU machine
#
# Prints the kill-rate table (markdown) and copies the records to $OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
OUT="${OUT:-/tmp/spectest-gpu-power}"
WORKERS="${WORKERS:-$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))}"
mkdir -p "$OUT" results/bench
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

step "pools: 16 arms x 4 prompts x 2 configs x 5120 seeds x 12 positions, bundled pair, cuda"
timeout 420 python benchmarks/power_table.py generate --pair bundled --device cuda --batch 4096

step "analyses: 200 H0 + 14 arms x 20 replications at 256 seeds per arm, $WORKERS CPU workers"
for w in $(seq 0 $((WORKERS - 1))); do
  timeout 420 python benchmarks/power_table.py table --pair bundled --workers "$WORKERS" \
    --worker "$w" > "$OUT/table_worker_$w.log" 2>&1 &
done
wait

step "report"
python benchmarks/power_table.py report --pair bundled | tee "$OUT/power_table_bundled.md"
cp results/power_bundled.jsonl results/bench/power_table_bundled.json "$OUT/" 2>/dev/null || true
