"""The dtype rule: which weight dtypes spectest loads, what each is called, which are low
precision, and the default of each device.

Owns: ``DTYPES`` (the names a protocol's ``models.dtype``, ``spectest bench --dtype`` and a
model loader take), ``ALIASES`` (the short names a loader also reads), ``LOW_PRECISION`` (the
dtypes whose numerics differ between a full forward and incremental decoding: matched numerics
mode's ``auto`` and the white-box teacher mode key on it), ``default_dtype`` (float32 on CPU,
bfloat16 on CUDA: every entry point that leaves the dtype out) and ``dtype_name`` /
``torch_dtype`` (a given name, or None, resolved by that rule). Knows nothing of models.
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
