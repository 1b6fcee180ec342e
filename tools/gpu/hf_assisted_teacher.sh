#!/usr/bin/env bash
# Issue 31 on the H200 (prepared by h60, not run: no GPU in that session): transformers' assisted
# generation in bfloat16 at Qwen3-0.6B shape, batch 1, with claim (b) TEACHER-FORCED — both
# claims in the verdict.
#
#   protocols/hf-assisted-floor.yaml with its floor arm replaced by `arms.floor: {teacher_forced:
#   true}`: reference hf-generate (64 rows per call), candidate hf-assisted (K = 4, batch 1). After
#   generation the plain engine (hf-generate's model in bf16 + transformers' own warpers for the
#   config: engines.plain_laws) gives its processed law π at every prefix of the candidate's and
#   the reference's sequences (one forward per sequence); claim (b) = U1, the unbiased
#   ‖E(e_x − π(h))‖² per unit, against 2m² = 2e-4 (margin 0.01 TV; stats.teacher_forced). No floor
#   is subtracted: bf16 prefill-vs-decode numerics count against "within".
#   Overridden: the models (realistic:qwen3-0.6b, V = 151 936, draft derived:first_layers,layers=4),
#   bfloat16, cuda, SEEDS per arm, and the configs — both truncated (top-k), because the laws are
#   stored sparse and U1's cost grows with each law's support: an untruncated config would store
#   151 936 probabilities per prefix.
#   Claim (a): the white-box family in teacher mode and the black-box families.
#   The null tooth (session 9, h66): hf-generate itself, plain vs plain on its own seeds
#   (docs/protocols.md "The null tooth"); session 8's builtin null rejected 8 times here in bf16.
#
# Budget: hf-assisted ~0.5 s per sequence at this shape: SEEDS=200 (2 configs × 8 positions,
# 1 prompt) is about 5–7 minutes on one H200, inside one device call. At that size claim (b) is
# most likely "unresolved" (exit 3): U1's half-width is about 0.9/(n·√units) ≈ 3e-4 at n = 200,
# 16 units (results/LOG.md h60), above 2e-4. The line says how far the bounds reached.
#
# Usage: tools/gpu/hf_assisted_teacher.sh [OUT_DIR]   (default $OUT or /tmp/gpu_hf_teacher)
#        Env: SEEDS (default 200), DEVICE (default cuda; cpu for a smoke test), EXTRA (more run
#        arguments, e.g. EXTRA="--seeds 8 --set models.target=bundled:target
#        --set models.draft=bundled:draft" for a CPU smoke test).
# Prints the wall time, the exit code, the verdict's headline, the two claim lines and one JSON
# line (prefix "RESULT ") with the decision, the reasons and verdict.numerics.
# The teacher computes its laws one row per forward (TEACHER_BATCH, default 1: hf-assisted's own
# batch shape; in bf16 on the H200 a law moves by up to 0.17 TV between 1 and 13 rows per forward,
# docs/numerics.md "The teacher's batch shape"; TEACHER_BATCH= leaves the default chunking).
# Runs tools/gpu/issue31.sh with TEACHER=1 (the same run and printout, claim (b) teacher-forced).
exec env TEACHER=1 TEACHER_BATCH="${TEACHER_BATCH-1}" OUT="${1:-${OUT:-/tmp/gpu_hf_teacher}}" bash "$(dirname "$0")/issue31.sh"
