"""Claim (b) from the plain engine teacher-forced at the candidate's prefixes: the candidate's
token marginals against the plain engine's own processed law π at each of its prefixes, TOST
style, for engines whose logits spectest cannot see but which answer "your law at this prefix".

Owns: ``decide_teacher_forced`` and its ``TeacherForcedResult`` (U1 per unit, the candidate's
one-sided bootstrap-t bounds by sequence, the decision against 2m², the reference's own U1 as
the control readout), the first ``n_max`` seeds of each cell as the sequences forced, and the
law table (``LAWS``, ``laws_schema``).
The statistic, why it is unbiased, why no floor is subtracted, its calibration:
docs/numerics.md ("Claim (b) from the plain engine teacher-forced").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import sparse

from spectest import schema
from spectest.errors import InputError
from spectest.stats.drift import decision_words, studentized_bounds, tost
from spectest.stats.options import DEFAULT_LEFT_OUT_MAX
from spectest.stats.token_floor import (
    RESAMPLES,
    TokenFloorResult,
    _weights,
    cell_matrices,
    margin_sq,
)

KIND = "teacher-forced: the plain engine's own law at the candidate's prefixes"
PREFIX = "prefix"  # the sequence's tokens before the position, comma-joined ("" at position 0)
IDS, PROBS = "token_ids", "probs"  # the law's support and its probabilities (list columns)
LAWS = (schema.PROMPT_ID, schema.CONFIG_ID, schema.POSITION, PREFIX, IDS, PROBS)
DEFAULT_SEQUENCES = 1500  # sequences per cell teacher-forced (arms.floor.sequences)
MASS_TOL = 1e-3  # a law summing to within this of 1 covers the support (exact); below: coarsened
OTHER = "other"  # the bin of the tokens outside a short list (coarsened mode)
CHUNK = 1 << 22  # floats per resampling block


def laws_schema() -> pa.Schema:
    """``teacher_laws.parquet``: one row per (prompt, config, position, prefix) answered."""
    return pa.schema(
        [
            pa.field(schema.PROMPT_ID, pa.string()),
            pa.field(schema.CONFIG_ID, pa.string()),
            pa.field(schema.POSITION, pa.int32()),
            pa.field(PREFIX, pa.string()),
            pa.field(IDS, pa.list_(pa.int64())),
            pa.field(PROBS, pa.list_(pa.float64())),
        ]
    )


@dataclass(frozen=True)
class TeacherForcedResult(TokenFloorResult):
    """Claim (b) teacher-forced: ``drift`` = ``statistic`` = the candidate's U1 per unit (the
    floor is 0: nothing subtracted); ``control`` the same on the reference's own sequences, with
    its bounds (a readout: ≈ 0 for a plain engine); ``prefixes`` the distinct prefixes the
    engine answered for; ``mass_min`` the smallest total probability a law reported;
    ``outside_max`` / ``outside_mean`` the mass outside the reported lists (max and mean over
    the laws; > ``MASS_TOL``: the coarsened mode, docs/numerics.md "Top-n lists")."""

    floor_kind: str = KIND
    control: float = math.nan
    control_lcb: float = -math.inf
    control_ucb: float = math.inf
    control_sequences: int = 0
    prefixes: int = 0
    mass_min: float = 1.0
    outside_max: float = 0.0
    outside_mean: float = 0.0
    left_out: int = 0
    left_out_tokens: int = 0
    left_out_rms: float = 0.0
    left_out_max: float = DEFAULT_LEFT_OUT_MAX
    control_left_out: int = 0

    @property
    def left_out_share(self) -> float:
        """The share of the candidate's tokens whose prefix was left out."""
        return self.left_out / self.left_out_tokens if self.left_out_tokens else 0.0

    @property
    def unresolved_why(self) -> str:
        """Why the claim is unresolved when it is for the tokens left out ("" otherwise)."""
        if self.decision != "unresolved" or not self.left_out_share > self.left_out_max:
            return ""
        return (
            f"numerics drift unresolved (claim b, teacher-forced): {self._left_words()}, more "
            f"than tests.left_out_max {self.left_out_max:.2%} (ask a longer list)"
        )

    def _left_words(self) -> str:
        return (
            f"{self.left_out} of {self.left_out_tokens} candidate tokens "
            f"({self.left_out_share:.2%}) left out, their prefix's top-n list not fixing the "
            f"law (the reference's: {self.control_left_out}); RMS share per unit "
            f"{self.left_out_rms:.4f}"
        )

    @property
    def coarsened(self) -> bool:
        """Some law was a top-n list short of 1: U1 reads the coarsened distance."""
        return self.outside_max > MASS_TOL

    @property
    def headline_words(self) -> str:
        return f"token-law drift U1 {self.drift:.2e} within the margin (teacher-forced)"

    @property
    def line(self) -> str:
        what = decision_words(self.decision, self.lcb, self.ucb, ".2e")
        return (
            f"token-law drift U1 {self.drift:.2e} per unit (candidate vs the plain engine's own "
            f"law at its prefixes, ≥ {self.drift_rms_tv:.4f} TV per token RMS), floor "
            f"({self.floor_kind}) 0, nothing subtracted, + margin {self.margin:g} TV (2m² = "
            f"{self.margin_sq:.2e}): {what}; U1 {self.statistic:+.2e} in [{self.lcb:+.2e}, "
            f"{self.ucb:+.2e}] at {1 - self.alpha:.0%} each side over {self.units} units, "
            f"{self.sequences} sequences, {self.prefixes} prefixes; control (the reference's "
            f"own U1) {self.control:+.2e} in [{self.control_lcb:+.2e}, {self.control_ucb:+.2e}] "
            f"over {self.control_sequences} sequences{self._coarse_words()}"
            f"{self._left_line()} (claim b, teacher-forced)"
        )

    def _left_line(self) -> str:
        if not self.left_out:
            return ""
        bar = self.margin - self.left_out_rms - (self.outside_max if self.coarsened else 0.0)
        need = (
            f"within needs the margin less the RMS share, {bar:.4g} TV"
            if bar > 0
            else "within is out of reach"
        )
        return f"; {self._left_words()} ({need})"

    def _coarse_words(self) -> str:
        if not self.coarsened:
            return ""
        m, o = self.margin, self.outside_max
        bar = f"within needs UCB <= (m - outside max)^2 = {max(m - o, 0.0) ** 2:.2e}"
        if o >= m:
            bar = f"within is out of reach: outside max {o:.4f} >= margin {m:g}"
        return (
            f"; coarsened: top-n lists, the mass outside them max {o:.4f} mean "
            f"{self.outside_mean:.4f} per prefix, read as one 'other' bin ({bar})"
        )


def _first(cells: dict[tuple[str, str], np.ndarray], n_max: int) -> dict:
    """Each cell's first ``n_max`` sequences (``cell_matrices`` sorts them by seed)."""
    return {k: v[:n_max] for k, v in cells.items()}


def prefix_key(tokens: np.ndarray) -> str:
    return ",".join(str(int(v)) for v in tokens)


@dataclass(frozen=True)
class _Unit:
    """One (cell, position): the sequences' token codes ``x`` and prefix indices ``h`` (−1: no
    token), the one-hot and prefix maps (sparse ``[n, V']``, ``[n, m]``), the laws ``P [m, V']``
    and each sequence's ‖Z_i‖² = 1 − 2π_i(x_i) + ‖π_i‖²."""

    has: np.ndarray
    onehot: Any
    hmap: Any
    P: np.ndarray
    z2: np.ndarray


def _unit(X: np.ndarray, t: int, laws: dict, cell: tuple[str, str]) -> _Unit | None:
    """``_counted``'s unit alone."""
    return _counted(X, t, laws, cell)[0]


def _counted(
    X: np.ndarray, t: int, laws: dict, cell: tuple[str, str]
) -> tuple[_Unit | None, int, int]:
    """The unit at position ``t`` of a cell's tokens ``X [n, T]`` (None with < 2 tokens), the
    tokens left out (their prefix's law is empty: the list did not fix it) and the tokens. A
    law short of 1 (a top-n list) is coarsened: its missing mass is the column ``OTHER`` (the
    last) and a token outside its list is coded there."""
    has = X[:, t] >= 0
    keys = [prefix_key(X[i, :t]) if has[i] else None for i in range(len(X))]
    try:
        law = {k: laws[(cell[0], cell[1], t, k)] for k in {k for k in keys if k is not None}}
    except KeyError as err:
        raise ValueError(f"the law table lacks the prefix {err.args[0]!r}") from None
    tokens = int(has.sum())
    has &= np.array([k is not None and len(law[k][0]) > 0 for k in keys], dtype=bool)
    left = tokens - int(has.sum())
    if has.sum() < 2:
        return None, left, tokens
    distinct = sorted({str(k) for k, h in zip(keys, has, strict=True) if h})
    got = [law[k] for k in distinct]
    n, rows = len(X), np.flatnonzero(has)
    pos = {k: r for r, k in enumerate(distinct)}
    h = np.array([pos[str(keys[i])] for i in rows], dtype=np.int64)
    tok = X[rows, t].astype(np.int64)
    lists = [set(ids.tolist()) if 1 - p.sum() > MASS_TOL else None for ids, p in got]
    pairs = zip(h.tolist(), tok.tolist(), strict=True)
    out = np.array([lists[r] is not None and v not in lists[r] for r, v in pairs], dtype=bool)
    vocab = np.unique(np.concatenate([tok[~out], *(ids for ids, _ in got)]))
    coarse = any(s is not None for s in lists)
    P = np.zeros((len(distinct), len(vocab) + coarse))
    for r, (ids, p) in enumerate(got):
        P[r, np.searchsorted(vocab, ids)] += p
        if lists[r] is not None:
            P[r, -1] = 1 - p.sum()
    x = np.where(out, len(vocab), np.searchsorted(vocab, tok))
    one = np.ones(len(rows))
    onehot = sparse.csr_matrix((one, (rows, x)), shape=(n, P.shape[1]))
    hmap = sparse.csr_matrix((one, (rows, h)), shape=(n, len(distinct)))
    z2 = np.zeros(n)
    z2[rows] = 1 - 2 * P[h, x] + (P * P).sum(-1)[h]
    return _Unit(has.astype(np.float64), onehot, hmap, P, z2), left, tokens


def _u1(u: _Unit, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """U1 and its plug-in variance for sequence multiplicities ``w [B, n]``, without the pairs
    of copies of one sequence: (‖Σ w_i Z_i‖² − Σ w_i² ‖Z_i‖²) / (N² − Σ w_i²)."""
    w = w * u.has
    N, S2 = w.sum(-1), (w * w).sum(-1)
    a = (u.onehot.T @ w.T).T  # [B, V'] weighted token counts
    s = a - (u.P.T @ (u.hmap.T @ w.T)).T  # Σ w_i Z_i
    U = ((s * s).sum(-1) - (w * w) @ u.z2) / np.maximum(N * N - S2, 1e-300)
    mu = s / np.maximum(N, 1)[:, None]
    zm = (u.onehot @ mu.T) - (u.hmap @ (u.P @ mu.T))  # [n, B]: Z_i · μ
    m1 = (w * zm.T).sum(-1) / np.maximum(N, 1)
    m2 = (w * zm.T**2).sum(-1) / np.maximum(N, 1)
    pa = a / np.maximum(N, 1)[:, None]
    var = 4 * (m2 - m1 * m1) / np.maximum(N, 1) + 2 * (pa * pa).sum(-1) / np.maximum(N * N, 1)
    return U, var


def _units(
    df: pd.DataFrame, laws: dict, n_max: int
) -> tuple[list[tuple[int, list[_Unit]]], np.ndarray]:
    """Per cell: its sequence count and its units; and per unit with a token, (tokens left
    out, tokens) ``[units, 2]``."""
    out, left = [], []
    for cell, X in sorted(_first(cell_matrices(df), n_max).items()):
        us = [_counted(X, t, laws, cell) for t in range(X.shape[1])]
        kept = [u for u, _, _ in us if u is not None]
        left += [(k, n) for _, k, n in us if n]
        if kept:
            out.append((len(X), kept))
    return out, np.array(left, dtype=np.int64).reshape(-1, 2)


def _bounds(
    cells: list[tuple[int, list[_Unit]]], alpha: float, rng: np.random.Generator, resamples: int
) -> tuple[float, float, float, int]:
    """(U1 per unit, LCB, UCB, units): one-sided bootstrap-t bounds each at level α, the
    sequence the resampling unit within each cell (``token_floor._bootstrap_t``'s rule)."""
    units = sum(len(us) for _, us in cells)
    if not units:
        return math.nan, -math.inf, math.inf, 0
    tot, var = 0.0, 0.0
    for n, us in cells:
        for u in us:
            U, v = _u1(u, np.ones((1, n)))
            tot, var = tot + float(U[0]), var + float(v[0])
    stat, se = tot / units, math.sqrt(max(var, 0.0)) / units
    if se == 0.0:
        return stat, stat, stat, units
    bt, bv = np.zeros(resamples), np.zeros(resamples)
    for n, us in cells:
        step = max(1, CHUNK // max(1, n * len(us)))
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            w = _weights(rng.integers(0, n, size=(hi - lo, n)), n)
            for u in us:
                U, v = _u1(u, w)
                bt[lo:hi] += U
                bv[lo:hi] += v
    se_star = np.sqrt(np.maximum(bv, 0)) / units
    return stat, *studentized_bounds(stat, se, bt / units, se_star, alpha), units


def law_dict(laws: pd.DataFrame) -> tuple[dict, float, float]:
    """The law table as ``{(prompt, config, position, prefix): (ids, probs)}``, the smallest
    total mass a law has and the mean mass outside the lists (an empty law, a prefix left out,
    counts in neither). A law with a repeated or negative id, a probability that is negative or
    not finite, or a mass above 1 + ``MASS_TOL`` is not a law: ``InputError`` (exit 2)."""
    out, mass, short = {}, 1.0, []
    for pid, cid, t, k, ids, p in laws[list(LAWS)].itertuples(index=False):
        ids, p = np.asarray(ids, dtype=np.int64), np.asarray(p, dtype=np.float64)
        key = (str(pid), str(cid), int(t), str(k))
        total = float(p.sum()) if np.isfinite(p).all() else math.nan
        if len(set(ids.tolist())) < len(ids) or (ids < 0).any() or len(ids) != len(p):
            raise InputError(f"the law at {key} repeats an id or has a negative one: not a law")
        if not (p >= 0).all() or not total <= 1 + MASS_TOL:
            raise InputError(
                f"the law at {key} has a negative or non-finite probability or sums to "
                f"{total:.6f} > 1 + {MASS_TOL:g}: not a law"
            )
        out[key] = (ids, p)
        if not len(ids):
            continue  # left out: the engine's list did not fix the law at this prefix
        mass = min(mass, total)
        short.append(max(1 - total, 0.0))
    return out, mass, float(np.mean(short)) if short else 0.0


def _decide(lcb: float, ucb: float, margin: float, outside: float, left: float = 0.0) -> Any:
    """TOST against 2m²; coarsened (``outside`` > ``MASS_TOL``): "within" only when
    UCB ≤ (m − outside)², the bound under which the full drift is within 2m²
    (docs/numerics.md "Top-n lists"); with prefixes left out (``left``: the RMS over units of
    the share of tokens left out) "within" needs UCB ≤ 2(m − left)², coarsened
    (m − outside − left)² (docs/numerics.md "A straddled token is left out")."""
    msq = margin_sq(margin)
    coarse = outside > MASS_TOL
    if lcb > msq or (not coarse and left == 0):
        return tost(lcb, ucb, msq)
    reach = margin - left - (outside if coarse else 0.0)
    bar = reach**2 if coarse else margin_sq(reach)
    return "within" if reach > 0 and ucb <= bar else "unresolved"


def _left_fields(left: np.ndarray, bound: float) -> dict[str, Any]:
    """The result's fields of the tokens left out (count, tokens, RMS over units of the share
    left out, the bound) from ``_units``'s ``[units, 2]`` counts."""
    rms = float(np.sqrt(np.mean((left[:, 0] / left[:, 1]) ** 2))) if len(left) else 0.0
    k, n = int(left[:, 0].sum()), int(left[:, 1].sum())
    return {"left_out": k, "left_out_tokens": n, "left_out_rms": rms, "left_out_max": bound}


def _control(
    reference: pd.DataFrame | None,
    table: dict,
    n_max: int,
    alpha: float,
    rng: np.random.Generator,
    resamples: int,
) -> dict[str, Any]:
    """The control readout's fields: the reference's own U1, bounds, sequences, tokens left
    out (none without a reference)."""
    if reference is None:
        return {}
    cells, left = _units(reference, table, n_max)
    stat, lcb, ucb, _ = _bounds(cells, alpha, rng, resamples)
    return {
        "control": stat,
        "control_lcb": lcb,
        "control_ucb": ucb,
        "control_sequences": sum(n for n, _ in cells),
        "control_left_out": int(left[:, 0].sum()),
    }


def decide_teacher_forced(
    candidate: pd.DataFrame,
    laws: pd.DataFrame,
    *,
    margin: float,
    alpha: float,
    rng: np.random.Generator,
    n_max: int = DEFAULT_SEQUENCES,
    reference: pd.DataFrame | None = None,
    resamples: int = RESAMPLES,
    left_out_max: float = DEFAULT_LEFT_OUT_MAX,
) -> TeacherForcedResult:
    """Claim (b) from the candidate's samples frame (``schema.BYO_SCHEMA`` columns) and the
    plain engine's laws at its prefixes (``LAWS`` columns; every prefix of ``needed_prefixes``);
    ``reference``: the control readout on the reference's own sequences. No unit with two
    tokens: infinite bounds, ``unresolved``. A law short of 1 by more than ``MASS_TOL`` (a
    top-n list) is coarsened: the tokens outside its list are one bin; a table that is not a
    law is refused (``law_dict``).

    Notes
    -----
    Assumes each law is the engine's processed law at its prefix, or a list of its entries that
    is a function of the prefix alone (top-n by probability): then E[e_{c_h(x)} | h] = π̃(h)
    (c_h: a token to itself on the list, to "other" off it) for a candidate that samples π, and
    U1 stays exactly unbiased, mean 0. "Within" against (m − outside max)² assumes the outside
    mass at the candidate's prefixes is at most the largest seen. A list within ``MASS_TOL`` of
    1 is the whole law. An empty law (decided by the list alone) leaves its tokens out: U1 on
    the rest mean 0; "within" takes off the RMS share left out per unit (for the chance of
    reaching such a prefix). Sequences of a cell are exchangeable given the cell.
    """
    table, mass, outside_mean = law_dict(laws)
    cells, left = _units(candidate, table, n_max)
    stat, lcb, ucb, units = _bounds(cells, alpha, rng, resamples)
    control = _control(reference, table, n_max, alpha, rng, resamples)
    msq = margin_sq(margin)
    outside = max(1 - mass, 0.0)
    lf = _left_fields(left, float(left_out_max))
    decision = _decide(lcb, ucb, margin, outside, lf["left_out_rms"])
    if decision == "within" and lf["left_out"] > left_out_max * lf["left_out_tokens"]:
        decision = "unresolved"
    return TeacherForcedResult(
        drift=stat,
        floor=0.0,
        statistic=stat,
        lcb=lcb,
        ucb=ucb,
        margin=float(margin),
        margin_sq=msq,
        alpha=float(alpha),
        decision=decision,
        units=units,
        sequences=sum(n for n, _ in cells),
        floor_sequences=0,
        prefixes=len(table),
        mass_min=mass,
        outside_max=outside,
        outside_mean=outside_mean,
        **lf,
        **control,
    )
