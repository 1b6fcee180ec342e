#!/usr/bin/env bash
# Issue 22 on a GPU host (for the lead): the role-stratified white-box family beside the pooled
# one on the bundled pair — H0 false alarms of every new test (200 replications) and the kill
# rate of the catalogue's role-confined mutants at 256 seeds per arm, both drafters. Appends the
# tables to results/bench/whitebox_roles_bundled.md. About 2 × (200 + 7 × 100) replications of
# 512 sequences × 12 positions; minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
OUT=results/bench/whitebox_roles_bundled.md
for drafter in onehot sampled; do
  python benchmarks/whitebox_roles.py h0 --pair bundled --device cuda --drafter "$drafter" \
    --reps 200 --seeds 256 --md "$OUT"
  python benchmarks/whitebox_roles.py power --pair bundled --device cuda --drafter "$drafter" \
    --reps 100 --seeds 256 --md "$OUT"
done
