#!/usr/bin/env bash
# Issue 32, session 25, in one call of at most ~8 minutes. STEPS picks (default "tests p1 shipped"):
#   tests  pytest -m gpu tests/test_teeth_beside.py: the tooth-size process spawned early, granted
#          and capped on CUDA (session 24's cap raised ValueError on a device without an index
#          there, and the sizes fell back to after generation). Prints pytest's summary.
#   p1     seed 001's bf16 plan, OLD_TREE against this tree (tools/gpu/identity.sh, P1=1), after
#          one untimed warm-up of this tree (32 seeds per arm: the machine's first compiles and
#          loads), with the device's memory sampled every 0.5 s (nvidia-smi). Prints the card,
#          each side's exit, wall and phases, IDENTICAL or what differs, each side's peak device
#          memory (MiB) and its lines about the tooth-size process or running out of memory.
#
#   shipped  seed 001's plan as shipped (batch_size 256, not P1's 768) at P1's pair in bf16 on the
#          fast engine, this tree only: its verdict and claim (b)'s line (a 32-seed warm-up at
#          96-row batches ended DIFFERENT, "drift beyond numerics": the batch floor was
#          identically 0 there and `auto` took the prefill floor).
#
#   bash tools/gpu/session25.sh OLD_TREE [OUT]   (OLD_TREE: `git archive COMMIT spectest protocols`)
set -uo pipefail
OLD="$1"
cd "$(dirname "$0")/../.."
OUT="${2:-${OUT:-/tmp/spectest-session25}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for step in ${STEPS:-tests p1 shipped}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    tests)
      timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_teeth_beside.py 2>&1 \
        | tail -n 6 ;;
    p1)
      timeout 200 python -m spectest run --config protocols/openinfer-512.yaml --fast \
        --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
        --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16 \
        --device cuda --set seeds.per_arm=32 --out "$OUT/warmup" --no-progress > /dev/null 2>&1
      echo "warm-up (this tree): exit $?"; rm -rf "$OUT/warmup"
      (while :; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)"
        sleep 0.5; done) > "$OUT/mem.txt" &
      sampler=$!
      t0=$(date +%s)
      SIDE_TIMEOUT="${SIDE_TIMEOUT:-150}" P1=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1"
      kill "$sampler" 2>/dev/null
      # each side runs from the end of the one before it (its console file's mtime) to its own
      before=$t0
      for side in old new; do
        end=$(stat -c %Y "$OUT/p1/$side.console.txt" 2>/dev/null || echo 0)
        peak=$(awk -v a="$before" -v b="$end" '$1 >= a && $1 <= b + 1 {print $2}' "$OUT/mem.txt" | sort -n | tail -n 1)
        echo "--- $side: peak device memory used ${peak:-?} MiB"
        grep -iE "tooth-size process|out of memory|declined|worker cuda" "$OUT/p1/$side.console.txt" | cut -c1-300 | head -n 5
        before=$end
      done ;;
    shipped)
      timeout 150 python -m spectest run --config protocols/openinfer-512.yaml --fast \
        --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4" \
        --set models.dtype=bfloat16 --device cuda --out "$OUT/shipped" --no-progress \
        > "$OUT/shipped.console.txt" 2>&1
      echo "shipped plan: exit $?"
      grep -E "^(EQUIVALENT|DIFFERENT|INCONCLUSIVE)|numerics drift|timings" -A1 "$OUT/shipped.console.txt" | cut -c1-400
      rm -rf "$OUT/shipped" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
