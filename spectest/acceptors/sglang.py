"""SGLang's Triton chain verifier as an acceptor (``acceptor:spectest.acceptors.sglang:chain`` and
``:block``): loading its one kernel file and translating the contract to its tree-shaped arguments.
Knows nothing about spectest's loop. Why and details: docs/internals.md.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from spectest.errors import EngineError

ENV = "SPECTEST_SGLANG_REJECT_SAMPLING"
RELPATH = Path("kernels") / "ops" / "speculative" / "reject_sampling.py"
FUNCTION = "chain_speculative_sampling_triton"


@functools.cache
def kernel_module() -> ModuleType:
    """The kernel module file, loaded under a private name (cached)."""
    path: Path | None = None
    if os.environ.get(ENV):
        path = Path(os.environ[ENV])
    else:
        spec = importlib.util.find_spec("sglang")
        if spec is not None and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))) / RELPATH
    if path is None or not path.is_file():
        raise EngineError(
            f"spectest.acceptors.sglang: no SGLang kernel file (install the wheel with "
            f"'pip install --no-deps sglang==0.5.23' or set {ENV}=/path/to/reject_sampling.py)"
        )
    try:
        import triton  # noqa: F401
    except ImportError:
        raise EngineError("spectest.acceptors.sglang: triton is not installed") from None
    mspec = importlib.util.spec_from_file_location("spectest_sglang_reject_sampling", path)
    assert mspec is not None and mspec.loader is not None
    module = importlib.util.module_from_spec(mspec)
    try:
        mspec.loader.exec_module(module)
    except Exception as err:
        raise EngineError(f"spectest.acceptors.sglang: cannot load {path} ({err})") from None
    if not hasattr(module, FUNCTION):
        raise EngineError(f"spectest.acceptors.sglang: {path} has no {FUNCTION}")
    return module


def _run(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    block_verification: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if draft_probs.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineError(
            "spectest.acceptors.sglang: the Triton kernel needs CUDA tensors (models.device: cuda; "
            "or TRITON_INTERPRET=1 to run Triton's interpreter on CPU, slowly)"
        )
    B, K = (int(s) for s in draft_token_ids.shape)
    dev = draft_token_ids.device
    fn = getattr(kernel_module(), FUNCTION)  # [B (K+1)] flat output slots below
    candidates = torch.cat([draft_token_ids[:, :1], draft_token_ids], dim=1)  # [B, K+1] root=x_1
    retrive_index = torch.arange(B * (K + 1), device=dev, dtype=torch.int64).view(B, K + 1)
    predicts = torch.full((B * (K + 1),), -1, dtype=torch.int32, device=dev)  # [B (K+1)]
    accept_index = torch.full((B, K + 1), -1, dtype=torch.int32, device=dev)
    accept_token_num = torch.zeros((B,), dtype=torch.int32, device=dev)
    # float32 as SGLang's torch.rand gives them, kept below 1 (a float64 u within 2^-25 of 1
    # would round to 1.0f, outside SGLang's [0, 1) and past its final CDF scan)
    u = uniforms.to(torch.float32).clamp(max=1.0 - 2.0**-24)  # [B, K+1]
    fn(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        torch.full_like(candidates, -1),
        torch.full_like(candidates, -1),  # tree links: unused
        u[:, :K].contiguous(),
        u[:, K].contiguous(),
        target_probs.contiguous(),
        draft_probs.contiguous(),
        1.0,
        1.0,
        True,
        block_verification=block_verification,
    )
    n = accept_token_num.to(torch.int64)  # [B]
    out = predicts.view(B, K + 1).to(torch.int64)  # [B, K+1]
    pos = torch.arange(K + 1, device=dev)[None, :]
    out = torch.where(pos <= n[:, None], out, -1)
    return out, n.clone(), n


def chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    target_probs: torch.Tensor,
) -> Any:
    """Classic chain verification (SGLang's default)."""
    return _run(draft_probs, draft_token_ids, uniforms, target_probs, block_verification=False)


def block(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    target_probs: torch.Tensor,
) -> Any:
    """Block verification (``block_verification=True``; arXiv 2403.10444, Algorithm 2)."""
    return _run(draft_probs, draft_token_ids, uniforms, target_probs, block_verification=True)


chain.spectest_prepare = kernel_module  # type: ignore[attr-defined]
block.spectest_prepare = kernel_module  # type: ignore[attr-defined]
