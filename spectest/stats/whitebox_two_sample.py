"""White-box tests valid when the teacher's numerics differ from the engine's: candidate vs
reference, both teacher-forced by one teacher, by whole-sequence permutations within cells
(``two_sample_tests``), and the tolerance control on the reference (``tolerance_control``).
docs/statistics.md ("White-box tests under a teacher's numerics").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.errors import ConfigError
from spectest.stats.pit import pit_values
from spectest.stats.whitebox import WHITEBOX_COLUMNS, row

TWO_SAMPLE_TESTS = ("support_2s", "pit_ks_2s", "pit_ad_2s", "directed_z_2s")
CONTROL_TESTS = ("support_tol", "pit_tol")
# The α split of teacher mode's family (``whitebox.weighted_bonferroni``, within each arm's
# rows: the candidate's two-sample tests, the reference's control), the α split of
# docs/statistics.md "White-box tests under a teacher's numerics".
TEACHER_WEIGHTS: dict[str, float] = {
    "directed_z_2s": 0.10,
    "pit_ks_2s": 0.05,
    "pit_ad_2s": 0.75,
    "support_2s": 0.10,
    "support_tol": 0.5,
    "pit_tol": 0.5,
}
PIT_GRID = 20
# NOTE: a block of relabelings for the token-level KS/AD: [N, block] int32 cumulative counts
_BLOCK = 64


@dataclass(frozen=True)
class TwoSampleResult:
    """One two-sample white-box test: the observed statistic and its permutation p-value."""

    test: str
    statistic: float  # observed T_0 (standardised by the permutation sd for the z / support)
    pvalue: float  # (1 + #{b: T_b >= T_0}) / (B + 1), two-sided where the test is
    pvalue_one_sided: float  # candidate excess (directed z, support); NaN otherwise
    n: int  # tokens compared (both arms)
    mde: float  # directed z: smallest mean excess on A per token detected with 80 % power
    detail: str


@dataclass(frozen=True)
class ToleranceResult:
    """One control test of the reference arm against a per-step TV tolerance τ."""

    test: str
    statistic: float  # support: zero-p count; pit: D = max_j |F_n(x_j) − x_j|
    pvalue: float
    n: int
    detail: str


@dataclass(frozen=True)
class SequenceTable:
    """Per-sequence white-box sums of two arms and the token-level PIT values.

    ``cell`` [S] cell index; ``cand`` [S] bool (candidate arm); ``n_tok`` [S] tokens;
    ``resid`` [S] Σ (1[x ∈ A] − p(A)); ``var`` [S] Σ p(A)(1 − p(A)); ``zeros`` [S] count of
    wb_p == 0; ``u`` [N] PIT values and ``u_seq`` [N] their sequence index.
    """

    cell: np.ndarray
    cand: np.ndarray
    n_tok: np.ndarray
    resid: np.ndarray
    var: np.ndarray
    zeros: np.ndarray
    u: np.ndarray
    u_seq: np.ndarray
    has_a: bool


def sequence_table(
    samples: pd.DataFrame, reference: str, candidate: str, rng: np.random.Generator
) -> SequenceTable:
    """Group the wb_* columns of the two arms by sequence (prompt, config, arm, seed).

    The PIT's uniforms come from ``rng`` in table order (reference rows, then candidate rows).
    """
    sub = samples[samples[sc.ARM].isin([reference, candidate])]
    sub = pd.concat([sub[sub[sc.ARM] == reference], sub[sub[sc.ARM] == candidate]])
    keys = [sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM, sc.SEED]
    seq = sub.groupby(keys, sort=False).ngroup().to_numpy()  # [N]
    cell_of_tok = sub.groupby([sc.PROMPT_ID, sc.CONFIG_ID], sort=False).ngroup().to_numpy()
    S = int(seq.max()) + 1 if seq.size else 0
    p = sub[sc.WB_P].to_numpy(dtype=np.float64)  # [N]
    u = pit_values(sub[sc.WB_CDF_LO].to_numpy(dtype=np.float64), p, rng)  # [N]
    has_a = sc.WB_P_A in sub.columns and sc.WB_IN_A in sub.columns
    if has_a:
        pa = sub[sc.WB_P_A].to_numpy(dtype=np.float64)
        ina = sub[sc.WB_IN_A].fillna(False).to_numpy(dtype=bool).astype(np.float64)
        pa = np.where(np.isfinite(pa), pa, 0.0)
    else:
        pa = ina = np.zeros_like(p)
    cell = np.zeros(S, dtype=np.int64)
    cell[seq] = cell_of_tok
    cand = np.zeros(S, dtype=bool)
    cand[seq] = sub[sc.ARM].to_numpy() == candidate
    return SequenceTable(
        cell=cell,
        cand=cand,
        n_tok=np.bincount(seq, minlength=S).astype(np.int64),
        resid=np.bincount(seq, weights=ina - pa, minlength=S),
        var=np.bincount(seq, weights=pa * (1.0 - pa), minlength=S),
        zeros=np.bincount(seq, weights=(p == 0.0).astype(np.float64), minlength=S),
        u=u,
        u_seq=seq,
        has_a=bool(has_a and np.any(pa > 0)),
    )


def cell_permutations(
    cell: np.ndarray, cand: np.ndarray, B: int, rng: np.random.Generator
) -> np.ndarray:
    """Candidate indicators ``[S, 1 + B]`` bool: column 0 observed, columns 1..B uniform
    relabelings of whole sequences within each cell (arm sizes per cell kept)."""
    S = cell.shape[0]
    out = np.empty((S, 1 + B), dtype=bool)
    out[:, 0] = cand
    for c in np.unique(cell):
        idx = np.flatnonzero(cell == c)  # [s]
        perm = np.argsort(rng.random((idx.size, B)), axis=0)  # [s, B] uniform permutations
        out[idx, 1:] = cand[idx][perm]
    return out


def _perm_pvalue(t: np.ndarray) -> float:
    """(1 + #{b ≥ 1: t_b ≥ t_0}) / (B + 1) for ``t`` [1 + B] (column 0 observed)."""
    return float((1 + np.sum(t[1:] >= t[0])) / t.shape[0])


def _pit_statistics(tab: SequenceTable, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-sample KS D and Anderson–Darling A² (Scholz & Stephens 1987, k = 2) of the u's under
    every labeling: ``[1 + B]`` each. Tokens inherit their sequence's label.

    Notes
    -----
    With M_j = candidate tokens among the j smallest u's (N pooled, n_c candidate):
    D = max_j |M_j/n_c − (j − M_j)/n_r| and
    A² = (1/N)·(1/n_c + 1/n_r)·Σ_{j<N} (N·M_j − j·n_c)² / (j(N − j)).
    """
    order = np.argsort(tab.u, kind="stable")
    seq_sorted = tab.u_seq[order]  # [N]
    N = seq_sorted.shape[0]
    j = np.arange(1, N + 1, dtype=np.float64)[:, None]  # [N, 1]
    ks, ad = [], []
    for lo in range(0, labels.shape[1], _BLOCK):
        lab = labels[seq_sorted, lo : lo + _BLOCK]  # [N, b] bool
        m = np.cumsum(lab, axis=0, dtype=np.int64).astype(np.float64)  # [N, b]
        n_c = m[-1]  # [b]
        n_r = N - n_c
        ks.append(np.max(np.abs(m / n_c - (j - m) / n_r), axis=0))
        w = (N * m[:-1] - j[:-1] * n_c) ** 2 / (j[:-1] * (N - j[:-1]))  # [N-1, b]
        ad.append(w.sum(axis=0) * (1.0 / n_c + 1.0 / n_r) / N)
    return np.concatenate(ks), np.concatenate(ad)


def two_sample_tests(
    tab: SequenceTable,
    B: int,
    rng: np.random.Generator,
    *,
    power: float = 0.8,
    support_margin: float = 0.0,
) -> list[TwoSampleResult]:
    """The four two-sample white-box tests of the candidate against the reference.

    ``B`` relabelings of whole sequences within cells (``cell_permutations``) serve every test.
    Empty arms give no rows.

    Notes
    -----
    Exact level for any teacher (docs/statistics.md). ``directed_z_2s``: T = R_c/n_c − R_r/n_r (mean
    residual per token), two-sided |T| p-value and the one-sided "candidate puts more mass on
    A" one; the statistic reported is T over the relabelings' sd; its MDE is
    (z_{1−α/2} + z_power)·sd with α = 0.05. ``support_2s``: zero-p rate difference, one-sided
    (a sampler that leaves the support emits *more* zero-p tokens than the reference); it
    rejects only when the share difference also exceeds ``support_margin`` (still level α: the
    rejection region only shrinks; why a margin: docs/families.md "White-box tests").
    """
    if B < 1:
        raise ConfigError(f"two-sample white-box tests need B >= 1 relabelings, got {B!r}")
    n_c_seq, n_r_seq = int(tab.cand.sum()), int((~tab.cand).sum())
    if n_c_seq == 0 or n_r_seq == 0:
        return []
    labels = cell_permutations(tab.cell, tab.cand, B, rng)  # [S, 1+B]
    lab = labels.astype(np.float64)
    tok_c = tab.n_tok @ lab  # [1+B] candidate tokens per labeling
    tok_r = tab.n_tok.sum() - tok_c
    n = int(tab.n_tok.sum())
    out: list[TwoSampleResult] = []

    out.append(_support_2s(tab, lab, tok_c, tok_r, support_margin))

    ks, ad = _pit_statistics(tab, labels)
    nan = float("nan")
    for name, stat, what in (("pit_ks_2s", ks, "KS"), ("pit_ad_2s", ad, "Anderson-Darling")):
        detail = f"two-sample {what} of the teacher's PIT u, sequences permuted within cells"
        out.append(TwoSampleResult(name, float(stat[0]), _perm_pvalue(stat), nan, n, nan, detail))

    if tab.has_a:
        out.append(_directed_z_2s(tab, lab, tok_c, tok_r, power))
    return out


def _mean_difference(
    x: np.ndarray, lab: np.ndarray, tok_c: np.ndarray, tok_r: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-sequence sums ``x`` [S] → the candidate's sum [1+B], the difference of the arms'
    per-token means [1+B] and its sd over the relabelings (NaN for B < 2)."""
    x_c = x @ lab
    t = x_c / tok_c - (x.sum() - x_c) / tok_r
    return x_c, t, float(np.std(t[1:])) if lab.shape[1] > 2 else float("nan")


def _support_2s(
    tab: SequenceTable, lab: np.ndarray, tok_c: np.ndarray, tok_r: np.ndarray, margin: float
) -> TwoSampleResult:
    """``support_2s`` from the labelings ``lab`` [S, 1+B] (``two_sample_tests``' Notes)."""
    z_c, rate, sd = _mean_difference(tab.zeros, lab, tok_c, tok_r)
    p_sup = _perm_pvalue(rate) if tab.zeros.sum() > 0 and rate[0] > margin else 1.0
    return TwoSampleResult(
        "support_2s",
        float(rate[0] / sd) if sd > 0 else 0.0,
        p_sup,
        p_sup,
        int(tab.n_tok.sum()),
        float("nan"),
        f"zero-p share: candidate {z_c[0] / tok_c[0]:.4g}, "
        f"reference {(tab.zeros.sum() - z_c[0]) / tok_r[0]:.4g} (margin {margin:g})",
    )


def _directed_z_2s(
    tab: SequenceTable, lab: np.ndarray, tok_c: np.ndarray, tok_r: np.ndarray, power: float
) -> TwoSampleResult:
    """``directed_z_2s`` from the labelings ``lab`` [S, 1+B] (``two_sample_tests``' Notes)."""
    r_c, t, sd = _mean_difference(tab.resid, lab, tok_c, tok_r)
    mde = (stats.norm.isf(0.025) + stats.norm.ppf(power)) * sd
    return TwoSampleResult(
        "directed_z_2s",
        float(t[0] / sd) if sd > 0 else float("nan"),
        _perm_pvalue(np.abs(t)),
        _perm_pvalue(t),
        int(tab.n_tok.sum()),
        float(mde),
        f"mean excess on A per token: candidate {r_c[0] / tok_c[0]:+.4g}, "
        f"reference {(tab.resid.sum() - r_c[0]) / tok_r[0]:+.4g}",
    )


def support_tolerance(p: np.ndarray, tolerance: float) -> ToleranceResult:
    """Zero-p tokens of one arm against H_ctl (mean per-step TV ≤ τ): Freedman's bound."""
    p = np.asarray(p, dtype=np.float64)
    n = int(p.shape[0])
    count = int(np.sum(p == 0.0))
    mean = n * tolerance
    h = count - mean
    pv = 1.0 if h <= 0 else float(math.exp(-(h * h) / (2.0 * (mean + h / 3.0))))
    return ToleranceResult(
        "support_tol",
        float(count),
        pv,
        n,
        f"{count} zero-p tokens of {n} (share {count / max(n, 1):.4g}, tolerance {tolerance:g})",
    )


def pit_tolerance(u: np.ndarray, tolerance: float, grid: int = PIT_GRID) -> ToleranceResult:
    """Grid deviation of the PIT's empirical CDF against H_ctl: Azuma–Hoeffding + union bound."""
    u = np.asarray(u, dtype=np.float64)
    n = int(u.shape[0])
    if n == 0:
        return ToleranceResult("pit_tol", float("nan"), float("nan"), 0, "no tokens")
    x = np.arange(1, grid, dtype=np.float64) / grid  # [m-1]
    f = np.searchsorted(np.sort(u), x, side="right") / n  # [m-1] F_n(x_j)
    d = float(np.max(np.abs(f - x)))
    excess = max(d - tolerance, 0.0)
    pv = min(1.0, 2.0 * (grid - 1) * math.exp(-2.0 * n * excess * excess))
    return ToleranceResult(
        "pit_tol", d, pv, n, f"max grid |F_n(x) - x| = {d:.4g} (tolerance {tolerance:g})"
    )


def tolerance_control(
    samples: pd.DataFrame, arm: str, tolerance: float, rng: np.random.Generator
) -> list[ToleranceResult]:
    """``support_tol`` and ``pit_tol`` on ``arm`` (the reference): the teacher-mode control."""
    if not (0.0 <= tolerance < 1.0):
        raise ConfigError(f"white-box tolerance must be in [0, 1), got {tolerance!r}")
    sub = samples[samples[sc.ARM] == arm]
    p = sub[sc.WB_P].to_numpy(dtype=np.float64)
    if p.size == 0 or not np.isfinite(p).all():
        return []
    u = pit_values(sub[sc.WB_CDF_LO].to_numpy(dtype=np.float64), p, rng)
    return [support_tolerance(p, tolerance), pit_tolerance(u, tolerance)]


def teacher_whitebox_tests(
    samples: pd.DataFrame,
    reference: str,
    candidate: str,
    rng: np.random.Generator,
    *,
    B: int,
    tolerance: float,
) -> pd.DataFrame:
    """The teacher-mode family as a tidy frame (``stats.whitebox.WHITEBOX_COLUMNS``): the
    reference's control rows (``CONTROL_TESTS``) then the candidate's two-sample rows
    (``TWO_SAMPLE_TESTS``, under the candidate's arm name). ``support_2s`` uses the margin
    ``tolerance / 10`` (``two_sample_tests``)."""
    rows = [
        row(reference, r.test, r.statistic, r.pvalue, r.n, r.detail)
        for r in tolerance_control(samples, reference, tolerance, rng)
    ]
    for arm in (reference, candidate):
        p = samples.loc[samples[sc.ARM] == arm, sc.WB_P].to_numpy(dtype=np.float64)
        if p.size == 0 or not np.isfinite(p).all():
            return pd.DataFrame(rows, columns=WHITEBOX_COLUMNS)
    tab = sequence_table(samples, reference, candidate, rng)
    tests = two_sample_tests(tab, B, rng, support_margin=tolerance / 10.0)
    rows += [{"arm": candidate, **asdict(t)} for t in tests]
    return pd.DataFrame(rows, columns=WHITEBOX_COLUMNS)
