"""Per-request sampling parameters: the frozen scalar form and the batched tensor form.

Owns: ``SamplingParams`` (one named config of a protocol) and ``SamplingTensors`` (the same
fields stacked per row, on a device). Validation of values lives here, so every entry point
(protocol, engine, sampler) rejects the same bad values with the same message.
Knows nothing about models, logits or the order filters are applied in (see ``transforms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spectest.errors import ConfigError


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


def validate_params(temperature: float, top_k: int, top_p: float, min_p: float, where: str = "") -> None:
    """Raise ``ConfigError`` naming the first bad value. ``where`` prefixes the message."""
    prefix = f"{where}: " if where else ""
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"{prefix}temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(f"{prefix}top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise ConfigError(f"{prefix}top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(min_p, (int, float)) or not (0.0 <= min_p < 1.0):
        raise ConfigError(f"{prefix}min_p must be in [0, 1), got {min_p!r}")


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters, each of shape ``[B]``, on one device."""

    temperature: torch.Tensor  # [B] float64
    top_k: torch.Tensor  # [B] int64 (0 = off)
    top_p: torch.Tensor  # [B] float64 (1 = off)
    min_p: torch.Tensor  # [B] float64 (0 = off)

    @staticmethod
    def from_params(params: Sequence[SamplingParams], device: torch.device | str = "cpu") -> SamplingTensors:
        return SamplingTensors(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float64, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device),
            min_p=torch.tensor([p.min_p for p in params], dtype=torch.float64, device=device),
        )

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    def index(self, rows: torch.Tensor) -> SamplingTensors:
        """The parameters of a subset (or a repetition) of rows."""
        return SamplingTensors(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.min_p[rows])
