#!/usr/bin/env bash
# P1 on one GPU with the device's utilisation beside it (issue 32): where the GPU idles.
#
#   bash tools/gpu/p1_timeline.sh [OUT] [EXTRA spectest run args...]
#
# Runs seed 001's bf16 plan (protocols/openinfer-512.yaml --fast --set batch_size=768 at
# realistic:qwen3-0.6b with derived:first_layers,layers=4 in bfloat16) through tools/gpu/p1_wall.py
# while `nvidia-smi` samples utilization.gpu and memory.used every 0.25 s. Prints the run's exit,
# wall and p1_wall's stamps (imports, main returned, GC), its phase timings, then one token per
# second since the start, `second:utilisation%/GiB used`: the seconds at 0 % are the host's
# (imports, load, analyze, write, exit). OUT (default /tmp/p1-timeline) keeps util.csv, the
# console and the run directory (p1/). Session 19's reading: results/LOG.md "lead (session 19)".
set -u
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/p1-timeline}"; shift || true
mkdir -p "$OUT"; rm -rf "$OUT/p1"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" SPECTEST_NO_PROGRESS=1
( while true; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits
    sleep 0.25; done ) > "$OUT/util.csv" 2>/dev/null &
SMI=$!
T0=$(date +%s.%N)
timeout 300 python tools/gpu/p1_wall.py run --config protocols/openinfer-512.yaml --device cuda --fast \
  --no-progress --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
  --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16 --out "$OUT/p1" "$@" \
  > "$OUT/console.txt" 2> "$OUT/stamps.txt"
RC=$?
kill "$SMI" 2>/dev/null
echo "exit $RC, wall $(python -c "import time; print(round(time.time() - $T0, 1))") s"
grep "p1_wall" "$OUT/stamps.txt"; grep -A1 "timings (s)" "$OUT/console.txt"
python - "$OUT/util.csv" "$T0" <<'PY'
import collections, datetime as dt, sys
t0, per = float(sys.argv[2]), collections.defaultdict(list)
for line in open(sys.argv[1]):
    try:
        ts, u, m = (x.strip() for x in line.split(","))
        t = dt.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        continue
    per[int(t.timestamp() - t0)].append((int(u), int(m)))
print(" ".join(f"{s}:{sum(u for u, _ in v) // len(v)}/{v[-1][1] // 1024}"
               for s, v in sorted(per.items()) if s >= 0))
PY
