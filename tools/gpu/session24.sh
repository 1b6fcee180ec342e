#!/usr/bin/env bash
# The checks session 24 left for a device (issue 32; results/LOG.md "lead (session 24)"), in one
# call of at most ~9 minutes. STEPS picks them (default "tests p1 numerics"):
#   tests     pytest -m gpu on the session's changes: the tooth-size process spawned early, granted
#             and capped, and declining on its own measurement (tests/test_teeth_beside.py); the
#             verify logits kept at generation on CUDA (tests/test_numerics_replay.py); the fast
#             loop and the shortlist rounds (tests/test_engine_fast.py, tests/test_rejection_exact.py).
#             Prints pytest's summary.
#   p1        seed 001's bf16 plan, OLD_TREE against this tree (tools/gpu/identity.sh, P1=1
#             WARMUP=1): each side's exit and wall, its phases, then IDENTICAL or what differs.
#             Expected: the ε arm ~3 s and numerics ~3 s faster, the wall ~8 s shorter; the tables
#             identical (an ε draw may flip where a CUDA parallel scan rounds otherwise, ~1e-16 a
#             draw: docs/internals.md "spectest/sampling/laws.py").
#   numerics  tools/gpu/numerics_profile.py on P1's pair, 8 prompts, without and with --kept: the
#             drift table's cold and warm wall and its parts (the verify replay gone with --kept).
#
#   bash tools/gpu/session24.sh OLD_TREE [OUT]     (OLD_TREE: `git archive ec72dc5 spectest
#                                                  protocols | tar -x -C OLD_TREE`)
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD="$1"
OUT="${2:-${OUT:-/tmp/spectest-session24}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1
STEPS="${STEPS:-tests p1 numerics}"
# DEVICE, TARGET, DRAFT, PROMPTS: a dry run elsewhere (DEVICE=cpu TARGET=realistic:qwen3-tiny,
# draft_layers=1 DRAFT=derived:first_layers,layers=1 PROMPTS=2 STEPS=numerics)
PAIR=(--set "models.device=${DEVICE:-cuda}" --set batch_size=768
      --set "models.target=${TARGET:-realistic:qwen3-0.6b}"
      --set "models.draft=${DRAFT:-derived:first_layers,layers=4}" --set models.dtype=bfloat16)
for step in $STEPS; do
  echo "=== $step"
  case "$step" in
    tests)
      timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_teeth_beside.py \
        tests/test_numerics_replay.py tests/test_engine_fast.py tests/test_rejection_exact.py \
        2>&1 | tail -n 15 ;;
    p1)
      SIDE_TIMEOUT="${SIDE_TIMEOUT:-120}" P1=1 WARMUP=1 bash tools/gpu/identity.sh "$OLD" "$OUT/p1" ;;
    numerics)
      for kept in "" --kept; do
        echo "--- numerics_profile ${kept:-(replay)}"
        PYTHONPATH=. timeout 150 python tools/gpu/numerics_profile.py --prompts "${PROMPTS:-8}" $kept "${PAIR[@]}" \
          2>&1 | grep -E "^(load|matched|drift_table)"
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
