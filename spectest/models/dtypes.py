"""The dtype rule: ``DTYPES``, ``ALIASES``, ``LOW_PRECISION``, ``default_dtype`` and ``dtype_name``
/ ``torch_dtype``. Knows nothing of models. Why and details: docs/internals.md.
"""

from __future__ import annotations

from typing import Any

from spectest.errors import ConfigError

DTYPES = ("float32", "float64", "bfloat16", "float16")
ALIASES = {"fp32": "float32", "fp64": "float64", "bf16": "bfloat16", "fp16": "float16"}
LOW_PRECISION = ("bfloat16", "float16")


def default_dtype(device: Any) -> str:
    """The dtype of a load that names none: bfloat16 on CUDA (the GPU default for throughput
    work), float32 elsewhere."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def dtype_name(dtype: str | None, device: Any = "cpu", *, what: str = "dtype") -> str:
    """``dtype`` as one of ``DTYPES`` (an alias read as its name; None: ``default_dtype``); any
    other value is one ``ConfigError`` line naming ``what`` (the field or flag)."""
    if dtype is None:
        return default_dtype(device)
    name = ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if name not in DTYPES:
        raise ConfigError(f"{what}: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    return str(name)


def torch_dtype(dtype: Any, device: Any = "cpu") -> Any:
    """The ``torch.dtype`` of ``dtype`` (a ``torch.dtype`` as it is; a name or None by
    ``dtype_name``)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, dtype_name(dtype, device))
