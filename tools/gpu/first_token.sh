#!/usr/bin/env bash
# Issue 31, position 0 on the H200 (prepared by h67 on CPU, not run: no GPU in that session): is
# hf-assisted's FIRST token distributed as the plain law π at the prompt in bfloat16 at Qwen3-0.6B
# shape? The bf16 teacher-forced run (results/LOG.md lead session 8) read claim (b) "beyond" (U1
# 1.40e-3 per unit) without a per-unit readout; on CPU in float32 the one extreme unit (position
# 0 of t1.0-k50) was chance (results/LOG.md h67: 32 000 fresh draws, no difference).
#
#   protocols/hf-assisted-floor.yaml with the same overrides as tools/gpu/hf_assisted_teacher.sh
#   (realistic:qwen3-0.6b + derived:first_layers,layers=4, bfloat16, cuda, configs t1.0-k50 and
#   t0.7-k20-p0.9, K = 4, the same prompt and run key). tools/readouts/first_token.py draws N first
#   tokens of hf-assisted (one generate of K + 1 tokens per seed) and 4 096 of hf-generate (batches
#   of 64, the control) per config and tests each sample against π (U1 with its null sd and Monte
#   Carlo p, pooled χ²), and prints the exact TV between π (a forward over the prompt + 1 token)
#   and the law at the same position from a forward of generate's prefill shape and of assisted
#   generation's first verify shape (prompt + K): bf16 numerics, no sampling; and for hf-assisted
#   the first token's exact law implied by round 1's own tensors (round_one_tv, 20 calls).
#
# Budget: about 0.1 s per hf-assisted draw at this shape (the bf16 run: 146 s for 900 sequences
# of 8 tokens), N = 1200 per config: ~4 minutes for hf-assisted, < 1 minute for hf-generate, plus
# two model loads. Under 5 minutes on one H200.
#
# Usage: tools/gpu/first_token.sh   Env: N (default 1200), DEVICE (default cuda), EXTRA (more
#        first_token.py arguments; a CPU smoke test: N=10 DEVICE=cpu EXTRA="--set
#        models.target=bundled:target --set models.draft=bundled:draft --set models.dtype=float32")
# Prints one line per (engine, config) (tools/readouts/first_token.py) and the wall time.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
N=${N:-1200}
DEVICE=${DEVICE:-cuda}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
SETS=(--set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
  --set models.dtype=bfloat16 --set "models.device=$DEVICE"
  --set "configs={t1.0-k50: {temperature: 1.0, top_k: 50}, t0.7-k20-p0.9: {temperature: 0.7, top_k: 20, top_p: 0.9}}")
t0=$(date +%s)
python tools/readouts/first_token.py protocols/hf-assisted-floor.yaml --count "$N" \
  "${SETS[@]}" "${EXTRA_ARGS[@]}" 2>&1 | grep -v Warning
python tools/readouts/first_token.py protocols/hf-assisted-floor.yaml --engine hf-generate \
  --start 100000 --count 4096 "${SETS[@]}" "${EXTRA_ARGS[@]}" 2>&1 | grep -v Warning
echo "wall $(( $(date +%s) - t0 )) s"
