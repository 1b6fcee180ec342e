"""``ScaledLogits``: a model's half-precision logits carried unscaled, whose law is their float32
cast times a ``logit_scale`` (``parts``, ``law_values``). Knows nothing about models or laws.

A zoo model with ``logit_scale != 1`` (the realistic pair's 20) defines its logits as
``fl32(fl32(x) · s)``; the static model returns its native ``x`` as a ``ScaledLogits`` instead of
that ``[B, S, V]`` float32 product. Every operation on it sees the float32 product (it is made
when needed), except those that only move or describe elements, which stay on ``x``. The
shortlist pipeline takes ``x`` itself (``parts``) where scaling commutes with what it does: a
top-``W`` selection, a row max, a gather. Why that is exact: docs/internals.md
"spectest/sampling/scaled.py".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

# operations that move elements or read only the shape: they commute with an elementwise scale,
# so they run on the native tensor and keep the wrapper
_MOVES = frozenset(
    {
        "__getitem__", "reshape", "view", "expand", "expand_as", "select", "narrow", "squeeze",
        "unsqueeze", "flatten", "contiguous", "clone", "detach", "permute", "transpose",
        "index_select", "gather", "unbind", "split", "chunk", "stack", "cat",
    }
)  # fmt: skip
# what describes the tensor and not its values (``dtype`` is the float32 of the law)
_SHAPE = frozenset({"shape", "device", "ndim", "layout", "is_cuda", "requires_grad"})
_SHAPE_CALLS = frozenset({"dim", "size", "numel", "__len__", "is_contiguous", "get_device"})
_IN_PLACE = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"})
HALF = (torch.bfloat16, torch.float16)


class ScaledLogits(torch.Tensor):
    """Native half-precision logits ``x`` standing for the float32 tensor ``fl32(x) · scale``.

    Build one with ``ScaledLogits.wrap``; read ``x`` and ``scale`` with ``parts``.

    Notes
    -----
    - Any operation but a move (``_MOVES``) or a shape query sees the float32 product, computed
      as the static model computed it before (``x.to(float32).mul_(scale)``), so a consumer that
      knows nothing of the wrapper gets the old bits; ``dtype`` says ``torch.float32``.
    - In-place operations on it raise ``TypeError``: they would change the product, not ``x``.
    - Only 16-bit ``x``: there the product is strictly increasing in ``x`` (an 8- or 11-bit
      significand times a float32 scale needs no rounding that could merge two neighbours), so
      comparisons on ``x`` decide what they decide on the product (docs/internals.md).
    """

    scale: float

    @staticmethod
    def wrap(x: torch.Tensor, scale: float) -> ScaledLogits:
        """``x`` (bfloat16 / float16) standing for ``fl32(x) · scale``."""
        if x.dtype not in HALF:
            raise TypeError(f"ScaledLogits holds bfloat16 / float16 logits, got {x.dtype}")
        out = x.as_subclass(ScaledLogits)
        out.scale = float(scale)
        return out

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property: the shape's on x, the dtype the law's
            prop = getattr(getattr(func, "__self__", None), "__name__", "")
            if prop == "dtype":
                return torch.float32
            if prop in _SHAPE:
                return _call(func, _native_args(args), kwargs)
            if prop in ("T", "mT"):  # transposes: moves
                return _rewrap(_call(func, _native_args(args), kwargs), args[0].scale)
        elif name in _SHAPE_CALLS:
            return _call(func, _native_args(args), kwargs)
        if _writes_into(name, args, kwargs):
            raise TypeError(f"ScaledLogits is read-only ({name}): take .float() first")
        scales = {a.scale for a in _flat(args) if isinstance(a, ScaledLogits)}
        if name in _MOVES and len(scales) == 1 and _only_logits(name, args):
            return _rewrap(_call(func, _native_args(args), kwargs), scales.pop())
        return _call(func, _float_args(args), _float_args(kwargs))


def parts(x: torch.Tensor) -> tuple[torch.Tensor, float | None]:
    """``(native x, scale)`` of a ``ScaledLogits``; ``(x, None)`` for any other tensor."""
    if isinstance(x, ScaledLogits):
        with torch._C.DisableTorchFunctionSubclass():
            return x.as_subclass(torch.Tensor), x.scale
    return x, None


def law_values(x: torch.Tensor, scale: float | None) -> torch.Tensor:
    """The law's float32 values of native ``x`` (any shape: a gather, a row max): the static
    model's operations, ``x.to(float32).mul_(scale)``; ``x`` itself when ``scale`` is None."""
    return x if scale is None else x.to(torch.float32).mul_(scale)


def argmax_holds(top: torch.Tensor) -> torch.Tensor:
    """Where the first maximal id of native 16-bit ``x`` is that of its product (``[...]`` bool):
    ``top`` ``[...]``, the product of ``x``'s maximum (``law_values``), finite and normal, or NaN.

    Notes
    -----
    Where the product's maximum is finite and normal, no smaller ``x`` has an equal product (the
    products are strictly increasing there: docs/internals.md "Why reading ``x`` is exact"), so the
    ties are ``x``'s ties and the first of them is the same id; NaN is where the product's NaN
    is (the first NaN, in both). An overflow to inf, an underflow or a zero can tie products that
    ``x`` does not: there the caller takes the product's argmax (a deferred read that fails)."""
    mag = top.abs()
    return torch.isnan(top) | ((mag >= torch.finfo(torch.float32).tiny) & (mag < math.inf))


def _call(func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [y for o in obj for y in _flat(o)]
    if isinstance(obj, dict):
        return [y for o in obj.values() for y in _flat(o)]
    return [obj]


def _map(obj: Any, fn: Callable[[ScaledLogits], torch.Tensor]) -> Any:
    if isinstance(obj, ScaledLogits):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _native_args(obj: Any) -> Any:
    return _map(obj, lambda a: parts(a)[0])


def _float_args(obj: Any) -> Any:
    return _map(obj, lambda a: law_values(*parts(a)))


def _rewrap(out: Any, scale: float) -> Any:
    if isinstance(out, torch.Tensor):
        return ScaledLogits.wrap(out, scale)
    if isinstance(out, (list, tuple)):
        return type(out)(_rewrap(o, scale) for o in out)
    return out


def _only_logits(name: str, args: tuple[Any, ...]) -> bool:
    """A ``stack`` / ``cat`` joins only ``ScaledLogits`` (a plain tensor among them is already
    the law's values); the other moves take one."""
    if name in ("stack", "cat") and args:
        return all(isinstance(a, ScaledLogits) for a in _flat(args[0]))
    return True


def _writes_into(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the call would write into a ``ScaledLogits``: an in-place method on one, or one
    as ``out=``."""
    in_place = name in _IN_PLACE or (name.endswith("_") and not name.startswith("__"))
    target = bool(args) and isinstance(args[0], ScaledLogits)
    return (in_place and target) or isinstance(kwargs.get("out"), ScaledLogits)
