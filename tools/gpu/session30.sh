#!/usr/bin/env bash
# Session 30 on the device: the attention kernel's shared prompt reads (a prompt copied to every
# row read from row 0), session 29's prompt-prefill graphs on the H200 (MFU, P1), what a forward
# launches. STEPS picks (default "gpu kernels p1 bench timeline"):
#   gpu       the -m gpu tests of the attention kernel, the fast engine and claim (b)'s replay
#   kernels   tools/gpu/forward_kernels.py at 1 and 768 rows: kernels of one decode step by name,
#             and a graph replay's ms (the floor rows of claim (b) are one-row forwards)
#   p1        P1 itself (peak ~95 GB: an H200), OLD_TREE against this tree, new side first, warm-ups
#   bench     P2: `spectest bench` fast-plain, fast-spec and transformers' generate, 5 rounds, at
#             1024 and 256 rows (OUT/bench.jsonl); then BASE_TREE's fast arms (OUT/bench-base.jsonl)
#   timeline  P1 once more under tools/gpu/p1_timeline.sh: the device's utilisation per second
#   numerics  tools/gpu/numerics_profile.py --kept --prompts 8 at P1's pair and batch: the drift
#             table's parts (batch decode, floor rows beside it, TVs), cold and warm
#   genprof   tools/gpu/generate_profile.py: one P1 prompt-batch of the reference and candidate
#             arms, warm, under torch.profiler (wall, CUDA time, syncs, top ops)
#   genab     the same for BASE_TREE's spectest then this tree's, 2 prompts: the arms' walls A/B
#
#   bash tools/gpu/session30.sh OLD_TREE BASE_TREE [OUT]
#   (each tree: `git archive COMMIT spectest protocols | tar -x -C TREE`; env: GPU_TESTS the gpu
#   step's files, BENCH_ROWS the bench step's row counts, BENCH_NO_BASE=1 its base tree skipped,
#   GENPROF_ARGS more arguments of the genprof step's generate_profile.py). What ran and what it printed:
#   results/LOG.md "lead (session 30)".
set -uo pipefail
OLD="$1"
BASE="$(cd "$2" && pwd)"
cd "$(dirname "$0")/../.."
OUT="${3:-${OUT:-/tmp/spectest-session30}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PAIR=(--set models.device=cuda --set batch_size=768 --set models.target=realistic:qwen3-0.6b
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16)
bench() {  # TREE ROWS ARMS RECORD
  (cd "$1" && PYTHONPATH="$1" timeout 150 python -m spectest bench --device cuda \
    --target realistic:qwen3-0.6b --draft derived:first_layers,layers=4 --positions 32 --k 4 \
    --peak-tflops 800 --drafter sampled --repeat 5 --arms "$3" --rows "$2" --out "$4" \
    > "$4.$2.txt" 2>&1 < /dev/null)
  echo "exit $?"; tail -n 12 "$4.$2.txt"
}
for step in ${STEPS:-gpu kernels p1 bench timeline}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    gpu)
      PYTHONPATH="$PWD" timeout 300 python -m pytest -q -m gpu -p no:cacheprovider ${GPU_TESTS:-\
        tests/test_decode_attention.py tests/test_engine_fast.py tests/test_numerics_alone.py \
        tests/test_numerics_replay.py tests/test_engine_deferred.py} > "$OUT/gpu.txt" 2>&1 < /dev/null
      echo "exit $?"; tail -n 12 "$OUT/gpu.txt" ;;
    kernels)
      PYTHONPATH="$PWD" timeout 120 python tools/gpu/forward_kernels.py --rows 1,768 --top 30 \
        > "$OUT/kernels.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^fused|^== |graph replay" "$OUT/kernels.txt" ;;
    p1)
      P1=1 WARMUP=1 SIDE_TIMEOUT=200 ORDER="new old" PYC=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    bench)
      for rows in ${BENCH_ROWS:-1024 256}; do
        bench "$PWD" "$rows" fast-plain,fast-spec,hf-generate "$OUT/bench.jsonl"
        if [ -z "${BENCH_NO_BASE:-}" ]; then bench "$BASE" "$rows" fast-plain,fast-spec "$OUT/bench-base.jsonl"; fi
      done ;;
    timeline)
      bash tools/gpu/p1_timeline.sh "$OUT/timeline" > "$OUT/timeline.txt" 2>&1 < /dev/null
      cat "$OUT/timeline.txt"; rm -rf "$OUT/timeline/p1" ;;
    numerics)
      PYTHONPATH="$PWD" timeout 200 python tools/gpu/numerics_profile.py --kept --prompts 8 \
        "${PAIR[@]}" > "$OUT/numerics.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^(load|matched|rounds|drift_table|GRAPH)" "$OUT/numerics.txt" ;;
    genprof)
      PYTHONPATH="$PWD" timeout 200 python tools/gpu/generate_profile.py --arms reference,candidate \
        --top 30 "${PAIR[@]}" ${GENPROF_ARGS:-} > "$OUT/genprof.txt" 2>&1 < /dev/null
      echo "exit $?"; grep -E "^(load|==|reference|candidate)" "$OUT/genprof.txt" ;;
    genab)
      for tree in "$BASE" "$PWD"; do
        echo "--- $tree"
        PYTHONPATH="$tree" timeout 200 python tools/gpu/generate_profile.py --prompts 2 \
          --arms reference,candidate --top 5 "${PAIR[@]}" > "$OUT/genab.txt" 2>&1 < /dev/null
        echo "exit $?"; grep -E "^(load|==)" "$OUT/genab.txt"
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
