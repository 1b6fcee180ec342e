#!/usr/bin/env bash
# Issue 14's power table on the bundled pair in ONE command on a GPU host (built for
# nvidia-h200-x2: 2 GPUs, 32 cores; any number of GPUs, or none: then the pools are made on CPU).
#
#   bash tools/gpu/power_table.sh            # from the repository root; writes to $OUT
#
# Steps, each under a timeout that leaves time for the next (330 + 120 + 30 = 480 s, ~8.3 min
# with start-up; expected ~4–6 min):
#   1. pools   (GEN_TIMEOUT 330 s): one `power_table.py generate` per visible GPU
#              (CUDA_VISIBLE_DEVICES=that GPU), each a disjoint share of the (arm, prompt) pool
#              files dealt round-robin in priority order: every GPU gets half of every arm, so
#              the shares are balanced whatever an arm costs (a speculative arm ~2× the
#              reference on CPU) and the subtle arms finish first. 16 arms × 4 prompts × 2
#              configs × REPS·PER_ARM seeds × 12 positions, then (last) the two H0 pools —
#              reference and exact again, H0_REPS·PER_ARM seeds per cell, so each H0
#              replication is a disjoint slice (independent); white-box columns recorded by the
#              decode loops at generation time (no teacher-forcing pass). If the H0 pools do not
#              finish, H0 resamples the main pools (the report says which). A GPU worker that
#              fails early leaves its files to a CPU pass in the time left.
#   2. table   (TABLE_TIMEOUT 120 s): H0_REPS + 14 arms × REPS analyses at PER_ARM seeds per
#              arm (white-box on, PERMS whole-sequence permutations) on WORKERS = nproc − 2
#              CPU processes; each stops starting analyses before its budget and every record
#              is one JSON line, so a cut step keeps what finished.
#   3. report  (REPORT_TIMEOUT 30 s): the markdown table (kills per configuration, each family
#              alone, H0 false-alarm rates with 95 % upper bounds, the doubling ratio of the
#              issue's criterion, and every arm skipped or short of replications).
# Resumable: pool files and analysis records already on disk are skipped, so re-running the
# same command on the same (warm) machine continues; `STEP=pools` / `STEP=table` (table and
# report) split the job over two calls.
#
# Written to $OUT (≤ 8 files): power_table_<pair>.md, power_table_<pair>.json (summary),
# power_records_<pair>.jsonl (one line per analysis), steps.log (this script's output),
# generate.log, table.log (the worker logs, concatenated).
#
# Knobs (environment): PAIR=bundled REPS=20 PER_ARM=256 H0_REPS=200 PERMS=200 WORKERS
# GEN_TIMEOUT TABLE_TIMEOUT REPORT_TIMEOUT BATCH (rows per forward; GPU 10240, CPU 1024)
# DIR=results (pools, records) OUT=/tmp/spectest-gpu-power STEP=all|pools|table.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT="${OUT:-/tmp/spectest-gpu-power}"
PAIR="${PAIR:-bundled}" REPS="${REPS:-20}" PER_ARM="${PER_ARM:-256}"
H0_REPS="${H0_REPS:-200}" PERMS="${PERMS:-200}" DIR="${DIR:-results}" STEP="${STEP:-all}"
WORKERS="${WORKERS:-$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))}"
GEN_TIMEOUT="${GEN_TIMEOUT:-330}" TABLE_TIMEOUT="${TABLE_TIMEOUT:-120}"
REPORT_TIMEOUT="${REPORT_TIMEOUT:-30}"
mkdir -p "$OUT" "$DIR/logs"
T0=$(date +%s)
step() { echo; echo "=== $* ($(date -u +%H:%M:%S), +$(( $(date +%s) - T0 )) s)"; }
PT=(python benchmarks/power_table.py)
SIZE=(--pair "$PAIR" --reps "$REPS" --per-arm "$PER_ARM" --h0-reps "$H0_REPS" --dir "$DIR")

gen_pass() {  # gen_pass N DEV BATCH TIMEOUT LABEL: N generate workers, wait, one line each
  local n=$1 dev=$2 batch=$3 tmo=$4 label=$5 w rc pids=() dev_env
  for ((w = 0; w < n; w++)); do
    dev_env=(); [ "$dev" = cuda ] && dev_env=(CUDA_VISIBLE_DEVICES="${GPUS[$w]}")
    env "${dev_env[@]}" timeout "$tmo" "${PT[@]}" generate "${SIZE[@]}" --device "$dev" \
      --batch "$batch" --workers "$n" --worker "$w" > "$DIR/logs/generate_${label}_$w.log" 2>&1 &
    pids+=($!)
  done
  for ((w = 0; w < n; w++)); do
    wait "${pids[$w]}"; rc=$?
    echo "generate $label worker $w: exit $rc$([ $rc = 124 ] && echo ' (timed out: re-run to resume)'), $(grep -c ' rows in ' "$DIR/logs/generate_${label}_$w.log") pool files, last: $(tail -n 1 "$DIR/logs/generate_${label}_$w.log")"
  done
}

pools_done() {  # prints how many of the 72 pool files are on disk
  python -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import power_table as pt
n, h = $REPS * $PER_ARM, $H0_REPS * $PER_ARM
print(sum(pt._pool_path(pt._pool_dir(Path('$DIR'), '$PAIR', pt._pool_seeds(a, n, h)), a, p).exists()
          for a in pt.ALL_ARMS for p, _ in pt._prompts('$PAIR')))"
}

main() {

python -c "import torch, transformers, pandas, pyarrow, scipy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'pandas', pandas.__version__)"
step "host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $PAIR pair, $REPS × $PER_ARM seeds per cell"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
# NGPU may be forced (a CPU dry run with NGPU=2 exercises the GPU branch: the cuda workers fail
# at once and the CPU rescue makes the pools)
NGPU=${NGPU:-$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)}
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
  GPUS=(); for ((i = 0; i < NGPU; i++)); do GPUS+=("$i"); done
fi
GPUS=("${GPUS[@]:0:$NGPU}")

if [ "$STEP" = all ] || [ "$STEP" = pools ]; then
  if [ "$NGPU" -gt 0 ]; then
    N=$NGPU DEV=cuda BATCH="${BATCH:-10240}"
  else
    N=$WORKERS DEV=cpu BATCH="${BATCH:-1024}"
  fi
  step "1. pools on $N × $DEV (batch $BATCH, timeout $GEN_TIMEOUT s)"; T_GEN=$(date +%s)
  gen_pass "$N" "$DEV" "$BATCH" "$GEN_TIMEOUT" "$DEV"
  TOTAL=72; DONE=$(pools_done)  # (16 arms + 2 H0 arms) × 4 prompts
  LEFT=$(( GEN_TIMEOUT - ($(date +%s) - T_GEN) ))
  echo "pool files on disk: $DONE of $TOTAL"
  if [ "$DEV" = cuda ] && [ "$DONE" -lt "$TOTAL" ] && [ "$LEFT" -gt 60 ]; then
    # a GPU worker failed early (not a timeout): the CPU cores make the rest in the time left
    step "1b. rescue: the missing pool files on $WORKERS CPU workers (timeout $LEFT s)"
    gen_pass "$WORKERS" cpu 1024 "$LEFT" cpu
    echo "pool files on disk: $(pools_done) of $TOTAL"
  fi
  tail -n +1 "$DIR"/logs/generate_*.log > "$OUT/generate.log" 2>/dev/null
fi

if [ "$STEP" = all ] || [ "$STEP" = table ]; then
  BUDGET=$(( TABLE_TIMEOUT > 30 ? TABLE_TIMEOUT - 20 : TABLE_TIMEOUT ))
  step "2. analyses: $H0_REPS H0 + 14 arms × $REPS at $PER_ARM seeds per arm, $PERMS permutations, $WORKERS CPU workers (budget $BUDGET s, timeout $TABLE_TIMEOUT s)"
  pids=()
  for ((w = 0; w < WORKERS; w++)); do
    timeout "$TABLE_TIMEOUT" "${PT[@]}" table "${SIZE[@]}" \
      --perms "$PERMS" --budget-s "$BUDGET" --workers "$WORKERS" --worker "$w" \
      > "$DIR/logs/table_$w.log" 2>&1 &
    pids+=($!)
  done
  fails=0
  for ((w = 0; w < WORKERS; w++)); do
    wait "${pids[$w]}"; rc=$?
    if [ $rc != 0 ]; then
      fails=$((fails + 1)); echo "table worker $w: exit $rc — $(tail -n 1 "$DIR/logs/table_$w.log")"
    fi
  done
  echo "table workers: $WORKERS, failed or timed out: $fails"
  tail -n +1 "$DIR"/logs/table_*.log > "$OUT/table.log" 2>/dev/null

  step "3. report (timeout $REPORT_TIMEOUT s)"
  mkdir -p "$DIR/bench"
  timeout "$REPORT_TIMEOUT" "${PT[@]}" report "${SIZE[@]}" \
    --md "$DIR/bench/power_table_$PAIR.md" --json "$DIR/bench/power_table_$PAIR.json"
  echo "report: exit $?"
  cp "$DIR/bench/power_table_$PAIR.md" "$DIR/bench/power_table_$PAIR.json" "$OUT/" 2>/dev/null
  cat "$DIR/power_$PAIR"/w*.jsonl > "$OUT/power_records_$PAIR.jsonl" 2>/dev/null
fi
step "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee -a "$OUT/steps.log"
