"""Sampling parameters: ``SamplingParams`` (one config) and ``SamplingTensors`` (the fields stacked
per row on a device), and their validation, so every entry point rejects the same bad values
with the same message. Knows nothing about models, logits or the filters' order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from spectest.errors import ConfigError, InputError


@dataclass(frozen=True)
class SamplingParams:
    """One sampling configuration.

    ``temperature == 0`` means greedy (argmax). ``top_k == 0`` disables top-k, ``top_p == 1``
    disables top-p, ``min_p == 0`` disables min-p.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        validate_params(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


MAX_TOP_K = 2**31 - 1  # int32, as engines carry it (llama.cpp, vLLM); beyond int64 torch overflows


def validate_params(
    temperature: float, top_k: int, top_p: float, min_p: float, where: str = ""
) -> None:
    """Raise ``ConfigError`` naming the first bad value. ``where`` prefixes the message."""
    prefix = f"{where}: " if where else ""
    if (
        not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ConfigError(f"{prefix}temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= MAX_TOP_K:
        raise ConfigError(
            f"{prefix}top_k must be an integer in [0, {MAX_TOP_K}] (0 = off; a value at or above"
            f" the vocabulary size keeps every token), got {top_k!r}"
        )
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise ConfigError(f"{prefix}top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(min_p, (int, float)) or not (0.0 <= min_p < 1.0):
        raise ConfigError(f"{prefix}min_p must be in [0, 1), got {min_p!r}")


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters, each of shape ``[B]``, on one device. The tensors are not
    changed once a law has been taken from them: the host keeps what it read (``host``)."""

    temperature: torch.Tensor  # [B] float64
    top_k: torch.Tensor  # [B] int64 (0 = off)
    top_p: torch.Tensor  # [B] float64 (1 = off)
    min_p: torch.Tensor  # [B] float64 (0 = off)
    # what the host learnt from these tensors once (``shortlist._host_flags``): a chunk's
    # parameters are fixed for its whole decode, so they are read once, not once per call
    host: dict[tuple[int, bool], tuple[int, ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    # ``per_position``'s results, each made once (a speculative chunk's verify call asks for the
    # same K + 1 positions every round)
    positions: dict[tuple[int, str], SamplingTensors] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @staticmethod
    def from_params(
        params: Sequence[SamplingParams], device: torch.device | str = "cpu"
    ) -> SamplingTensors:
        return SamplingTensors(
            *(
                torch.tensor([getattr(p, f) for p in params], dtype=dtype, device=device)
                for f, dtype in _DTYPES.items()
            )
        )

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SamplingTensors:
        return SamplingTensors(*(fn(getattr(self, f)) for f in _DTYPES))

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    def index(self, rows: torch.Tensor) -> SamplingTensors:
        """The parameters of a subset (or a repetition) of rows."""
        return self._map(lambda t: t[rows])

    def per_position(self, S: int, device: torch.device) -> SamplingTensors:
        """Each row's parameters repeated for its ``S`` positions: ``[B]`` → ``[B*S]``."""
        key = (S, str(device))
        if key not in self.positions:
            self.positions[key] = self._map(
                lambda t: t.to(device).repeat_interleave(S) if S > 1 else t.to(device)
            )
        return self.positions[key]

    def validate(self, batch_size: int | None = None, where: str = "sampling params") -> None:
        """Check shapes, dtypes and values (the rules of ``validate_params``, row by row).

        Raises ``InputError`` for a wrong shape/dtype and ``ConfigError`` naming the first bad row
        and value. One host sync (a vectorised ``any``) on an accelerator.
        """
        self.check_shapes(batch_size, where)
        self.raise_invalid(where)

    def check_shapes(self, batch_size: int | None = None, where: str = "sampling params") -> None:
        """``validate``'s shape and dtype checks (no host sync): ``InputError`` on the first."""
        n = int(self.temperature.shape[0]) if self.temperature.dim() == 1 else -1
        for name, dtype in _DTYPES.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != dtype:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t)
                raise InputError(f"{where}: {name} must be a 1-D {dtype} tensor, got {got!r}")
            if int(t.shape[0]) != n or (batch_size is not None and n != batch_size):
                expected = batch_size if batch_size is not None else n
                raise InputError(
                    f"{where}: {name} has {int(t.shape[0])} rows, expected {expected!r}"
                )

    def invalid(self) -> torch.Tensor:
        """``[B]`` bool on the device: the rows ``validate`` refuses (no host sync)."""
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        return (
            ~torch.isfinite(t) | (t < 0) | (k < 0) | ~((p > 0) & (p <= 1)) | ~((m >= 0) & (m < 1))
        )

    def raise_invalid(self, where: str = "sampling params") -> None:
        """``ConfigError`` naming the first row ``invalid`` flags and its value (none: no-op)."""
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        bad = self.invalid()
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0, 0])
            validate_params(
                float(t[row]), int(k[row]), float(p[row]), float(m[row]), where=f"{where} row {row}"
            )
            raise ConfigError(f"{where} row {row}: invalid sampling parameters")  # unreachable


_DTYPES = {
    "temperature": torch.float64,
    "top_k": torch.int64,
    "top_p": torch.float64,
    "min_p": torch.float64,
}  # SamplingTensors' fields, in order
