"""Claim (b) from tokens alone, for engines whose logits spectest cannot see: spec-vs-plain
token-law drift against the plain-vs-plain floor, TOST style (``decide_token_floor`` →
``TokenFloorResult``; ``margin_sq``), and the readout of ``spectest compare --floor A B``, which
changes no verdict (``token_drift`` → ``TokenDriftResult``; ``pair_distance``). Both read the
per-cell token matrices (``cell_matrices``). docs/numerics.md
"Claim (b) for foreign engines: the floor arm (issue 31)" and
docs/numerics.md "`spectest compare --floor A B`: the token-only readout".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.stats.drift import DriftDecision, decision_words, studentized_bounds, tost

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


def cell_matrices(df: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
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


def _codes(files: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """The token matrices ``files`` (each [n_k, T_k], −1: no token) cut to their shortest T and
    coded 0..V−1 over their joint vocabulary, V where a sequence has no token; and V."""
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
    return codes, V


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
    codes, V = _codes(files)
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
    cells = [cell_matrices(f) for f in uniq]
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
    cx, cy = cell_matrices(x), cell_matrices(y)
    total, units, seqs = 0.0, 0, 0
    boot = np.zeros(resamples)
    for key in sorted(set(cx) & set(cy)):
        (ca, cb), V = _codes([cx[key], cy[key]])
        u, ok = _ustat(_counts(ca, V), _counts(cb, V))
        if not ok.any():
            continue
        total += float(u[ok].sum())
        units += int(ok.sum())
        seqs += len(ca) + len(cb)
        step = max(1, (1 << 22) // max(1, (len(ca) + len(cb)) * ca.shape[1]))
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            ra = ca[rng.integers(0, len(ca), size=(hi - lo, len(ca)))]
            rb = cb[rng.integers(0, len(cb), size=(hi - lo, len(cb)))]
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
