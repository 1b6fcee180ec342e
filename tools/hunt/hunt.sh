#!/usr/bin/env bash
# The historical-bug hunt of issue 6: run protocols/hf-assisted.yaml (transformers' assisted
# generation vs its plain generate, on the bundled pair) under the installed transformers and
# under 4.44.2, the last release before transformers #33534 fixed #32867; then the readouts
# (acceptance vs the q the draft should use, which q transformers actually used).
#
# Usage: tools/hunt/hunt.sh [PROTOCOL] [OUT_DIR]     (defaults: protocols/hf-assisted.yaml results/hunt)
# Env:   VENV_OLD (default /tmp/venv-tf444), PY_NEW (default python), OLD_VERSION (default 4.44.2)
#
# The exit codes of the runs are part of the result (1 = the distributions differ), so they are
# reported, not treated as script failures. Each release writes into its own run directory
# (OUT_DIR/tf-<version>): the protocol hash is the same, the environment is not.
set -uo pipefail
cd "$(dirname "$0")/../.."

PROTOCOL=${1:-protocols/hf-assisted.yaml}
OUT=${2:-results/hunt}
VENV_OLD=${VENV_OLD:-/tmp/venv-tf444}
PY_NEW=${PY_NEW:-python}
OLD_VERSION=${OLD_VERSION:-4.44.2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [ ! -x "$VENV_OLD/bin/python" ]; then
  echo "creating $VENV_OLD (transformers==$OLD_VERSION over the system torch)" >&2
  python -m venv --system-site-packages "$VENV_OLD" || exit 2
  "$VENV_OLD/bin/pip" install "transformers==$OLD_VERSION" || exit 2
  "$VENV_OLD/bin/pip" install --no-deps -e . || exit 2
fi

mkdir -p "$OUT"
for PY in "$PY_NEW" "$VENV_OLD/bin/python"; do
  V=$("$PY" -c "import transformers; print(transformers.__version__)") || exit 2
  RUN="$OUT/tf-$V"
  echo "=== transformers $V ($PY): $PROTOCOL -> $RUN" >&2
  # the CLI's console-script entry point, run by this Python (the venv has no `spectest` script)
  "$PY" -c 'import sys; sys.argv[0] = "spectest"; from spectest.cli import main; main()' \
    run -c "$PROTOCOL" --out "$RUN" --no-progress --summary-md "$RUN.summary.md"
  echo "exit code $? (0 equivalent, 1 different, 3 inconclusive)" | tee "$RUN.exit"
  "$PY" tools/hunt/hunt_readout.py "$RUN" --json "$RUN.readout.json" | tee "$RUN.readout.txt"
done
