#!/usr/bin/env bash
# Issue 31 on the H200: a foreign engine in bf16 that reports probabilities, both claims decided
# in `spectest run` (examples/engines/numerics-reporting-gpu.yaml: the user's program
# examples/engines/numerics_reporting.py as reference, candidate and floor arm, seed 001's plan
# at Qwen3-0.6B shape). One run per variant of the candidate's sampler: `exact` (expected
# EQUIVALENT) and a numerics-sized mutant (expected DIFFERENT on claim (a) from reported p).
#
# Usage: tools/gpu/numerics_reporting.sh [OUT_DIR]   (default $OUT or /tmp/gpu_numrep)
#        Env: VARIANTS (default "exact eps_biased:0.1"), SEEDS (per arm, default the protocol's
#        768), DEVICE (default cuda; cpu with DTYPE=float32 and SEEDS=8 for a smoke test),
#        DTYPE (default bfloat16), EXTRA (more run arguments, e.g. EXTRA="--set prompts.limit=1").
# Prints per variant: the wall time, the exit code, the verdict's claim lines and one JSON line
# (prefix "RESULT ") with the decision, the reported-p numbers and claim (b)'s bounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:-${OUT:-/tmp/gpu_numrep}}
VARIANTS=${VARIANTS:-exact eps_biased:0.1}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
mkdir -p "$OUT"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
for v in $VARIANTS; do
  name=${v//[:.]/_}
  sed -e "s/--variant, exact,/--variant, \"$v\",/" -e "s/\bcuda\b/$DEVICE/g" -e "s/\bbfloat16\b/$DTYPE/g" \
    -e "s#../../protocols/prompts/#$PWD/protocols/prompts/#" \
    examples/engines/numerics-reporting-gpu.yaml > "$OUT/$name.yaml"
  read -r -a extra <<< "${EXTRA:-}"
  seeds=()
  [ -n "${SEEDS:-}" ] && seeds=(--set "seeds.per_arm=$SEEDS" --set "seeds.teeth_per_arm=$SEEDS")
  t0=$(date +%s)
  python -m spectest run --config "$OUT/$name.yaml" --out "$OUT/$name" --no-progress "${seeds[@]}" "${extra[@]}" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $v: exit $rc, wall $(( $(date +%s) - t0 )) s"
  grep -E "^(EQUIVALENT|DIFFERENT|INCONCLUSIVE|error)|claim \(a\)|claim \(b\)|timings|^  - " "$OUT/$name.log" | cut -c1-400
  python - "$OUT/$name" "$v" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1]) / "summary.json"
if d.is_file():
    s = json.loads(d.read_text())
    v = s.get("verdict", {})
    det = s.get("details", {}).get("candidate", {})
    rep = {k: det[k] for k in det if k.startswith("reported")}
    print("RESULT " + json.dumps({"variant": sys.argv[2], "decision": v.get("decision"),
          "reasons": v.get("reasons"), "numerics": v.get("numerics"), "reported": rep}, default=str))
PY
done
