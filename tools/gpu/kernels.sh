#!/usr/bin/env bash
# Real verification kernels under test (issue 10): SGLang's Triton chain verifier (classic and
# block verification) and FlashInfer's chain_speculative_sampling, each as the candidate of
# `spectest run` through the acceptor engine (spectest/acceptors/*.py), on the bundled pair and at
# Qwen3-0.6B shape, one-hot and sampled drafters; plus a direct check of each kernel against
# spectest's exact sampler. Prints one verdict line per run; the run directories go to $OUT.
#
# Two modes:
#   tools/gpu/kernels.sh prepare   # HERE (internet): fill .whl/ (git-ignored), about 15 MB:
#       .whl/sglang/reject_sampling.py      the one kernel file of the sglang 0.5.23 wheel
#       .whl/flashinfer-slim.tar.xz         flashinfer-python 0.7.2.post1 cut to what
#                                           flashinfer.sampling needs (all .py, data/include,
#                                           data/cccl, data/spdlog, csrc/*.h and the 3 sampling
#                                           .cu files); the full wheel is 62 MB, 426 MB unpacked
#       .whl/apache_tvm_ffi-*.whl           flashinfer's JIT runtime (cp312)
#     Downloads (the device README's form):
#       pip download --no-deps sglang==0.5.23
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
#         --platform manylinux_2_17_x86_64 -d .whl flashinfer-python==0.7.2.post1 \
#         apache-tvm-ffi==0.1.15.post2
#   tools/gpu/kernels.sh [all|check|bundled|qwen]   # ON THE H200 (python3.12, torch 2.11,
#       triton 3.6, nvcc 13, no internet), from the repository root, with .whl/ carried:
#     run tool: command "bash tools/gpu/kernels.sh", carry [".whl"], timeout_s 600
#     (if one call runs out of time: "bash tools/gpu/kernels.sh check", then "... bundled",
#     then "... qwen"; each phase alone is a few minutes)
#
# flashinfer.sampling is imported without flashinfer/__init__.py (which imports every FlashInfer
# module and needs CUTLASS DSL, cuDNN frontend, NCCL bindings): it needs torch, tvm_ffi and pynvml
# (nvidia-ml-py, in the image) only, then JIT-compiles sampling.cu with nvcc on first use.
# Exit codes of the runs are results (1 = the kernel's law differs), reported, not script errors.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "prepare" ]; then
  set -e
  tmp=$(mktemp -d)
  mkdir -p .whl/sglang
  python3 -m pip download -q --no-deps sglang==0.5.23 -d "$tmp"
  unzip -p "$tmp"/sglang-0.5.23-*.whl sglang/kernels/ops/speculative/reject_sampling.py \
    > .whl/sglang/reject_sampling.py
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" flashinfer-python==0.7.2.post1 \
    apache-tvm-ffi==0.1.15.post2
  cp "$tmp"/apache_tvm_ffi-*.whl .whl/
  (cd "$tmp" && mkdir fi && cd fi && unzip -q ../flashinfer_python-*.whl && {
    find flashinfer -name '*.py'; find flashinfer -maxdepth 1 -type f ! -name '*.py'
    find flashinfer/data/include flashinfer/data/cccl flashinfer/data/spdlog -type f
    ls flashinfer/data/csrc/*.h flashinfer/data/csrc/*.cuh
    printf '%s\n' flashinfer/data/csrc/sampling.cu flashinfer/data/csrc/renorm.cu \
      flashinfer/data/csrc/flashinfer_sampling_binding.cu
    find flashinfer_python-*.dist-info -type f
  } | sort -u > ../slim.list && tar -cJf ../flashinfer-slim.tar.xz -T ../slim.list)
  cp "$tmp"/flashinfer-slim.tar.xz .whl/
  rm -rf "$tmp"
  du -sh .whl
  exit 0
fi

OUT=${OUT:-results/gpu-kernels}
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || echo "wheel install failed (flashinfer will be missing)"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  .whl/flashinfer-slim.tar.xz "$SITE" || echo "flashinfer tarball missing"
export PYTHONPATH="$PWD:$SITE"
export SPECTEST_SGLANG_REJECT_SAMPLING="$PWD/.whl/sglang/reject_sampling.py"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"

PHASE=${1:-all}
if [ "$PHASE" = all ] || [ "$PHASE" = check ]; then
echo "== direct kernel checks (same laws and uniforms as spectest's exact sampler)"
python3 - <<'EOF'
import time
import torch
from spectest.engines.acceptor import kernel_sampler
from spectest.sampling.rejection import rejection_sample
from spectest.errors import EngineError

torch.manual_seed(0)
dev = "cuda"
B, K, V = 200_000, 3, 8
p = torch.softmax(torch.randn(1, K + 1, V, dtype=torch.float64) * 1.5, -1).to(dev)  # [1, K+1, V]
q = torch.softmax(torch.randn(1, K, V, dtype=torch.float64) * 1.5, -1).to(dev)  # [1, K, V]
tp, dp = p.expand(B, -1, -1).contiguous(), q.expand(B, -1, -1).contiguous()
x = torch.multinomial(q[0], B, replacement=True).T.contiguous()  # [B, K] drafts x_j ~ q_j
u = torch.rand(B, K + 1, dtype=torch.float64, device=dev).clamp(1e-12, 1 - 1e-12)
ref = rejection_sample(tp, dp, x, u[:, :K], u[:, K])
first_law = p[0, 0].double().cpu()  # the first emitted token is distributed as p_0


def chi2_first(tokens: torch.Tensor) -> tuple[float, float]:
    from scipy.stats import chisquare

    counts = torch.bincount(tokens.cpu(), minlength=V).double()
    stat, pv = chisquare(counts.numpy(), (first_law * B).numpy())
    return float(stat), float(pv)


for spec in ("sglang:chain", "sglang:block", "flashinfer:chain"):
    mod, fn = spec.split(":")
    try:
        import importlib

        kernel = getattr(importlib.import_module(f"spectest.acceptors.{mod}"), fn)
        prep = getattr(kernel, "spectest_prepare", None)
        if prep is not None:
            prep()
        t0 = time.perf_counter()
        res = kernel_sampler(kernel, spec)(tp, dp, x, u[:, :K], u[:, K])
        torch.cuda.synchronize()
        same = (res.emitted == ref.emitted).all(1).double().mean().item()
        stat, pv = chi2_first(res.emitted[:, 0])
        acc = res.num_accepted.double().mean().item()
        print(f"{spec}: {B} rows K={K} V={V}: rows identical to spectest's exact sampler "
              f"{same:.4f}; first token chi2 {stat:.1f} p {pv:.3g}; mean accepted {acc:.4f} "
              f"(exact {ref.num_accepted.double().mean().item():.4f}); "
              f"{time.perf_counter() - t0:.2f} s (incl. compile)")
    except EngineError as err:
        print(f"{spec}: ERROR {err}")
    except Exception as err:  # report and go on: this is a measurement script
        print(f"{spec}: FAILED {type(err).__name__}: {' '.join(str(err).split())[:600]}")
EOF
fi

run() {  # run NAME ARGS...: one spectest run, its verdict and exit code
  local name=$1; shift
  local t0=$SECONDS
  python3 -m spectest run --no-progress --device cuda --out "$OUT/$name" "$@" \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc ($((SECONDS - t0)) s)"
  grep -E "EQUIVALENT|DIFFERENT|INCONCLUSIVE|error:|failing|killed|passed|not killed|rejected" \
    "$OUT/$name.log" | head -20
}

QWEN=(--set "models.target=hf-preset:qwen3-0.6b" --set "models.draft=derived:first_layers,layers=4"
      --set models.dtype=bfloat16 --set prompts.limit=1 --seeds 200 --positions 3
      --set tests.trie.min_count=100 --set tests.power.max_mde_tv=null)
for kernel in sglang:chain sglang:block flashinfer:chain; do
  for drafter in onehot sampled; do
    tag=${kernel/:/-}-$drafter
    if [ "$PHASE" = all ] || [ "$PHASE" = bundled ]; then
      run "bundled-$tag" --config protocols/top_p.yaml --seeds 300 --positions 6 \
        --set "candidate=acceptor:spectest.acceptors.$kernel" --set "drafter.kind=$drafter"
    fi
    if [ "$PHASE" = all ] || [ "$PHASE" = qwen ]; then
      run "qwen3-0.6b-$tag" --config protocols/top_p.yaml "${QWEN[@]}" \
        --set "candidate=acceptor:spectest.acceptors.$kernel" --set "drafter.kind=$drafter"
    fi
  done
done
echo "== done; run directories in $OUT"
