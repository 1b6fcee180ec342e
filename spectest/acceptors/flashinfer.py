"""FlashInfer's fused chain verifier as an acceptor
(``acceptor:spectest.acceptors.flashinfer:chain``): importing ``flashinfer.sampling`` and
translating the contract. Knows nothing about spectest's loop. Why and details: docs/internals.md.
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
chain.spectest_prepare = sampling_module  # type: ignore[attr-defined]
