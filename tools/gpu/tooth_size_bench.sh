#!/usr/bin/env bash
# Issue 24, P1's tooth-size phase on the H200 (<= 90 s): the fast path against its slow
# reference (tooth_sizes(..., reference=True), the implementation before the speed work), side by
# side in one process, at Qwen3-0.6B shape (realistic:qwen3-0.6b, derived:first_layers,layers=4,
# bf16) for the openinfer-512 plan's teeth, its first 2 prompts x 3 configs. Prints each wall
# time, the speed-up and the largest |d tv| / |d slack| between the two tables; exit 1 when the
# statuses differ or a TV differs by more than 1e-9 (on CUDA the fast path's plain law and its
# weighted sum of rows are the device's float64, not the host's: a last-bits difference).
#
#   bash tools/gpu/tooth_size_bench.sh      # from the repository root, on the GPU machine
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "=== tooth sizes, reference vs fast, 0.6B shape bf16 ($(date -u +%H:%M:%S))"
timeout 80 python tools/gpu/tooth_size_compare.py --config protocols/openinfer-512.yaml \
  --prompts "${PROMPTS:-2}" --tol 1e-9 \
  --set models.device=cuda --set models.dtype=bfloat16 \
  --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
rc=$?
echo "=== rc $rc ($(date -u +%H:%M:%S))"
exit $rc
