#!/usr/bin/env bash
# Issue 12 on one H200 (torch 2.11 + transformers 5.17, no internet, models from spectest's zoo):
# the hf engines' white-box columns at generation time (transformers' output_scores) in bf16, and
# teacher mode with a larger reference arm for a token-only engine. About 3 minutes.
#
#   check     tests/test_engine_hf_whitebox.py on this host's transformers (CPU, tiny models):
#             its decode loops keep the scores they sample from (hf.scores_support), float32
#             columns from the scores equal teacher forcing, bf16 gives no emitted token p = 0.
#   hf        protocols/hf-assisted.yaml on CUDA in bf16 (bundled pair, its 300 seeds) with an
#             ε = 0.5 tooth: expect white-box mode "exact" on every comparison (generation-time,
#             one-sample tests), control and null passing, ε and onehot_softmax_q killed:
#             EQUIVALENT (exit 0). The provenance names where the columns came from.
#   command   protocols/command-example.yaml (an external program over spectest-jsonl/1, bundled
#             pair) with white-box on, 1000 candidate seeds and seeds.reference_per_arm = 4000
#             (the recommended 4 ×), ε = 0.5 added: a token-only engine runs in teacher mode
#             (two-sample tests against the larger reference, tolerance control on it): expect
#             control and null passing, ε and always_accept killed, EQUIVALENT (exit 0).
#
# Usage: scripts/gpu_issue12.sh [STEPS] [OUT_DIR]   STEPS: comma-separated (check,hf,command) or
#        "all" (default); OUT_DIR default $OUT or /tmp/gpu_issue12.
#        Env: DEVICE (default cuda; cpu for a smoke test), HF_SEEDS (default 300), CMD_SEEDS
#        (default 1000), REF_MULT (default 4).
# Each step runs under `timeout`, prints its wall time, exit code and one "RESULT {json}" line
# (decision, teeth, per arm: white-box mode, control, rejected white-box tests).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
STEPS=${1:-all}
OUT=${2:-${OUT:-/tmp/gpu_issue12}}
DEVICE=${DEVICE:-cuda}
HF_SEEDS=${HF_SEEDS:-300}
CMD_SEEDS=${CMD_SEEDS:-1000}
REF_MULT=${REF_MULT:-4}
mkdir -p "$OUT"
python -c "import torch, transformers; from spectest.engines import hf; print('torch', \
torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() \
and torch.cuda.get_device_name(0), 'scores', hf.SCORES)"

report() {  # $1 run dir, $2 exit code, $3 seconds
  python - "$1" "$2" "$3" <<'PY'
import json, sys
from pathlib import Path
run, rc, secs = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = {"run": str(run), "exit": rc, "seconds": secs}
try:
    s = json.loads((run / "summary.json").read_text())
    v = s.get("verdict", {})
    out.update(decision=v.get("decision"), reasons=v.get("reasons"), teeth=v.get("teeth"))
    out["arms"] = {
        arm: {k: d.get(k) for k in (
            "rejected", "whitebox_mode", "whitebox_control_failed", "whitebox_rejected",
            "support_violation", "n_tested", "seeds_per_arm_observed", "directed_z_mde")}
        for arm, d in (s.get("details") or {}).items()
    }
    prov = json.loads((run / "manifest.json").read_text()).get("provenance", {})
    out["engines"] = prov.get("engines")  # per engine: where its white-box columns came from
    import pandas as pd
    wb = pd.read_parquet(run / "whitebox.parquet")
    cols = [c for c in ("arm", "test", "statistic", "pvalue", "p_adj", "reject") if c in wb]
    out["whitebox"] = wb[cols].round(6).to_dict(orient="records")
    sa = pd.read_parquet(run / "samples.parquet")
    out["rows_per_arm"] = sa.groupby("arm").size().to_dict()
    out["emitted_p_zero"] = {a: int((g["wb_p"] == 0).sum()) for a, g in sa.groupby("arm")}
except Exception as e:  # noqa: BLE001 - a report helper: show what went wrong and go on
    out["error"] = repr(e)
print("RESULT " + json.dumps(out, default=str))
PY
}

step() {  # $1 name, $2 time limit (s), rest: spectest run arguments
  local name=$1 limit=$2; shift 2
  local run="$OUT/$name"
  rm -rf "$run"
  echo "=== $name: spectest run $* --out $run" >&2
  local t0=$SECONDS
  timeout "$limit" python -m spectest run "$@" --out "$run" --no-progress
  local rc=$?
  echo "exit code $rc (0 equivalent, 1 different, 3 inconclusive, 124 timeout) in $((SECONDS - t0)) s" >&2
  report "$run" "$rc" "$((SECONDS - t0))"
}

[ "$STEPS" = all ] && STEPS=check,hf,command
IFS=, read -r -a STEP_LIST <<< "$STEPS"
for STEP in "${STEP_LIST[@]}"; do
  case $STEP in
    check)
      t0=$SECONDS
      timeout 150 python -m pytest tests/test_engine_hf_whitebox.py -q -p no:cacheprovider
      echo "check: exit $? in $((SECONDS - t0)) s" >&2 ;;
    hf)
      step hf-assisted-bf16 150 --config protocols/hf-assisted.yaml --device "$DEVICE" \
        --set models.dtype=bfloat16 --set "teeth.epsilons=[0.5]" \
        --set seeds.per_arm="$HF_SEEDS" --set batch_size="$HF_SEEDS" ;;
    command)
      step command-teacher-ref"$REF_MULT"x 120 --config protocols/command-example.yaml \
        --device "$DEVICE" --set tests.whitebox=true --set "teeth.epsilons=[0.5]" \
        --set seeds.per_arm="$CMD_SEEDS" \
        --set seeds.reference_per_arm="$((CMD_SEEDS * REF_MULT))" ;;
    *) echo "unknown step $STEP (check, hf, command, all)" >&2; exit 2 ;;
  esac
done
