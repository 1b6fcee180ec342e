#!/usr/bin/env bash
# Issue 32, P1's generate phase host-bound: an OLD tree against this one on one prompt-batch of
# P1 (openinfer-512, realistic:qwen3-0.6b + derived:first_layers,layers=4, bf16, --fast, 768 rows
# x 32 positions, white-box on), in one device call of <= 90 s on one H200. Each tree in its own
# process (tools/gpu/generate_ab.py): per arm (reference, candidate) cold and warm wall seconds and
# the profiled host calls (cudaLaunchKernel, cudaGraphLaunch, cudaStreamSynchronize,
# cudaMemcpyAsync); then whether the two trees' samples (white-box columns included) and rounds
# are equal (pandas DataFrame.equals), and warm new / old per arm.
#
#   bash tools/gpu/generate_ab.sh .gpu_old      # $1: a directory holding the old spectest/
#   (e.g. mkdir .gpu_old && git archive main spectest | tar -x -C .gpu_old)
# NO_PROFILE=1 skips the profiled runs; LIMIT (default 75) bounds each tree's process in seconds.
# About 30-40 s per tree on an H200 (load ~7 s, graph captures in the cold runs).
set -u
OLD="$(cd "${1:?usage: generate_ab.sh OLD_TREE (a directory holding the old spectest/)}" && pwd)"
cd "$(dirname "$0")/../.."
NEW="$PWD"
[ -d "$OLD/spectest" ] || { echo "no spectest/ in $OLD"; exit 2; }
OUT="${OUT:-/tmp/spectest-generate-ab}"
rm -rf "$OUT/old" "$OUT/new"
mkdir -p "$OUT"
export SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-cuda}"
SETS=(--set "models.device=$DEVICE" --set batch_size=768 --set models.target=realistic:qwen3-0.6b
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16)
[ -n "${EXTRA:-}" ] && SETS+=($EXTRA)
echo "old tree: $OLD   new tree: $NEW   ($(date -u +%H:%M:%S))"
for side in old new; do
  tree=$OLD; [ "$side" = new ] && tree=$NEW
  PYTHONPATH="$tree" timeout "${LIMIT:-75}" python "$NEW/tools/gpu/generate_ab.py" --label "$side" \
    --out "$OUT" "${SETS[@]}" ${NO_PROFILE:+--no-profile} 2>&1 | grep -v Warning
done
python - "$OUT" <<'PY'
import re, sys
from pathlib import Path
import pandas as pd
out = Path(sys.argv[1])
for f in sorted((out / "new").glob("*.parquet")):
    old = out / "old" / f.name
    same = old.exists() and pd.read_parquet(old).equals(pd.read_parquet(f))
    print(f"{f.name}: {'EQUAL' if same else 'DIFFERENT (or missing in old)'}")
PY
echo "done ($(date -u +%H:%M:%S))"
