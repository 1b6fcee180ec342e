#!/usr/bin/env bash
# Session 32 on the device: session 31's native argmax on CUDA and what it saves, sized to the
# card that came. Prints, in order:
#   tvbits  tools/gpu/floor_tvs_bits.py: do the batched floor TVs (reverted in session 31) and
#           one call a row differ in bits here, and a float64 sum over V at 32 vs 288 rows
#   gpu     `pytest -m gpu` of the deferred reads (the native argmax in bfloat16 at logit scale 4
#           against the float32 product's loop), native sampling, host work, fast engine, replay
#   p1      P1 (seed 001's bf16 plan) by this tree and OLD_TREE, new side first, warm-ups, byte
#           code on: IDENTICAL or what differs, each side's phases. On a card under 100 GB at 128
#           seeds per arm (384-row batches fit an H100), else at the plan's full budget
#   genab   two P1 prompt-batches per arm, warm, unprofiled: BASE_TREE (before the native argmax)
#           then this tree — the one-hot arms' walls A/B
#   stacks  session30.sh's genprof with --stacks 6: one P1 prompt-batch of the reference and
#           candidate arms profiled with Python stacks and shapes (which call sites make the casts
#           and full-vocabulary products left on CUDA); the table in the archive's genprof.txt
#   bench   (cards of 100 GB or more) `spectest bench` at 1 024 rows: MFU, this tree's arms
#
#   bash tools/gpu/session32.sh OLD_TREE BASE_TREE OUT    (PARTS="p1 bench": those parts only;
#   default: every part, bench on a card of 100 GB or more, else stacks)
# Run directories are deleted; the text outputs end in OUT/session32.tgz. What ran and what it
# printed: results/LOG.md "lead (session 32)".
set -uo pipefail
OLD="$1"; BASE="$2"; OUT="$3"
cd "$(dirname "$0")/../.."
W="$OUT/w"; mkdir -p "$W"
export PYTHONUNBUFFERED=1
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
if [ "$mem" -lt 100000 ]; then export EXTRA="--set seeds.per_arm=128"; fi
export GPU_TESTS="tests/test_engine_deferred.py tests/test_sampling_native.py
  tests/test_engine_host_work.py tests/test_engine_fast.py tests/test_numerics_replay.py"
last=bench; if [ "$mem" -lt 100000 ]; then last=stacks; fi  # MFU's goal is the H200's
PARTS="${PARTS:-tvbits gpu p1 genab $last}"
for part in $PARTS; do
  case "$part" in
    tvbits)
      echo "=== tvbits ($(date -u +%H:%M:%S))"
      PYTHONPATH="$PWD" timeout 90 python tools/gpu/floor_tvs_bits.py > "$W/tvbits.txt" 2>&1 < /dev/null
      echo "exit $?"; tail -n 4 "$W/tvbits.txt" ;;
    p1)
      echo "P1 at ${EXTRA:-the full budget} (card: $mem MiB)"
      STEPS=p1 bash tools/gpu/session30.sh "$OLD" "$BASE" "$W"
      rm -rf "$W"/p1/old "$W"/p1/new "$W"/p1/warmup-* ;;
    stacks) GENPROF_ARGS="--stacks 6 --top 40" STEPS=genprof bash tools/gpu/session30.sh "$OLD" "$BASE" "$W" ;;
    bench)  # this tree's arms only (the sampled drafter takes no argmax)
      if [ "$mem" -ge 100000 ]; then
        BENCH_ROWS=1024 BENCH_NO_BASE=1 STEPS=bench bash tools/gpu/session30.sh "$OLD" "$BASE" "$W"
      else echo "bench: skipped (an H100; MFU's goal is the H200's)"; fi ;;
    *) STEPS="$part" bash tools/gpu/session30.sh "$OLD" "$BASE" "$W" ;;
  esac
  tar -C "$W" -czf "$OUT/session32.tgz" .  # after each part: a run cut short keeps what ran
done
