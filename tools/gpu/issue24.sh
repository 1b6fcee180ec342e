#!/usr/bin/env bash
# Issue 24 on one H200 in one command (<= 9 min): the fast arms' torch-profiler tables at 1024
# rows, `spectest bench` side by side (P2: fast plain / fast speculative / transformers' plain
# generate, batch 256 and 1024, both drafters), the P1 plan with its phases, optionally the GPU
# tests and P1-8B. Everything measured goes to stdout and $OUT/log; bench records to
# $OUT/bench.jsonl.
#
#   bash tools/gpu/issue24.sh profile   # profiles + P2 at 1024 + P1 (the "before" call)
#   bash tools/gpu/issue24.sh after     # GPU tests + P2 (256 and 1024, both drafters) + P1
#   bash tools/gpu/issue24.sh 8b        # P1-8B: the plan at Qwen3-8B shape + transformers' figures
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spectest-issue24}"
mkdir -p "$OUT"
MODE="${1:-profile}"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
git log -1 --oneline 2>/dev/null || true
step "start-up: interpreter + spectest CLI imports"
/usr/bin/time -f "import wall %e s" python -c "import spectest.cli" 2>&1 | tail -1

PAIR=(--target realistic:qwen3-0.6b --draft derived:first_layers,layers=4)
B=(--device cuda "${PAIR[@]}" --positions 32 --k 4 --peak-tflops 800 --out "$OUT/bench.jsonl")
P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress --set batch_size=768
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
summary() {
  python -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); print(sys.argv[1], s['verdict']['decision'], json.dumps(s.get('timings')))" "$1" || true
}
if [ "$MODE" = profile ]; then
  step "profile: 1024 rows, sampled drafter (top CUDA ops of each fast arm)"
  timeout 150 python -m spectest bench "${B[@]}" --rows 1024 --drafter sampled \
    --arms fast-plain,fast-spec --profile "$OUT/prof" --no-baseline 2>&1 | grep -v "^\s*$" | head -120
  rm -f "$OUT"/prof/*.json  # traces are large; the tables above are the record
fi
if [ "$MODE" = after ]; then
  step "micro-bench: top-k and the top-p normaliser at V = 151936 (kernel vs torch)"
  timeout 90 python tools/gpu/sampling_kernels_bench.py 2>&1 | tail -4
  step "P2: 256 rows, one-hot drafter"
  timeout 60 python -m spectest bench "${B[@]}" --rows 256 --drafter onehot \
    --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
  step "P2: 256 rows, sampled drafter"
  timeout 60 python -m spectest bench "${B[@]}" --rows 256 --drafter sampled \
    --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
fi
if [ "$MODE" = profile ] || [ "$MODE" = after ]; then
  step "P2: 1024 rows, sampled drafter"
  timeout 75 python -m spectest bench "${B[@]}" --rows 1024 --drafter sampled \
    --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
  if [ "$MODE" = after ]; then
    step "P2: 1024 rows, sampled drafter, SPECTEST_NO_KERNELS=1 (the torch normaliser: before/after)"
    SPECTEST_NO_KERNELS=1 timeout 75 python -m spectest bench "${B[@]}" --rows 1024 \
      --drafter sampled --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
  fi
  step "P2: 1024 rows, one-hot drafter"
  timeout 75 python -m spectest bench "${B[@]}" --rows 1024 --drafter onehot \
    --arms fast-plain,fast-spec,hf-generate 2>&1 | tail -8
  step "P1: the seed-001 plan at 0.6B shape, bf16, batch 768 (target <= 30 s wall)"
  /usr/bin/time -f "P1 wall %e s" timeout 170 python -m spectest run "${P1[@]}" --devices cuda:0 \
    --out "$OUT/p1" 2>&1 | tail -6
  summary "$OUT/p1"
fi
if [ "$MODE" = after ]; then
  step "tooth sizes (P1's largest phase): one prompt under cProfile"
  timeout 90 python tools/gpu/tooth_size_profile.py --set models.device=cuda \
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4" \
    --set models.dtype=bfloat16 2>&1 | head -40
  step "GPU tests"
  timeout 170 python -m pytest -q -m gpu -x 2>&1 | tail -8
fi
if [ "$MODE" = 8b ]; then
  B8=(--device cuda --target realistic:qwen3-8b --draft derived:first_layers,layers=4 --positions 32
      --k 4 --peak-tflops 800 --out "$OUT/bench.jsonl")
  step "P1-8B: bench 256 rows sampled + hf-assisted (batch 1, 2 rows)"
  timeout 150 python -m spectest bench "${B8[@]}" --rows 256 --drafter sampled --assisted-rows 2 \
    --arms fast-plain,fast-spec,hf-generate,hf-assisted 2>&1 | tail -8
  step "P1-8B: the plan at Qwen3-8B shape (target <= 180 s)"
  /usr/bin/time -f "P1-8B wall %e s" timeout 240 python -m spectest run "${P1[@]}" --devices cuda:0 \
    --set models.target=realistic:qwen3-8b --out "$OUT/p1-8b" 2>&1 | tail -6
  summary "$OUT/p1-8b"
fi
rm -rf "$OUT/p1" "$OUT/p1-8b" "$OUT/prof"  # run dirs are large; summaries printed above
echo; echo "=== done ($(date -u +%H:%M:%S))"
