#!/usr/bin/env bash
# Issue 32, session 26, in one call of at most ~9 minutes. STEPS picks (default "env tests profile p1"):
#   env      where a process's start goes on this machine: `import torch, transformers, spectest.cli`
#            and transformers' Qwen3 module, timed twice as they are and twice with
#            PYTHONPYCACHEPREFIX (a writable byte-code cache: does this machine compile torch's
#            sources in every process?); whether torch's directory is writable and holds .pyc.
#   tests    pytest -m gpu tests/test_numerics_alone.py tests/test_numerics_replay.py: the floor rows
#            beside the batch decode on their own stream, bit for bit (session 26), on CUDA.
#   profile  tools/gpu/numerics_profile.py --kept --prompts 8 at P1's pair and batch, the floor rows
#            after the batch decode (--no-beside) then beside it: drift_table cold and warm with
#            each step's time. Sets BESIDE_FASTER=1 when beside's cold pass was faster.
#   p1       seed 001's bf16 plan, OLD_TREE against this tree (tools/gpu/identity.sh, P1=1), after
#            one untimed warm-up of each tree; only when the profile step found beside faster (or
#            without the profile step). Prints each side's exit, wall and phases, IDENTICAL or what
#            differs.
#
#   bash tools/gpu/session26.sh OLD_TREE [OUT]   (OLD_TREE: `git archive COMMIT spectest protocols`)
set -uo pipefail
OLD="$1"
cd "$(dirname "$0")/../.."
OUT="${2:-${OUT:-/tmp/spectest-session26}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1 PYTHONPATH="$PWD"
PAIR=(--set models.device=cuda --set batch_size=768 --set models.target=realistic:qwen3-0.6b
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16)
BESIDE_FASTER=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for step in ${STEPS:-env tests profile p1}; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    env)
      python - <<'PY'
import os, torch
d = os.path.dirname(torch.__file__)
print("torch dir", d, "writable", os.access(d, os.W_OK),
      "pyc there", os.path.isdir(os.path.join(d, "__pycache__")))
print("PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"))
PY
      IMP='import time; t=time.perf_counter(); import torch, transformers, spectest.cli; from transformers.models.qwen3 import modeling_qwen3; print(f"imports {time.perf_counter()-t:.2f} s")'
      for i in 1 2; do /usr/bin/time -f "  wall %e s" python -c "$IMP"; done
      for i in 1 2; do PYTHONPYCACHEPREFIX=/tmp/pyc /usr/bin/time -f "  wall %e s (pycache prefix)" python -c "$IMP"; done ;;
    tests)
      timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_numerics_alone.py \
        tests/test_numerics_replay.py 2>&1 | tail -n 8 ;;
    profile)
      for mode in --no-beside ""; do
        echo "--- numerics_profile ${mode:-(beside)}"
        timeout 200 python tools/gpu/numerics_profile.py --kept --prompts 8 $mode "${PAIR[@]}" \
          > "$OUT/profile${mode:-_beside}.txt" 2>&1
        echo "exit $?"
        grep -E "^(load|matched|rounds|drift_table|GRAPH)" "$OUT/profile${mode:-_beside}.txt"
      done
      old=$(grep -oP "drift_table cold: \K[0-9.]+" "$OUT/profile--no-beside.txt")
      new=$(grep -oP "drift_table cold: \K[0-9.]+" "$OUT/profile_beside.txt")
      BESIDE_FASTER=$(python -c "print(int(float('${new:-1e9}') < float('${old:-0}')))")
      echo "beside faster (cold): $BESIDE_FASTER ($old -> $new s)" ;;
    p1)
      if [ "$BESIDE_FASTER" != 1 ]; then echo "skipped: beside not faster"; continue; fi
      SIDE_TIMEOUT="${SIDE_TIMEOUT:-150}" WARMUP=1 P1=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
