#!/usr/bin/env bash
# For the session after 26, on the branch s26-floor-beside (the floor rows beside the batch
# decode): where does a fresh run with it wait? One call of at most ~8 minutes on an H200.
# STEPS picks (default "fresh p1"):
#   fresh  a fresh 32-seed run of seed 001's bf16 plan at P1's pair (the warm-up that did not end
#          in 150 s on the H100 of session 26) under tools/gpu/run_stacks.py: every thread's
#          stack every 45 s (at 45, 90, 135 s; killed at 150 s), GPU use every 10 s. Output to a file (a pipe stays open while the
#          run's spawned processes live); prints its exit, timings and the stacks' spectest
#          frames; then kills what is left of it.
#   gpu    the streams' and the floor rows' GPU tests (tests/test_models_streams.py and the
#          numerics' -m gpu tests).
#   torchws  whether this torch has clearCublasWorkspacesForStream (pytorch#175276).
#   freshold  the same with OLD_TREE's spectest (the old path's timings and memory beside it).
#   p1     P1 OLD_TREE against this tree (tools/gpu/identity.sh, P1=1 WARMUP=1 PYC=1).
#
#   bash tools/gpu/session27.sh OLD_TREE [OUT]   (OLD_TREE: `git archive COMMIT spectest protocols`)
set -uo pipefail
OLD="$1"
cd "$(dirname "$0")/../.."
OUT="${2:-${OUT:-/tmp/spectest-session27}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1 PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for step in ${STEPS:-fresh p1}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    fresh|freshold)
      tree="$PWD"; [ "$step" = freshold ] && tree="$OLD"
      timeout 140 nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader -l 10 \
        > "$OUT/$step-smi.txt" 2>&1 &
      smi=$!
      PYTHONPATH="$tree" RUN_STACKS_REPEAT=1 timeout 150 python tools/gpu/run_stacks.py 45 run --config protocols/openinfer-512.yaml \
        --fast --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
        --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16 \
        --device cuda --set seeds.per_arm=32 --out "$OUT/$step" --no-progress \
        > "$OUT/$step.txt" 2>&1 < /dev/null
      echo "exit $?"
      kill "$smi" 2>/dev/null
      pkill -f "run_stacks.py|multiprocessing.spawn" 2>/dev/null; sleep 2
      grep -A1 "timings" "$OUT/$step.txt"
      grep -vE '^  File|^(Thread|Current thread)|^$' "$OUT/$step.txt" | tail -n 25
      grep -E "^(Thread|Current thread)|spectest/|^mem" "$OUT/$step.txt" | head -n 200
      cat "$OUT/$step-smi.txt"
      rm -rf "$OUT/$step" ;;
    gpu)
      timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_models_streams.py \
        tests/test_numerics_alone.py tests/test_numerics_replay.py > "$OUT/gpu.txt" 2>&1 < /dev/null
      echo "exit $?"; tail -n 15 "$OUT/gpu.txt" ;;
    torchws)  # does this torch clear a stream's cuBLAS workspaces when a graph captured on it
      # is destroyed (pytorch#175276; the sharing bug of pytorch#193402)?
      python -c 'import os, torch; lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"); print(torch.__version__, torch.version.cuda, "clearCublasWorkspacesForStream" in open(lib, "rb").read().decode("latin-1"))' ;;
    p1)
      SIDE_TIMEOUT="${SIDE_TIMEOUT:-150}" WARMUP=1 PYC=1 P1=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
