#!/usr/bin/env bash
# P1's numerics and tooth-size phases (issue 32), this tree against OLD_TREE in one call, on the
# same matched arm: are the tables the same, and where did the time go?
#
#   bash tools/gpu/issue32_numerics_ab.sh                    ONE process, this tree only (~90 s):
#        its numerics phase by the old paths then the new (`numerics.alone.SHARE_PREFIXES` off /
#        `numerics.table.HOST_SYNCS` on, then the defaults), tables `DataFrame.equals`, then the
#        one-row step micro-benchmarks (MICRO=0: none); PASSES="old,new,old,new" for more passes
#   bash tools/gpu/issue32_numerics_ab.sh OLD_TREE [OUT]     two trees, two processes (~4 min):
#        (env: ONLY=numerics|tooth; SETS="--set models.device=cpu ..." replaces P1's settings,
#        e.g. for a CPU smoke test at a tiny shape)
#
# OLD_TREE: `git archive main spectest protocols | tar -x -C OLD_TREE`. P1's settings: seed 001's
# bf16 plan (protocols/openinfer-512.yaml, batch 768, realistic:qwen3-0.6b with
# derived:first_layers,layers=4, bfloat16, CUDA). This tree generates the matched arm once on the
# fast engine and saves it; then each tree, in its own process (this tree first), times the
# numerics phase (`generation.matched_drift`) cold and warm, the warm pass with every step
# synchronised and timed, forwards counted by shape and host syncs by source line, then the
# micro-benchmarks of a one-row decode step, then the tooth-size phase
# (`generation.protocol_tooth_sizes`) cold and warm (tools/gpu/issue32_numerics_ab.py prints each
# line, prefixed [new] / [old]). Last: the tables compared across trees (`DataFrame.equals`), one
# line each, and the phase times side by side. Exit 1 when a table differs. About 4 min on one H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 SPECTEST_NO_PROGRESS=1
P1=(--set models.device=cuda --set batch_size=768 --set models.target=realistic:qwen3-0.6b
    --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16)
[ -n "${SETS:-}" ] && read -r -a P1 <<< "$SETS"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null
if [ $# -eq 0 ]; then
  t0=$(date +%s)
  PYTHONPATH="$PWD" timeout "${NEW_S:-170}" python tools/gpu/issue32_numerics_ab.py --label ab \
    --switch "${PASSES:-old,new}" --only numerics --out "${OUT:-/tmp/issue32_ab}/switch" \
    $([ "${MICRO:-1}" = 0 ] && echo --no-micro) "${P1[@]}"
  rc=$?; echo "== exit $rc in $(( $(date +%s) - t0 )) s"; exit $rc
fi
OLD="$(cd "$1" && pwd)"
OUT="${2:-${OUT:-/tmp/issue32_ab}}"
mkdir -p "$OUT"
[ -n "${ONLY:-}" ] && P1+=(--only "$ONLY")
t0=$(date +%s)
PYTHONPATH="$PWD" timeout "${NEW_S:-170}" python tools/gpu/issue32_numerics_ab.py --label new \
  --save-arm "$OUT/arm" --out "$OUT/new" "${P1[@]}"
echo "== new: exit $? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
PYTHONPATH="$OLD" timeout "${OLD_S:-130}" python tools/gpu/issue32_numerics_ab.py --label old \
  --arm "$OUT/arm" --out "$OUT/old" "${P1[@]}"
echo "== old: exit $? in $(( $(date +%s) - t0 )) s"
python - "$OUT" <<'PY'
import json, os, sys
import pandas as pd
out = sys.argv[1]
bad = 0
for name in ("numerics", "tooth"):
    f = [f"{out}/{side}/{name}.parquet" for side in ("old", "new")]
    if not all(os.path.exists(x) for x in f):
        print(f"{name} table: missing ({[os.path.exists(x) for x in f]})"); bad += 1; continue
    old, new = (pd.read_parquet(x) for x in f)
    same = old.equals(new)
    bad += not same
    extra = ""
    if not same and old.shape == new.shape:
        num = old.select_dtypes("number").columns
        extra = f", max |d| {float((old[num] - new[num]).abs().max().max()):.3g}"
    print(f"{name} table old vs new: {'IDENTICAL' if same else 'DIFFERENT'} ({len(old)} rows{extra})")
t = {s: json.load(open(f"{out}/{s}/times.json")) for s in ("old", "new") if os.path.exists(f"{out}/{s}/times.json")}
keys = ["numerics cold", "numerics warm", "tooth sizes cold", "tooth sizes warm"]
for k in keys:
    print(f"{k:18s} " + "  ".join(f"{s} {t[s][k]:7.2f} s" for s in t if k in t[s]))
for k in sorted(set().union(*(t[s].get("steps", {}) for s in t))):
    print(f"  step {k:22s} " + "  ".join(f"{s} {t[s].get('steps', {}).get(k, float('nan')):7.2f} s" for s in t))
sys.exit(1 if bad else 0)
PY
