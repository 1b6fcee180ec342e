#!/usr/bin/env bash
# The main job on the device, run by two trees side by side: is the CUDA output of a refactored
# tree the same as before? (issue 20's "byte-identical on the H200").
#
#   bash tools/gpu/identity.sh OLD_TREE [OUT]       (env: DEVICE=cuda, EXTRA="--seeds 50" for a smoke test)
#   P1=1 bash tools/gpu/identity.sh OLD_TREE [OUT]  seed 001's bf16 plan instead of the main job:
#        protocols/openinfer-512.yaml --fast --set batch_size=768 at the realistic 0.6B pair in
#        bfloat16 (tools/gpu/issue32.sh's P1), each side under a 330 s timeout (SIDE_TIMEOUT=S: S)
#   FRESH_TRITON=1 ...: each side with an empty Triton cache of its own (TMPDIR/spectest-triton-old|new), as on
#        a fresh machine; prints how many kernels each side compiled, by name
#   WARMUP=1 ...: first a short untimed run of each tree (32 seeds per arm, discarded), so neither
#        timed side pays the machine's first compiles and loads (on a bare machine the side that
#        ran first was 4-10 s slower for that alone: results/LOG.md "lead (session 23)")
#   ORDER="new old" ...: the timed sides in that order (on a bare machine the first pays its
#        first compiles: put the tree under test first to measure it conservatively)
#   PYC=1 ...: Python writes byte code (unsets PYTHONDONTWRITEBYTECODE, which the device's machines
#        set: every process there compiled torch's, transformers' and spectest's sources again,
#        13-21 s of imports a process on the H100 of session 26), so with WARMUP=1 the timed sides
#        start as from an installed environment; both trees alike
#
# OLD_TREE: a directory holding an older `spectest/` and `protocols/` (e.g. made with
# `git archive COMMIT spectest protocols | tar -x -C OLD_TREE`). Each tree runs
# `spectest run --config protocols/top_p.yaml --device cuda`; then the samples' token columns,
# histograms.parquet and the verdict are compared (table contents: Parquet files embed their
# provenance, so bytes differ by timestamp and git sha), and tooth_sizes, tests, trie, whitebox,
# sequence and numerics .parquet where both have them.
# Prints each side's phase timings, then IDENTICAL or what differs.
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD="$1"
OUT="${2:-${OUT:-/tmp/spectest-identity}}"
mkdir -p "$OUT"
export SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
if [ -n "${PYC:-}" ]; then unset PYTHONDONTWRITEBYTECODE; fi
RUN=(--config protocols/top_p.yaml)
if [ -n "${P1:-}" ]; then
  RUN=(--config protocols/openinfer-512.yaml --fast --set batch_size=768
       --set models.target=realistic:qwen3-0.6b --set "models.draft=derived:first_layers,layers=4"
       --set models.dtype=bfloat16)
fi
if [ -n "${WARMUP:-}" ]; then
  for side in old new; do
    tree="$PWD"; [ "$side" = old ] && tree="$(cd "$OLD" && pwd)"
    (cd "$tree" && PYTHONPATH="$tree" timeout "${SIDE_TIMEOUT:-330}" python -m spectest run "${RUN[@]}" \
      --device "${DEVICE:-cuda}" ${EXTRA:-} --set seeds.per_arm=32 --out "$OUT/warmup-$side" \
      --no-progress > "$OUT/warmup-$side.console.txt" 2>&1)
    echo "== warm-up $side: exit $?"; rm -rf "$OUT/warmup-$side"
  done
fi
for side in ${ORDER:-old new}; do
  tree="$PWD"; [ "$side" = old ] && tree="$(cd "$OLD" && pwd)"
  t0=$(date +%s)
  if [ -n "${FRESH_TRITON:-}" ]; then export TRITON_CACHE_DIR="${TMPDIR:-/tmp}/spectest-triton-$side"; rm -rf "$TRITON_CACHE_DIR"; fi
  (cd "$tree" && PYTHONPATH="$tree" timeout "${SIDE_TIMEOUT:-330}" python -m spectest run "${RUN[@]}" \
    --device "${DEVICE:-cuda}" ${EXTRA:-} --out "$OUT/$side" --no-progress > "$OUT/$side.console.txt" 2>&1)
  echo "== $side: exit $? in $(( $(date +%s) - t0 )) s"; tail -n 3 "$OUT/$side.console.txt"
  grep -A1 "timings (s)" "$OUT/$side.console.txt" | tr '\n' ' '; echo  # the phases, one line
  if [ -n "${FRESH_TRITON:-}" ]; then  # one .cubin per compiled variant
    echo "Triton kernels compiled: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l)" \
      "($(find "$TRITON_CACHE_DIR" -name '*.cubin' -printf '%f\n' | sort | uniq -c | tr -s ' ' | tr '\n' ','))"
  fi
done
python - "$OUT/old" "$OUT/new" <<'PY'
import json, sys
import pandas as pd
old, new = sys.argv[1:]
keys = ["arm", "prompt_id", "config_id", "seed", "position", "token_id"]
def tokens(d):
    s = pd.read_parquet(f"{d}/samples.parquet", columns=keys)
    return s.sort_values(keys[:-1]).reset_index(drop=True)
def hist(d):
    h = pd.read_parquet(f"{d}/histograms.parquet")
    return h.sort_values(list(h.columns)).reset_index(drop=True)
def verdict(d):
    v = json.load(open(f"{d}/summary.json"))["verdict"]
    return v["decision"], v["exit_code"]
bad = []
if not tokens(old).equals(tokens(new)): bad.append("samples tokens")
try:
    if not hist(old).equals(hist(new)): bad.append("histograms")
except Exception as e: bad.append(f"histograms ({e})")
if verdict(old) != verdict(new): bad.append(f"verdict {verdict(old)} vs {verdict(new)}")
for table in ("tooth_sizes", "tests", "trie", "whitebox", "sequence", "numerics"):
    try:
        if not pd.read_parquet(f"{old}/{table}.parquet").equals(pd.read_parquet(f"{new}/{table}.parquet")):
            bad.append(table)
    except FileNotFoundError: pass  # a plan without sized teeth, claim (b), ...
print("IDENTICAL (tokens, histograms, verdict, tooth sizes, analysis and numerics tables)" if not bad
      else "DIFFERENT: " + ", ".join(bad))
PY
