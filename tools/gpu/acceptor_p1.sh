#!/usr/bin/env bash
# Issue 32, acceptor candidates on the fast engine: seed 001's bf16 plan (P1: openinfer-512,
# `--fast --set batch_size=768`, realistic:qwen3-0.6b with derived:first_layers,layers=4, bf16) with
# the built-in exact candidate, then with a correct acceptor plug-in written outside the package
# (tests/acceptor_plugins/toy_acceptors.py:accept, FlashInfer 0.2's chain-verifier shape) as the
# candidate, side by side in one call (~5 min on one H200). Under --fast the acceptor arm runs on
# engines/fast.py's FastAcceptorEngine and the matched arm is the exact kernel in that same loop.
#
# Usage: OUT=/tmp/acc bash tools/gpu/acceptor_p1.sh
# Prints per run: exit code, wall time, the phases (summary.json "timings"), the decision and the
# claim lines; then the acceptor/exact wall ratio (the issue's goal: <= 1.5).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/spectest-acceptor-p1}"
mkdir -p "$OUT"
P1=(--config protocols/openinfer-512.yaml --device cuda --fast --no-progress --set batch_size=768
    --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
    --set models.dtype=bfloat16)
one() {  # one NAME [EXTRA ARGS...]
  local name="$1" t0 rc; shift
  t0=$(date +%s.%N)
  timeout "${LIMIT:-300}" python -m spectest run "${P1[@]}" "$@" --out "$OUT/$name" \
    > "$OUT/$name.console.txt" 2>&1
  rc=$?
  python -c "import time; print('$name: exit $rc, wall', round(time.time() - $t0, 1), 's')" \
    | tee -a "$OUT/walls.txt"
  grep -E "claim \(a\)|claim \(b\)|^(EQUIVALENT|DIFFERENT|INCONCLUSIVE)|error" "$OUT/$name.console.txt" | cut -c1-300 | head -8
  python - "$OUT/$name/summary.json" <<'PY' || tail -5 "$OUT/$name.console.txt"
import json, sys
s = json.load(open(sys.argv[1]))
print("decision:", s["verdict"]["decision"], "| timings:", json.dumps(s.get("timings"), default=str))
PY
}
one exact
one acceptor --set candidate=acceptor:tests/acceptor_plugins/toy_acceptors.py:accept
python - "$OUT/walls.txt" <<'PY'
import re, sys
w = {l.split(":")[0]: float(re.search(r"wall ([\d.]+)", l).group(1)) for l in open(sys.argv[1])}
if {"exact", "acceptor"} <= set(w):
    print(f"acceptor / exact wall: {w['acceptor'] / w['exact']:.2f} (goal <= 1.5)")
PY
