#!/usr/bin/env bash
# Issue 33 item 1: what supervising a plug-in run costs (spectest/supervise.py). An acceptor
# candidate on P1's plan (protocols/openinfer-512.yaml, --fast: the reference and teeth on the
# fast engine, the acceptor arm in spectest's built-in loop with the kernel called once per
# round), run twice each way, alternating:
#   supervised    `python -m spectest run ...`: the command line's own process supervises a
#                 child that runs the protocol and marks every kernel call in shared memory;
#   unsupervised  the same CLI called in-process (`spectest.cli.app()` from `python -c`: not
#                 the command line's own entry point, so nothing is supervised or marked).
# Prints the wall time of each run, the acceptor arm's generate time from summary.json, the
# number of kernel calls (rounds), and whether the two ways stored the same samples (they
# must: supervision changes no token). Then the per-call cost of a mark, in-process.
#
#   run tool: command "bash tools/gpu/supervision_cost.sh", timeout_s 600 (on the H200)
#   KERNEL=PATH.py:FUNCTION or package.module:FUNCTION overrides the kernel (default: an exact
#   pure-torch kernel written by this script, device-aware); PROTOCOL overrides the protocol.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} SPECTEST_NO_PROGRESS=1
OUT=${OUT:-/tmp/supervision_cost}
PROTOCOL=${PROTOCOL:-protocols/openinfer-512.yaml}
mkdir -p "$OUT"
if [ -z "${KERNEL:-}" ]; then
  cat > "$OUT/exact_kernel.py" <<'EOF'
import torch


def accept(draft_probs, draft_token_ids, uniforms, target_probs):
    B, K = draft_token_ids.shape
    dev = draft_token_ids.device
    rows, x = torch.arange(B, device=dev), draft_token_ids[..., None]
    p = target_probs[:, :K].gather(2, x)[..., 0]
    q = draft_probs.gather(2, x)[..., 0]
    ok = (p > 0) & (uniforms[:, :K] * q <= p)
    emitted = ok.long().cumprod(1).sum(1)
    q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], 1)
    w = (target_probs[rows, emitted] - q_pad[rows, emitted]).clamp_min(0)
    w = torch.where(w.sum(1, keepdim=True) > 0, w, target_probs[rows, emitted])
    cdf = w.double().cumsum(1)
    u = (uniforms[:, K] * cdf[:, -1])[:, None]
    final = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(w.shape[1] - 1)
    pos = torch.arange(K + 1, device=dev)[None, :]
    drafts = torch.cat([draft_token_ids, draft_token_ids[:, :1]], 1)
    out = torch.where(pos < emitted[:, None], drafts, torch.full_like(drafts, -1))
    out = torch.where(pos == emitted[:, None], final[:, None], out)
    return out, ok.long().sum(1), emitted
EOF
  KERNEL="$OUT/exact_kernel.py:accept"
fi
ARGS=(run --config "$PROTOCOL" --device cuda --fast --no-progress
      --set "candidate=acceptor:$KERNEL")
INPROC='import sys; from spectest.cli import app; sys.argv[0] = "spectest"; app()'

one() {  # $1: supervised | unsupervised, $2: rep
  local dir="$OUT/$1-$2" t0 t1 rc
  rm -rf "$dir"
  t0=$(date +%s.%N)
  if [ "$1" = supervised ]; then
    python -m spectest "${ARGS[@]}" --out "$dir" > "$dir.log" 2>&1
  else
    python -c "$INPROC" "${ARGS[@]}" --out "$dir" > "$dir.log" 2>&1
  fi
  rc=$?
  t1=$(date +%s.%N)
  python - "$dir" "$1" "$rc" "$t0" "$t1" <<'EOF'
import json, sys
from pathlib import Path
d, how, rc, t0, t1 = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
try:
    s = json.loads((d / "summary.json").read_text())
    gen = s["timings"]["generate"]
    cand = {k: round(v, 2) for k, v in gen.items() if "candidate" in k or "acceptor" in k}
except (OSError, KeyError, ValueError) as err:
    cand = f"no summary ({err})"
try:
    import pandas as pd
    rounds = len(pd.read_parquet(d / "rounds.parquet")) if (d / "rounds.parquet").exists() else "?"
except Exception:
    rounds = "?"
print(f"{how:13s} exit {rc}  wall {t1 - t0:7.1f} s  acceptor generate (s) {cand}  rounds rows {rounds}")
EOF
}

for rep in 1 2; do
  one supervised "$rep"
  one unsupervised "$rep"
done

python - "$OUT" <<'EOF'
import sys
from pathlib import Path
import pandas as pd
out = Path(sys.argv[1])
a = pd.read_parquet(out / "supervised-1" / "samples.parquet")
b = pd.read_parquet(out / "unsupervised-1" / "samples.parquet")
print("same samples supervised vs unsupervised:", a.equals(b), f"({len(a)} rows)")
EOF

# the mark itself: enter + leave around a no-op call, unsupervised and with a watch directory
python - <<'EOF'
import os, tempfile, time
from spectest import supervise as s
from spectest.contain import contained

def bench(label):
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        contained(str, int, watch=("acceptor x", "calling the kernel"))
    dt = (time.perf_counter() - t0) / n
    print(f"contained() per call, {label}: {dt * 1e6:.2f} us")

bench("unsupervised")
d = tempfile.mkdtemp()
os.environ[s.ENV] = f"{d}:{os.getppid()}"
s._reset()
assert s.watching()
bench("marked (supervised)")
EOF
