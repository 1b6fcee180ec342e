#!/usr/bin/env bash
# Session 4, second H200 call (nvidia-h200-x2), after h12 (white-box columns on candidate laws):
# GPU tests; on GPU 1 the issue's Qwen3 command again (16 seeds) to count the ε arm's acceptances;
# on GPU 0 the one-hot P2 bench that crashed in call A and a white-box bench at P1's batch; then
# P1 at batch 768 on one GPU and on both (scale-out), checked equal. Outputs under $OUT.
set -u; cd "$(dirname "$0")/.."; OUT=${OUT:-/tmp/gpu-session4}; mkdir -p "$OUT"
export PYTHONPATH=$PWD SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
echo "=== GPU tests $(date -u +%T)"
timeout 170 python -m pytest -q -m gpu tests/test_engine_fast.py tests/test_engine_gpu.py \
  tests/test_attention.py tests/test_rejection_exact.py tests/test_scaleout.py 2>&1 | tail -3
(CUDA_VISIBLE_DEVICES=1 SEEDS=16 timeout 200 bash scripts/gpu_bf16.sh builtin $OUT/i12 > $OUT/i12.log 2>&1) &
B=(--device cuda:0 --target realistic:qwen3-0.6b --draft derived:first_layers,layers=4 --positions 32
   --k 4 --peak-tflops 800 --out $OUT/bench.jsonl)
echo "=== P2 256 one-hot $(date -u +%T)"
timeout 120 python -m spectest bench "${B[@]}" --rows 256 --drafter onehot --assisted-rows 4 \
  --arms fast-plain,fast-spec,hf-generate,hf-assisted,builtin-plain 2>&1 | tail -10
echo "=== bench --whitebox 768 sampled $(date -u +%T)"
timeout 90 python -m spectest bench "${B[@]}" --rows 768 --drafter sampled --whitebox \
  --arms fast-plain,fast-spec 2>&1 | tail -6
echo "=== bench --whitebox 768 one-hot $(date -u +%T)"
timeout 90 python -m spectest bench "${B[@]}" --rows 768 --drafter onehot --whitebox \
  --arms fast-plain,fast-spec 2>&1 | tail -6
wait
echo "=== issue 12: the ε arm's rounds $(date -u +%T)"; grep -v "^RESULT" $OUT/i12.log | tail -3
python -c "import pandas as pd; r=pd.read_parquet('$OUT/i12/openinfer-qwen3-0.6b-bf16/rounds.parquet'); print(r.groupby(['arm','config_id'])[['drafted','accepted']].sum())"
P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress --set batch_size=768
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
t() { python -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); print(s['verdict']['headline'][:90]); print(json.dumps(s.get('timings')))" "$1"; }
echo "=== P1 one GPU $(date -u +%T)"
/usr/bin/time -f "wall %e s" timeout 150 python -m spectest run "${P1[@]}" --devices cuda:0 --out $OUT/p1-1 2>&1 | tail -1; t $OUT/p1-1
echo "=== P1 both GPUs $(date -u +%T)"
/usr/bin/time -f "wall %e s" timeout 120 python -m spectest run "${P1[@]}" --out $OUT/p1-2 2>&1 | tail -1; t $OUT/p1-2
python -c "import pandas as pd,sys; [pd.testing.assert_frame_equal(*[pd.read_parquet(f'$OUT/p1-{d}/{n}.parquet') for d in (1,2)]) for n in ('samples','rounds','histograms')]; print('samples, rounds, histograms equal: 1 GPU vs 2')"
echo "=== done $(date -u +%T)"
