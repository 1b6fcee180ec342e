#!/usr/bin/env bash
# Session 4, first H200 call (nvidia-h200-x2): GPU tests; P2 benches on GPU 0 while GPU 1 runs issue
# 12's bf16 steps (the issue's Qwen3 command at 16 seeds; hf-assisted bf16). Outputs under $OUT.
set -u; cd "$(dirname "$0")/.."; OUT=${OUT:-/tmp/gpu-session4}; mkdir -p "$OUT"
export PYTHONPATH=$PWD SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== GPU tests $(date -u +%T)"; timeout 170 python -m pytest -q -m gpu tests/test_engine_fast.py tests/test_engine_gpu.py tests/test_attention.py tests/test_scaleout.py 2>&1 | tail -4
echo "=== issue 12 steps on GPU 1 in the background $(date -u +%T)"
(CUDA_VISIBLE_DEVICES=1 SEEDS=16 timeout 300 bash scripts/gpu_bf16.sh builtin,hf $OUT/i12 > $OUT/i12.log 2>&1) &
B=(--device cuda:0 --target realistic:qwen3-0.6b --draft derived:first_layers,layers=4 --positions 32 --k 4 --peak-tflops 800 --out $OUT/bench.jsonl)
echo "=== P2 256 onehot $(date -u +%T)"; timeout 120 python -m spectest bench "${B[@]}" --rows 256 --drafter onehot --assisted-rows 4 --arms fast-plain,fast-spec,hf-generate,hf-assisted,builtin-plain 2>&1 | tail -10
echo "=== P2 256 sampled $(date -u +%T)"; timeout 90 python -m spectest bench "${B[@]}" --rows 256 --drafter sampled --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
echo "=== P2 1024 sampled $(date -u +%T)"; timeout 90 python -m spectest bench "${B[@]}" --rows 1024 --drafter sampled --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
wait; echo "=== issue 12 log $(date -u +%T)"; grep -v "^RESULT" $OUT/i12.log | tail -8; grep "^RESULT" $OUT/i12.log | cut -c1-1500
