"""Round-aware two-sample tests: the token law by round stratum (``strata_of``) and the
accepted-length law, as χ² of 2×k tables under the shared relabelings with step-down max-T
(``round_tests``), and their family (``RoundsFamily``), whose tests are *claims*: they can add a
rejection and never count as "a family ran" for a pass, so a fabricated rounds table cannot make
exit 0. Knows no files or other families. What the null assumes: docs/rounds.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.stats import homogeneity, multiplicity
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame, failures
from spectest.stats.histograms import MISSING, EncodedSamples

ROUNDS_COLUMNS_NEEDED = (
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    sc.ARM,
    sc.SEED,
    sc.POSITION,
    "drafted",
    "accepted",
    "emitted",
)
ROUND_TEST_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "stratum",
    "statistic",
    "dof",
    "pvalue",  # asymptotic χ² p (the max-T scale only: tokens of a sequence are dependent)
    "p_adj",  # Westfall–Young step-down over every test of the family (exact at finite B)
    "reject",
    "n_ref",  # stratum entries (tokens or rounds) in the reference arm
    "n_cand",
    "n_bins",
    "status",
]
BONUS, RECOVERED, ACCEPTED_LEN = "bonus", "recovered", "accepted_len"


@dataclass(frozen=True)
class Strata:
    """Every stratum entry of the two arms: sequence index (into ``EncodedSamples``), stratum
    name code (into ``names``) and category (a token stratum: position·V + token; the
    accepted-length stratum: drafted·(K+1) + accepted)."""

    names: tuple[str, ...]
    seq: np.ndarray  # [E] int64
    stratum: np.ndarray  # [E] int64
    category: np.ndarray  # [E] int64


def _round_seq(enc: EncodedSamples, rounds: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Each round row's sequence index (rows of no sequence of the two arms dropped)."""
    cells = enc.cells
    seqs = pd.DataFrame(
        {
            sc.PROMPT_ID: cells[sc.PROMPT_ID].to_numpy()[enc.seq_cell].astype(str),
            sc.CONFIG_ID: cells[sc.CONFIG_ID].to_numpy()[enc.seq_cell].astype(str),
            sc.ARM: np.asarray(enc.arms, dtype=object)[enc.seq_arm].astype(str),
            sc.SEED: enc.seq_seed.astype(np.int64),
            "_seq": np.arange(len(enc.seq_cell), dtype=np.int64),
        }
    )
    r = rounds.loc[:, list(ROUNDS_COLUMNS_NEEDED)].copy()
    for col in (sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM):
        r[col] = r[col].astype(str)
    r[sc.SEED] = r[sc.SEED].astype(np.int64)
    m = r.merge(seqs, on=[sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM, sc.SEED], how="inner")
    return m["_seq"].to_numpy(np.int64), m


def strata_of(enc: EncodedSamples, rounds: pd.DataFrame) -> Strata:
    """The stratum entries of every reported round of the two encoded arms.

    A round starting at position s that drafted d, accepted a and emitted e claims tokens at
    s..s+e−1: offset j < d goes to stratum ``offset_j``; offset a (when emitted) is also
    ``bonus`` when a = d, else ``recovered``; the round itself is one ``accepted_len`` entry
    (d, a). Claimed positions with no token in the samples are skipped and d, a, e are clipped
    to [0, T] (the rounds are claims: an absurd one costs no memory).
    """
    seq, r = _round_seq(enc, rounds)
    T = enc.n_positions  # no round can claim more tokens than a sequence has (a lie can)
    p0 = r[sc.POSITION].to_numpy(np.int64)
    d = np.clip(r["drafted"].to_numpy(np.int64), 0, T)
    a = np.clip(r["accepted"].to_numpy(np.int64), 0, T)
    e = np.clip(r["emitted"].to_numpy(np.int64), 0, T)
    k_max = int(max(d.max(initial=1), a.max(initial=0), e.max(initial=1) - 1))
    names = (*(f"offset_{j}" for j in range(k_max)), BONUS, RECOVERED, ACCEPTED_LEN)
    code = {n: i for i, n in enumerate(names)}
    # expand every round into its claimed tokens
    idx = np.repeat(np.arange(len(r)), e)  # [N]
    first = np.repeat(np.cumsum(e) - e, e)
    j = np.arange(len(idx), dtype=np.int64) - first  # offset within the round
    pos = p0[idx] + j
    ok = (pos >= 0) & (pos < T)
    tok = np.full(len(idx), MISSING, dtype=np.int64)
    tok[ok] = enc.tokens[seq[idx[ok]], pos[ok]]
    ok &= tok != MISSING
    V = int(enc.tokens.max(initial=0)) + 1
    cat = pos * V + tok
    s_tok, j_ok, cat_ok, idx_ok = seq[idx[ok]], j[ok], cat[ok], idx[ok]
    final = j_ok == a[idx_ok]
    role = np.where(d[idx_ok] == a[idx_ok], code[BONUS], code[RECOVERED])
    inner = j_ok < d[idx_ok]  # offset d is always the bonus: its own stratum
    parts_seq = [s_tok[inner], s_tok[final], seq]
    parts_str = [j_ok[inner], role[final], np.full(len(seq), code[ACCEPTED_LEN])]
    parts_cat = [
        cat_ok[inner],
        cat_ok[final],
        np.minimum(d, k_max) * (k_max + 1) + np.minimum(a, k_max),
    ]
    return Strata(
        names,
        np.concatenate(parts_seq).astype(np.int64),
        np.concatenate(parts_str).astype(np.int64),
        np.concatenate(parts_cat).astype(np.int64),
    )


def stratum_counts(
    seq_local: np.ndarray, category: np.ndarray, n_seq: int, min_expected: float
) -> np.ndarray:
    """Per-sequence counts [n_seq, k] of one (cell, stratum): a category keeps its own bin
    when its pooled total is ≥ 2·``min_expected``, the others share one bin (none when empty).

    Notes
    -----
    The binning reads pooled totals only, which no relabeling of sequences changes, so it is
    the same under every relabeling and the permutation test stays exact.
    """
    if category.size == 0:
        return np.zeros((n_seq, 0), dtype=np.float64)
    cats, inv = np.unique(category, return_inverse=True)
    tot = np.bincount(inv, minlength=len(cats))
    keep = tot >= 2 * min_expected
    bin_of = np.where(keep, np.cumsum(keep) - 1, int(keep.sum()))  # rest → last bin
    k = int(keep.sum()) + int((~keep).any())
    b = bin_of[inv]
    x = np.bincount(seq_local * k + b, minlength=n_seq * k).astype(np.float64)
    return x.reshape(n_seq, k)


def chi2_under_labels(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Pearson χ² of the 2×k table (reference, candidate) × bins under every labeling.

    ``x`` [n, k] per-sequence counts, ``labels`` [n, L] reference indicators (column 0
    observed). Returns [L]: N²/(n_R n_C) Σ_k (R_k − n_R t_k/N)²/t_k (0 when an arm is empty),
    the 2×k Pearson statistic (tests/test_stats_rounds.py checks it against scipy's).
    """
    t = x.sum(axis=0)  # [k]
    N = float(t.sum())
    R = x.T @ labels.astype(np.float64)  # [k, L]
    n_r = R.sum(axis=0)  # [L]
    n_c = N - n_r
    dev = ((R - np.outer(t, n_r) / N) ** 2 / t[:, None]).sum(axis=0)  # [L]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = N * N / (n_r * n_c) * dev
    return np.where((n_r > 0) & (n_c > 0), out, 0.0)


def _groups(enc: EncodedSamples, st: Strata) -> dict[tuple[int, int], np.ndarray]:
    """Entry indices of every (cell, stratum) with entries, from one stable sort."""
    key = enc.seq_cell[st.seq] * len(st.names) + st.stratum  # [E]
    order = np.argsort(key, kind="stable")
    uniq, start = np.unique(key[order], return_index=True)
    bounds = [*start.tolist(), len(order)]
    n = len(st.names)
    return {(int(u) // n, int(u) % n): order[bounds[i] : bounds[i + 1]] for i, u in enumerate(uniq)}


def _bins(
    enc: EncodedSamples, st: Strata, c: int, sel: np.ndarray, min_expected: float
) -> np.ndarray:
    """One (cell, stratum)'s ``stratum_counts``: its sequences' counts by bin ``[n_c, k]``."""
    lo, hi = int(enc.cell_start[c]), int(enc.cell_start[c + 1])
    return stratum_counts(st.seq[sel] - lo, st.category[sel], hi - lo, min_expected)


def _test_row(
    enc: EncodedSamples,
    st: Strata,
    c: int,
    s: int,
    sel: np.ndarray,
    labels: np.ndarray,
    min_expected: float,
) -> tuple[dict[str, object], np.ndarray]:
    """One (cell, stratum)'s row and its statistic under every labeling of the cell."""
    x = _bins(enc, st, c, sel, min_expected)
    n_ref = int((x * labels[:, :1]).sum())
    testable = x.shape[1] >= 2
    row: dict[str, object] = {
        sc.PROMPT_ID: enc.cells.iloc[c][sc.PROMPT_ID],
        sc.CONFIG_ID: enc.cells.iloc[c][sc.CONFIG_ID],
        "stratum": st.names[s],
        "n_ref": n_ref,
        "n_cand": int(x.sum()) - n_ref,
        "n_bins": int(x.shape[1]),
        "dof": max(int(x.shape[1]) - 1, 0),
        "status": homogeneity.OK if testable else homogeneity.UNTESTABLE,
    }
    stat = chi2_under_labels(x, labels) if testable else np.full(labels.shape[1], np.nan)
    return row, stat


def any_testable(
    enc: EncodedSamples,
    rounds: pd.DataFrame,
    min_expected: float = 5.0,
    strata: Strata | None = None,
) -> bool:
    """Whether some (cell, stratum) of ``round_tests`` is testable (two bins or more), without
    its statistics under the relabelings: the binning reads pooled totals only (``strata``:
    ``strata_of(enc, rounds)`` when the caller has it)."""
    st = strata if strata is not None else strata_of(enc, rounds)
    return any(
        _bins(enc, st, c, sel, min_expected).shape[1] >= 2
        for (c, _), sel in _groups(enc, st).items()
    )


def round_tests(
    enc: EncodedSamples,
    rounds: pd.DataFrame,
    labels: tuple[np.ndarray, ...],
    alpha: float,
    min_expected: float = 5.0,
    strata: Strata | None = None,
) -> pd.DataFrame:
    """Every testable (cell, stratum) two-sample test, max-T adjusted at ``alpha``.

    Parameters
    ----------
    enc : the two arms (code 0 the reference); labels : each cell's [n_c, 1 + B] relabelings
        (``families.relabelings``; B ≥ 1); rounds : the two arms' reported rounds; strata :
        ``strata_of(enc, rounds)`` when the caller has it.

    Returns the ``ROUND_TEST_COLUMNS`` frame (empty when no round matches a sequence).

    Notes
    -----
    The scale is −log of the asymptotic χ²(k−1) p-value (the min-P variant of
    ``multiplicity.maxt_adjust``); its calibration comes from the relabelings alone, so
    within-sequence dependence (several bonus tokens per sequence) costs nothing in validity.
    The smallest attainable adjusted p is 1/(B + 1).
    """
    st = strata if strata is not None else strata_of(enc, rounds)
    rows: list[dict[str, object]] = []
    stats_: list[np.ndarray] = []
    for (c, s), sel in sorted(_groups(enc, st).items()):
        row, stat = _test_row(enc, st, c, s, sel, labels[c], min_expected)
        rows.append(row)
        stats_.append(stat)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in ROUND_TEST_COLUMNS})
    df = pd.DataFrame(rows)
    S = np.stack(stats_, axis=1)  # [1 + B, m]
    dof = df["dof"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = -stats.chi2.logsf(S, np.maximum(dof, 1)[None, :])  # [1 + B, m]
    scale[:, dof < 1] = np.nan
    df["statistic"] = S[0]
    df["pvalue"] = np.where(dof >= 1, np.exp(-scale[0]), np.nan)
    res = multiplicity.maxt_adjust(scale[0], scale[1:], alpha, step_down=True)
    df["p_adj"] = res.pvalue_adjusted
    df["reject"] = res.reject & (df["status"] == homogeneity.OK).to_numpy()
    return df.loc[:, ROUND_TEST_COLUMNS]


def _both_arms(inputs: FamilyInputs) -> pd.DataFrame | None:
    """The two arms' round rows when each arm has some, else None (the family is off)."""
    r = inputs.rounds
    if r is None or not len(r) or any(c not in r.columns for c in ROUNDS_COLUMNS_NEEDED):
        return None
    arms = set(r[sc.ARM].astype(str).unique())
    if inputs.reference not in arms or inputs.candidate not in arms:
        return None
    return r[r[sc.ARM].astype(str).isin([inputs.reference, inputs.candidate])]


class RoundsFamily:
    """Where the engine reports rounds: the law of the bonus token, of the recovered token, of
    the token at each round offset, and of (drafted, accepted), two-sample per cell."""

    name = "rounds"
    label = "round-aware (reported rounds)"

    def _table(self, inputs: FamilyInputs, alpha: float) -> pd.DataFrame:
        r = _both_arms(inputs)
        if r is None or inputs.options.null_permutations < 1:
            return empty_frame(ROUND_TEST_COLUMNS)
        return round_tests(
            inputs.enc,
            r,
            inputs.labels,
            alpha if alpha > 0 else 0.5,
            inputs.options.min_expected,
            self._strata(inputs, r),
        )

    @staticmethod
    def _strata(inputs: FamilyInputs, r: pd.DataFrame) -> Strata:
        """``strata_of`` the inputs' two arms, once for ``active`` and ``run``."""
        return inputs.memoized("rounds.strata", lambda: strata_of(inputs.enc, r))

    def active(self, inputs: FamilyInputs) -> bool:
        """Both arms report rounds (a fact of the arms' engines, not of the random labels) and
        some test is testable (its binning reads pooled totals only; ``any_testable``, so the
        statistics under the relabelings are computed once, by ``run``)."""
        r = _both_arms(inputs)
        if r is None or inputs.options.null_permutations < 1:
            return False
        return any_testable(inputs.enc, r, inputs.options.min_expected, self._strata(inputs, r))

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        df = self._table(inputs, alpha)
        notes: tuple[str, ...] = ()
        if alpha > 0 and len(df) and 1.0 / (inputs.options.null_permutations + 1) > alpha:
            notes = (
                f"round-aware family: B = {inputs.options.null_permutations} permutations "
                f"cannot reach its α share {alpha:.3g} (smallest p 1/(B+1))",
            )
        if alpha <= 0 and len(df):
            df = df.assign(p_adj=float("nan"), reject=False)
        ok = (df["status"] == homogeneity.OK).to_numpy(bool) if len(df) else np.zeros(0, bool)
        return FamilyResult.of(
            self,
            alpha,
            df,
            ok,
            failures(df, _line),
            claims=True,
            notes=notes,
            resolution_unit="TV of a stratum's law (no closed form: permutation-calibrated)",
        )


def _line(x: Any) -> str:
    return (
        f"rounds {x.stratum} {x.prompt_id}/{x.config_id} p_adj={float(x.p_adj):.3g}: "
        f"χ²={float(x.statistic):.1f} on {int(x.dof)} dof, {int(x.n_ref)} (reference) "
        f"vs {int(x.n_cand)} (candidate) entries, as the engines report their rounds"
    )
