#!/usr/bin/env bash
# Issue 13 on one H200 in one command (<= 8 min): the fast engine's GPU tests, `spectest bench`
# at Qwen3-0.6B shape with the realistic pair (P2), and the openinfer-512 plan at that shape on
# the fast engine with per-phase times (P1). Everything measured goes to stdout, the bench records
# to results/bench/bench.jsonl, the run summaries to $OUT.
#
#   bash scripts/gpu_bench.sh            # from the repository root, on one H200
#   bash scripts/gpu_bench.sh multi      # on nvidia-h200-x2: 2 GPUs vs 1 (equal samples, P1 time)
#
# Each step has its own timeout so one slow step cannot eat the others' time.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SPECTEST_NO_PROGRESS=1
OUT="${OUT:-/tmp/spectest-gpu-bench}"
mkdir -p "$OUT" results/bench
PAIR=(--target realistic:qwen3-0.6b --draft derived:first_layers,layers=4)
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
if [ "${1:-}" = multi ]; then
  step "scale-out test: a cuda run over every GPU == the same run on one GPU"
  timeout 150 python -m pytest -q -m gpu tests/test_scaleout.py 2>&1 | tail -4
  for dev in cuda:0 all; do
    step "P1 full plan, white-box off, devices=$dev"
    extra=(); [ "$dev" = all ] || extra=(--devices "$dev")
    /usr/bin/time -f "wall %e s" timeout 150 python -m spectest run "${P1[@]}" "${extra[@]}" \
      --set tests.whitebox=false --out "$OUT/p1-multi-$dev" 2>&1 | tail -5
  done
  python -c "import pandas as pd,sys; pd.testing.assert_frame_equal(*[pd.read_parquet(f'{sys.argv[1]}/p1-multi-{d}/samples.parquet') for d in ('cuda:0','all')]); print('samples equal: 1 GPU vs all GPUs')" "$OUT"
  exit 0
fi

step "GPU tests: CUDA graphs == eager static cache; built-in engine on CUDA"
timeout 70 python -m pytest -q -m gpu tests/test_engine_fast.py tests/test_engine_gpu.py 2>&1 | tail -6

step "P2: bench, batch 256 x 32 tokens, K=4 one-hot drafter, t 0.8 p 0.95, bf16"
timeout 150 python -m spectest bench --device cuda "${PAIR[@]}" --rows 256 --positions 32 --k 4 \
  --drafter onehot --assisted-rows 4 --peak-tflops 800 \
  --arms fast-plain,fast-spec,hf-generate,hf-assisted,builtin-plain --out results/bench/bench.jsonl

step "P2: fast speculative arm with a sampled drafter (acceptance of the realistic pair)"
timeout 45 python -m spectest bench --device cuda "${PAIR[@]}" --rows 256 --positions 32 --k 4 \
  --drafter sampled --peak-tflops 800 --arms fast-spec,hf-generate --out results/bench/bench.jsonl

step "P2 diagnosis: torch profiler of the fast arms (top ops by CUDA time; traces in $OUT/profile)"
timeout 50 python -m spectest bench --device cuda "${PAIR[@]}" --rows 256 --positions 32 --k 4 \
  --arms fast-plain,fast-spec --profile "$OUT/profile" --out "$OUT/profile.jsonl" 2>&1 | tail -45

step "P1: the full plan, 256 seeds/arm, white-box off (generation + analysis; target <= 60 s)"
/usr/bin/time -f "wall %e s" timeout 120 python -m spectest run "${P1[@]}" --set tests.whitebox=false \
  --out "$OUT/p1-256-nowb" 2>&1 | tail -8

step "P1: 32 seeds/arm with white-box (columns recorded at generation time; baseline 342 s built-in)"
/usr/bin/time -f "wall %e s" timeout 75 python -m spectest run "${P1[@]}" --seeds 32 \
  --out "$OUT/p1-32-wb" 2>&1 | tail -8
for d in "$OUT"/p1-*; do
  [ -f "$d/summary.json" ] && python -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); m=json.load(open(sys.argv[1]+'/manifest.json')); print(sys.argv[1], s['verdict']['decision'], json.dumps(s.get('timings')), 'engines:', json.dumps(m['provenance'].get('engines')))" "$d"
done
echo; echo "=== done ($(date -u +%H:%M:%S)); bench records:"; tail -n 7 results/bench/bench.jsonl | cut -c1-400
