"""The token-only drift readout of ``spectest compare --floor A B`` (``token_drift`` →
``TokenDriftResult``): Δ² of reference vs candidate beside Δ² of two plain files A, B
(``pair_distance``). Changes no verdict.
docs/numerics.md "`spectest compare --floor A B`: the token-only readout".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema

RESAMPLES = 1000


@dataclass(frozen=True)
class TokenDriftResult:
    """The readout: Δ² per unit of the comparison and of the floor pair, D and its one-sided
    bounds at level ``alpha``, and the units and sequences each used.

    Not a ``FamilyResult``: a readout beside the verdict (basic-bootstrap interval of D), no
    test at any share of the run's α and no decision.
    """

    drift: float
    floor: float
    statistic: float
    lcb: float
    ucb: float
    alpha: float
    units: int
    floor_units: int
    sequences: int
    floor_sequences: int

    @property
    def excess_shown(self) -> bool:
        """D > 0 at level α: the comparison's token laws differ by more than the floor's."""
        return self.lcb > 0

    @property
    def line(self) -> str:
        what = (
            "the candidate differs from plain decode by more than the floor pair does"
            if self.excess_shown
            else "no excess over the floor shown"
        )
        return (
            f"token-law drift (readout, claim b, tokens only): Δ² {self.drift:.2e} "
            f"(reference vs candidate, {self.units} units) vs floor Δ² {self.floor:.2e} "
            f"(A vs B, {self.floor_units} units); D {self.statistic:+.2e} in "
            f"[{self.lcb:+.2e}, {self.ucb:+.2e}] at {1 - self.alpha:.0%} each side: {what}; "
            "not a verdict (docs/numerics.md)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "excess_shown": self.excess_shown, "line": self.line}


def _cells(df: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """Each cell's tokens ``[sequences, positions]`` (−1 where a sequence has none)."""
    out = {}
    for key, g in df.groupby(list(schema.CELL), sort=True):
        w = g.pivot_table(
            index=schema.SEED, columns=schema.POSITION, values=schema.TOKEN_ID, aggfunc="first"
        )
        w = w.reindex(columns=range(int(g[schema.POSITION].max()) + 1))
        out[(str(key[0]), str(key[1]))] = w.fillna(-1).to_numpy(dtype=np.int64)
    return out


def _counts(codes: np.ndarray, V: int) -> np.ndarray:
    """Counts ``[..., T, V]`` of codes ``[..., n, T]`` in 0..V (V = no token: dropped)."""
    *lead, n, T = codes.shape
    b = int(np.prod(lead)) if lead else 1
    flat = codes.reshape(b, n, T) + (V + 1) * np.arange(T)[None, None, :]
    flat = flat + (T * (V + 1)) * np.arange(b)[:, None, None]
    c = np.bincount(flat.reshape(-1), minlength=b * T * (V + 1)).reshape(*lead, T, V + 1)
    return c[..., :V].astype(np.float64)


def _ustat(cx: np.ndarray, cy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased Σ_v (p − q)² per position from counts ``[..., T, V]``, and which positions
    have ≥ 2 tokens on both sides."""
    n, m = cx.sum(-1), cy.sum(-1)
    ok = (n >= 2) & (m >= 2)
    n1, m1 = np.where(ok, n, 2), np.where(ok, m, 2)
    xx = ((cx * cx).sum(-1) - n1) / (n1 * (n1 - 1))
    yy = ((cy * cy).sum(-1) - m1) / (m1 * (m1 - 1))
    xy = (cx * cy).sum(-1) / (n1 * m1)
    return np.where(ok, xx + yy - 2 * xy, 0.0), ok


def pair_distance(
    x: pd.DataFrame, y: pd.DataFrame, rng: np.random.Generator, resamples: int
) -> tuple[float, np.ndarray, int, int]:
    """Δ²(x, y) (docs/numerics.md), its ``resamples`` bootstrap draws, the units and the sequences
    it used; NaN (and NaN draws) when the files share no unit."""
    cx, cy = _cells(x), _cells(y)
    total, units, seqs = 0.0, 0, 0
    boot = np.zeros(resamples)
    for key in sorted(set(cx) & set(cy)):
        a, b = cx[key], cy[key]
        T = min(a.shape[1], b.shape[1])
        a, b = a[:, :T], b[:, :T]
        vocab, inv = np.unique(np.concatenate([a.reshape(-1), b.reshape(-1)]), return_inverse=True)
        has_gap = vocab[0] < 0
        V = len(vocab) - int(has_gap)
        codes = inv.reshape(-1) - int(has_gap)
        codes = np.where(codes < 0, V, codes)  # no token → the dropped bin
        ca, cb = codes[: a.size].reshape(a.shape), codes[a.size :].reshape(b.shape)
        u, ok = _ustat(_counts(ca, V), _counts(cb, V))
        if not ok.any():
            continue
        total += float(u[ok].sum())
        units += int(ok.sum())
        seqs += len(a) + len(b)
        step = max(1, (1 << 22) // max(1, (len(a) + len(b)) * T))
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            ra = ca[rng.integers(0, len(a), size=(hi - lo, len(a)))]
            rb = cb[rng.integers(0, len(b), size=(hi - lo, len(b)))]
            ub, _ = _ustat(_counts(ra, V), _counts(rb, V))
            boot[lo:hi] += ub[:, ok].sum(-1)
    if not units:
        return math.nan, np.full(resamples, math.nan), 0, 0
    return total / units, boot / units, units, seqs


def token_drift(
    reference: pd.DataFrame,
    candidate: pd.DataFrame,
    floor_a: pd.DataFrame,
    floor_b: pd.DataFrame,
    *,
    alpha: float,
    rng: np.random.Generator,
    resamples: int = RESAMPLES,
) -> TokenDriftResult:
    """The readout for four samples frames (``schema.BYO_SCHEMA`` columns); a side with no
    shared unit gives NaN numbers and infinite bounds."""
    drift, bd, units, seqs = pair_distance(reference, candidate, rng, resamples)
    floor, bf, funits, fseqs = pair_distance(floor_a, floor_b, rng, resamples)
    stat = drift - floor
    if units and funits:
        star = bd - bf
        hi, lo = np.quantile(star, [1 - alpha, alpha])
        mean = float(star.mean())
        lcb, ucb = stat - (float(hi) - mean), stat + (mean - float(lo))
    else:
        lcb, ucb = -math.inf, math.inf
    return TokenDriftResult(
        drift=drift,
        floor=floor,
        statistic=stat,
        lcb=lcb,
        ucb=ucb,
        alpha=float(alpha),
        units=units,
        floor_units=funits,
        sequences=seqs,
        floor_sequences=fseqs,
    )
