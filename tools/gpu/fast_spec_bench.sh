#!/usr/bin/env bash
# Issue 32, speculative throughput: an OLD tree against this one, side by side, in one device call
# (<= 5 min on one H200). Prints, per batch (1024 and 256 rows; realistic:qwen3-0.6b with
# derived:first_layers,layers=4, bf16, 32 positions, K 4, sampled drafter, t 0.8 / top-p 0.95):
# rows/s, MFU, mean accepted per round and the ratio to transformers' plain generate (timed once
# per batch, by this tree's process) of fast-plain and fast-spec under each tree, and new / old;
# then the GPU tests of what h62 touched (-m gpu) and the torch-profiler table (top CUDA ops) of
# this tree's fast-spec arm at 1024 rows. Records: $OUT/old.jsonl, $OUT/new.jsonl.
#
#   bash tools/gpu/fast_spec_bench.sh .gpu_old    # $1: a directory holding the old spectest/
#   bash .gpu_h62/tools/gpu/fast_spec_bench.sh .gpu_old   # this tree carried beside the old one
set -u
# OLD is resolved from the caller's directory, before the cd to this tree's root
OLD="$(cd "${1:?usage: fast_spec_bench.sh OLD_TREE (a directory holding the old spectest/)}" && pwd)"
cd "$(dirname "$0")/../.."
NEW="$PWD"
[ -d "$OLD/spectest" ] || { echo "no spectest/ in $OLD"; exit 2; }
echo "old tree: $OLD   new tree: $NEW"
OUT="${OUT:-/tmp/spectest-fast-spec}"
mkdir -p "$OUT"
rm -f "$OUT/old.jsonl" "$OUT/new.jsonl"
export SPECTEST_NO_PROGRESS=1 PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
B=(--device cuda --target realistic:qwen3-0.6b --draft derived:first_layers,layers=4
   --positions 32 --k 4 --peak-tflops 800 --drafter sampled --arms fast-plain,fast-spec)
for rows in 1024 256; do
  step "P2 $rows rows: OLD tree ($OLD)"
  (cd "$OLD" && PYTHONPATH="$OLD" timeout 75 python -m spectest bench "${B[@]}" --rows "$rows" \
    --no-baseline --out "$OUT/old.jsonl" 2>&1 | tail -4)
  step "P2 $rows rows: this tree, with transformers' plain generate"
  (cd "$NEW" && PYTHONPATH="$NEW" timeout 90 python -m spectest bench "${B[@]}" --rows "$rows" \
    --out "$OUT/new.jsonl" 2>&1 | tail -5)
done
step "side by side"
python - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
def load(name):
    try:
        return [json.loads(line) for line in open(f"{out}/{name}.jsonl")]
    except FileNotFoundError:
        return []
old, new = load("old"), load("new")
def pick(recs, rows, arm):
    hit = [r for r in recs if r["rows"] == rows and r["arm"] == arm and not r.get("baseline")]
    return hit[-1] if hit else None
print(f"{'rows':>5} {'arm':<11} {'old r/s':>9} {'new r/s':>9} {'new/old':>8} {'MFU old':>8} "
      f"{'MFU new':>8} {'acc old':>8} {'acc new':>8} {'x hf old':>9} {'x hf new':>9} {'hf r/s':>7}")
for rows in (1024, 256):
    base = [r for r in new if r["rows"] == rows and r.get("baseline")]
    hf = base[-1]["rows_per_s"] if base else None
    for arm in ("fast-plain", "fast-spec"):
        o, n = pick(old, rows, arm), pick(new, rows, arm)
        f = lambda r, k, fmt: format(r[k], fmt) if r and r.get(k) is not None else "-"
        ratio = f"{n['rows_per_s'] / o['rows_per_s']:.2f}" if o and n else "-"
        xo = f"{o['rows_per_s'] / hf:.2f}" if o and hf else "-"
        xn = f"{n['rows_per_s'] / hf:.2f}" if n and hf else "-"
        mo = f"{100 * o['mfu']:.1f}%" if o and o.get("mfu") else "-"
        mn = f"{100 * n['mfu']:.1f}%" if n and n.get("mfu") else "-"
        print(f"{rows:>5} {arm:<11} {f(o, 'rows_per_s', '.1f'):>9} {f(n, 'rows_per_s', '.1f'):>9} "
              f"{ratio:>8} {mo:>8} {mn:>8} {f(o, 'mean_accepted', '.2f'):>8} "
              f"{f(n, 'mean_accepted', '.2f'):>8} {xo:>9} {xn:>9} {hf or 0:>7.1f}")
EOF
step "GPU tests of what h62 touched (-m gpu)"
(cd "$NEW" && timeout 120 python -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_sampling_native.py tests/test_sampling_kernels.py tests/test_engine_fast.py \
  tests/test_numerics_replay.py tests/test_rejection_exact.py 2>&1 | tail -6)
step "profile: this tree's fast-spec at 1024 rows (top CUDA ops)"
(cd "$NEW" && PYTHONPATH="$NEW" timeout 80 python -m spectest bench \
  "${B[@]/fast-plain,fast-spec/fast-spec}" --rows 1024 --no-baseline --profile "$OUT/prof" \
  --out "$OUT/prof.jsonl" 2>&1 | grep -v "^\s*$" | tail -40)
rm -f "$OUT"/prof/*.json  # traces are large; the table above is the record
echo; echo "=== done ($(date -u +%H:%M:%S))"
