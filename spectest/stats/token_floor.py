"""Claim (b) from tokens alone: spec-vs-plain token-law drift against the plain-vs-plain floor,
TOST style, for engines whose logits spectest cannot see (``decide_token_floor`` →
``TokenFloorResult``; ``margin_sq``).
docs/numerics.md "Claim (b) for foreign engines: the floor arm (issue 31)".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from spectest.stats.drift import DriftDecision, decision_words, studentized_bounds, tost
from spectest.stats.token_drift import _cells, _counts

RESAMPLES = 1000
DEFAULT_TOKEN_MARGIN = 0.01  # TV per token, applied as 2m² (``margin_sq``); why: docs/numerics.md
CHUNK = 1 << 23  # floats per resampling block


def margin_sq(margin_tv: float) -> float:
    """The squared-L2 margin of a TV-per-token margin: the largest Σ_v (p − q)² two laws at TV
    ``margin_tv`` can have (docs/numerics.md)."""
    return 2.0 * margin_tv * margin_tv


@dataclass(frozen=True)
class TokenFloorResult:
    """Claim (b) from tokens. ``drift`` / ``floor`` / ``statistic`` / bounds in squared L2 per
    unit; ``margin`` in TV per token, ``margin_sq`` = 2·margin².

    Not a ``FamilyResult``: claim (b) is an equivalence decision (TOST on one-sided bootstrap-t
    bounds, three outcomes) at its own α, not a family of p-value tests sharing claim (a)'s α.
    """

    drift: float
    floor: float
    statistic: float
    lcb: float
    ucb: float
    margin: float
    margin_sq: float
    alpha: float
    decision: DriftDecision
    units: int
    sequences: int
    floor_sequences: int
    floor_kind: str = "floor arm"

    @property
    def rejected(self) -> bool:
        """The claim fails: the drift's excess is beyond the margin (exit 1)."""
        return self.decision == "beyond"

    @property
    def drift_rms_tv(self) -> float:
        """sqrt(max(drift, 0)/2): the smallest RMS TV per position the drift estimate implies."""
        return math.sqrt(max(self.drift, 0.0) / 2)

    @property
    def headline_words(self) -> str:
        return f"token-law drift Δ² {self.drift:.2e} within the floor + margin"

    @property
    def line(self) -> str:
        what = decision_words(self.decision, self.lcb, self.ucb, ".2e")
        return (
            f"token-law drift Δ² {self.drift:.2e} per unit (spec vs plain, "
            f"≥ {self.drift_rms_tv:.4f} TV per token RMS), floor ({self.floor_kind}) "
            f"Δ² {self.floor:.2e} + margin "
            f"{self.margin:g} TV (2m² = {self.margin_sq:.2e}): {what}; D = drift − floor "
            f"{self.statistic:+.2e} in [{self.lcb:+.2e}, {self.ucb:+.2e}] at "
            f"{1 - self.alpha:.0%} each side over {self.units} units, {self.sequences} + "
            f"{self.floor_sequences} sequences (claim b, tokens only)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rejected": self.rejected, "line": self.line}


def _weights(idx: np.ndarray, n: int) -> np.ndarray:
    """Multiplicities ``[B, n]`` of resample indices ``[B, n]``."""
    B = idx.shape[0]
    flat = idx + n * np.arange(B)[:, None]
    return np.bincount(flat.reshape(-1), minlength=B * n).reshape(B, n).astype(np.float64)


def _side(codes: np.ndarray, idx: np.ndarray | None, V: int) -> tuple[np.ndarray, ...]:
    """(counts [..., T, V], N [..., T], Σ_i w_i² over sequences with a token [..., T]) of one
    file ``codes [n, T]``, or of its resamples ``idx [B, n]`` (w_i: sequence i's multiplicity)."""
    has = (codes < V).astype(np.float64)  # [n, T]
    if idx is None:
        c = _counts(codes, V)
        return c, c.sum(-1), has.sum(0)
    c = _counts(codes[idx], V)  # each resampled sequence's tokens, with multiplicity
    w = _weights(idx, len(codes))
    return c, c.sum(-1), (w * w) @ has


def _u(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The U-statistic of Σ_v (p − q)² per position without same-sequence pairs, and its
    plug-in variance (docs/numerics.md), from two ``_side`` triples."""
    ca, na, sa = a
    cb, nb, sb = b
    pa = ca / np.maximum(na, 1)[..., None]
    pb = cb / np.maximum(nb, 1)[..., None]
    xx = ((ca * ca).sum(-1) - sa) / np.maximum(na * na - sa, 1e-300)
    yy = ((cb * cb).sum(-1) - sb) / np.maximum(nb * nb - sb, 1e-300)
    xy = (ca * cb).sum(-1) / np.maximum(na * nb, 1e-300)
    u = xx + yy - 2 * xy
    d = pa - pb
    var1a = (pa * d * d).sum(-1) - (pa * d).sum(-1) ** 2
    var1b = (pb * d * d).sum(-1) - (pb * d).sum(-1) ** 2
    pi = (pa + pb) / 2
    inv = 1 / np.maximum(na, 1) + 1 / np.maximum(nb, 1)
    var = 4 * var1a / np.maximum(na, 1) + 4 * var1b / np.maximum(nb, 1)
    return u, var + 2 * inv * inv * (pi * pi).sum(-1)


def _cell_terms(
    files: list[np.ndarray], pairs: tuple[tuple[int, int], tuple[int, int]], idx: list | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One cell: (drift u, drift var, floor u, floor var, ok) per position, for the sample
    (``idx`` None) or for resamples (``idx[k]`` the indices ``[B, n_k]`` of file k)."""
    T = min(f.shape[1] for f in files)
    files = [f[:, :T] for f in files]
    vocab, inv = np.unique(np.concatenate([f.reshape(-1) for f in files]), return_inverse=True)
    gap = int(vocab[0] < 0)
    V = len(vocab) - gap
    inv = inv.reshape(-1) - gap
    codes, at = [], 0
    for f in files:
        code = inv[at : at + f.size].reshape(f.shape)
        codes.append(np.where(code < 0, V, code))
        at += f.size
    sides = [_side(c, None if idx is None else idx[k], V) for k, c in enumerate(codes)]
    ok = np.all([_side(c, None, V)[1] >= 2 for c in codes], axis=0)  # [T]
    (i, j), (k, m) = pairs
    ud, vd = _u(sides[i], sides[j])
    uf, vf = _u(sides[k], sides[m])
    return ud, vd, uf, vf, ok


def decide_token_floor(
    reference: pd.DataFrame,
    candidate: pd.DataFrame,
    floor_a: pd.DataFrame,
    floor_b: pd.DataFrame,
    *,
    margin: float,
    alpha: float,
    rng: np.random.Generator,
    floor_kind: str = "floor arm",
    resamples: int = RESAMPLES,
) -> TokenFloorResult:
    """Claim (b) from four samples frames (``schema.BYO_SCHEMA`` columns); ``floor_a`` may be
    ``reference`` itself (the same object: resampled jointly). No unit held by all four, or
    fewer than two sequences a side: infinite bounds, ``unresolved``."""
    frames = [reference, candidate, floor_a, floor_b]
    uniq = [f for k, f in enumerate(frames) if not any(g is f for g in frames[:k])]
    ids = [next(k for k, g in enumerate(uniq) if g is f) for f in frames]
    pairs = ((ids[0], ids[1]), (ids[2], ids[3]))
    cells = [_cells(f) for f in uniq]
    keys = sorted(set.intersection(*(set(c) for c in cells)))
    stat_parts: list[tuple[np.ndarray, ...]] = []
    per_cell: list[tuple[list[np.ndarray], np.ndarray]] = []
    for key in keys:
        files = [c[key] for c in cells]
        ud, vd, uf, vf, ok = _cell_terms(files, pairs, None)
        if ok.any():
            stat_parts.append((ud[ok], vd[ok], uf[ok], vf[ok]))
            per_cell.append((files, ok))
    units = sum(len(p[0]) for p in stat_parts)
    seqs = sum(len(f[pairs[0][0]]) + len(f[pairs[0][1]]) for f, _ in per_cell)
    fseqs = sum(len(f[pairs[1][0]]) + len(f[pairs[1][1]]) for f, _ in per_cell)
    msq = margin_sq(margin)
    drift = floor = stat = math.nan
    lcb, ucb = -math.inf, math.inf
    if units:
        drift = float(sum(p[0].sum() for p in stat_parts)) / units
        floor = float(sum(p[2].sum() for p in stat_parts)) / units
        se = math.sqrt(float(sum(p[1].sum() + p[3].sum() for p in stat_parts))) / units
        stat = drift - floor
        lcb, ucb = _bootstrap_t(per_cell, pairs, stat, se, units, alpha, rng, resamples)
    decision = tost(lcb, ucb, msq)
    return TokenFloorResult(
        drift=drift,
        floor=floor,
        statistic=stat,
        lcb=lcb,
        ucb=ucb,
        margin=float(margin),
        margin_sq=msq,
        alpha=float(alpha),
        decision=decision,
        units=units,
        sequences=seqs,
        floor_sequences=fseqs,
        floor_kind=floor_kind,
    )


def _bootstrap_t(
    per_cell: list[tuple[list[np.ndarray], np.ndarray]],
    pairs: tuple[tuple[int, int], tuple[int, int]],
    stat: float,
    se: float,
    units: int,
    alpha: float,
    rng: np.random.Generator,
    resamples: int,
) -> tuple[float, float]:
    """One-sided bootstrap-t bounds (LCB, UCB) of D, each at level α (docs/numerics.md)."""
    if se == 0.0 or any(min(len(f) for f in files) < 2 for files, _ in per_cell):
        return (stat, stat) if se == 0.0 else (-math.inf, math.inf)
    tot = np.zeros(resamples)
    var = np.zeros(resamples)
    for files, ok in per_cell:
        size = sum(len(f) for f in files) * (ok.size + 1) * 8
        step = max(1, CHUNK // max(1, size))
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            idx = [rng.integers(0, len(f), size=(hi - lo, len(f))) for f in files]
            ud, vd, uf, vf, _ = _cell_terms(files, pairs, idx)
            tot[lo:hi] += (ud - uf)[:, ok].sum(-1)
            var[lo:hi] += (vd + vf)[:, ok].sum(-1)
    return studentized_bounds(stat, se, tot / units, np.sqrt(var) / units, alpha)
