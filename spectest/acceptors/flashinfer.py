"""FlashInfer's fused chain verifier (``flashinfer.sampling.chain_speculative_sampling``) as an
acceptor: ``acceptor:spectest.acceptors.flashinfer:chain``.

Owns: importing ``flashinfer.sampling`` (the package's ``__init__`` imports every FlashInfer
module and their dependencies — CUTLASS DSL, cuDNN frontend, NCCL bindings — so when that fails
the sampling module is loaded on its own under a bare ``flashinfer`` package object: it needs only
torch, ``apache-tvm-ffi`` and ``nvidia-ml-py``, plus nvcc to JIT-compile its CUDA sources on first
use), and translating the acceptor contract to its arguments. Knows nothing about spectest's loop.

Randomness: since the 0.2 series FlashInfer draws its own uniforms (Philox, from a
``torch.Generator`` or an explicit seed/offset) instead of taking ``uniform_samples``; this
adapter therefore declares ``spectest_randomness = "generator"`` and passes spectest's
per-call generator. Cost: a row's tokens depend on its batch (FlashInfer's docstring: the output
row index feeds the Philox subsequence), so runs are reproducible for the same protocol and batch
size, not batch-invariant; the statistics do not need more. A release that still takes
``uniform_samples`` (detected from the signature) is given spectest's uniforms instead.

FlashInfer returns int32 ids and counts (``output_emitted_draft_token_num`` = drafts accepted
before the first rejection; ``output_accepted_token_num`` = acceptances counted independently per
position, the telemetry seed 001 warns about); they are widened to the contract's int64.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import types
from types import ModuleType
from typing import Any

import torch

from spectest.errors import EngineError


@functools.cache
def sampling_module() -> ModuleType:
    """``flashinfer.sampling``, with or without the package's ``__init__`` (cached)."""
    try:
        return importlib.import_module("flashinfer.sampling")
    except Exception as err:  # the package __init__ imports everything; any failure: go bare
        first = err
    spec = importlib.util.find_spec("flashinfer") if "flashinfer" not in sys.modules else None
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "spectest.acceptors.flashinfer: flashinfer is not installed "
            f"(pip install flashinfer-python; import said: {first})"
        )
    sys.modules.pop("flashinfer", None)
    bare = types.ModuleType("flashinfer")
    bare.__path__ = list(spec.submodule_search_locations)
    sys.modules["flashinfer"] = bare
    try:
        return importlib.import_module("flashinfer.sampling")
    except Exception as err:
        raise EngineError(
            f"spectest.acceptors.flashinfer: cannot import flashinfer.sampling ({err})"
        ) from None


def version() -> str:
    mod = sys.modules.get("flashinfer.version") or importlib.import_module("flashinfer.version")
    return str(getattr(mod, "__version__", "?"))


def _prepare() -> None:
    sampling_module()


def chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
) -> Any:
    """FlashInfer's chain speculative sampling in the acceptor contract."""
    if draft_probs.device.type != "cuda":
        raise EngineError(
            "spectest.acceptors.flashinfer: the kernel needs CUDA tensors (models.device: cuda)"
        )
    fn = sampling_module().chain_speculative_sampling
    B = int(draft_token_ids.shape[0])
    acc = torch.zeros(B, dtype=torch.int32, device=draft_probs.device)  # added to in place
    emit = torch.zeros(B, dtype=torch.int32, device=draft_probs.device)
    ids = draft_token_ids.to(torch.int32)
    if "uniform_samples" in inspect.signature(fn).parameters:  # the 0.2.0-0.2.2 form
        out = fn(draft_probs, ids, uniforms.to(torch.float32), target_probs, acc, emit, True)
    else:
        out = fn(
            draft_probs,
            ids,
            target_probs,
            maybe_output_accepted_token_num=acc,
            maybe_output_emitted_draft_token_num=emit,
            deterministic=True,
            generator=generator,
        )
    if isinstance(out, tuple):  # 0.2.3+ returns (ids, accepted_num, emitted_num)
        out, acc, emit = out
    return out.to(torch.int64), acc.to(torch.int64), emit.to(torch.int64)


chain.spectest_randomness = "generator"  # type: ignore[attr-defined]
chain.spectest_prepare = _prepare  # type: ignore[attr-defined]
