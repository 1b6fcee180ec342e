#!/usr/bin/env bash
# Thin wrapper kept for CI and old notes: `spectest setup llamacpp` builds llama.cpp's server
# (spectest/setup/llamacpp.py runs spectest/setup/build_llamacpp.sh, shipped in the package).
# The last stdout line is the cache directory (bin/llama-server, venv/, src/); progress goes to
# stderr (a line at least every 10 s) and to <cache>/build.log. PYTHON= picks the python whose
# spectest and torch are used (default python3).
set -euo pipefail
exec "${PYTHON:-python3}" -m spectest.setup.llamacpp "$@"
