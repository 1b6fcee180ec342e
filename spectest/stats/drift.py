"""Claim (b) decided from the logits: drift − floor against a stated margin, TOST style, on the
per-token table of ``spectest.numerics.table`` (``decide_drift`` → ``DriftResult``, the floor's
choice ``select_floor``, ``bootstrap_t``). Knows no models, files or claim (a). The statistic and
why bootstrap-t: docs/numerics.md "The drift measurement (claim (b))".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

DriftDecision = Literal["within", "beyond", "unresolved"]
SEQUENCE_KEYS = ("prompt_id", "config_id", "seed")
# the floors (``tests.numerics_floor``), in the order ``auto`` tries them, and their columns in
# the drift table (batch: ``spectest.numerics.table``; prefill, dtype: ``spectest.numerics.floors``)
FLOOR_ORDER = ("batch", "prefill", "dtype")
FLOOR_COLUMNS = {"batch": "floor_tv", "prefill": "floor_prefill_tv", "dtype": "floor_dtype_tv"}


def tost(lcb: float, ucb: float, margin: float) -> DriftDecision:
    """Two one-sided tests of D against ``margin``: ``within`` when UCB ≤ margin, ``beyond`` when
    LCB > margin, else ``unresolved``."""
    return "within" if ucb <= margin else "beyond" if lcb > margin else "unresolved"


def decision_words(decision: DriftDecision, lcb: float, ucb: float, fmt: str) -> str:
    """A claim (b) decision as its verdict line says it (``fmt``: the resolution's format)."""
    if decision == "unresolved":
        return f"unresolved at resolution ±{format((ucb - lcb) / 2, fmt)}"
    return "within numerics" if decision == "within" else "drift beyond numerics"


def in_units(d: Any, x: float) -> str:
    """A claim (b) number as result ``d`` states it: TV per token (matched mode) or squared L2
    per unit (from tokens, ``d.margin_sq`` set: ``stats.token_floor``, ``stats.teacher_forced``)."""
    return f"{x:.4f}" if getattr(d, "margin_sq", None) is None else f"{x:+.2e}"


def margin_words(d: Any) -> str:
    """``d``'s margin in the units of its D: ``m`` (TV) or ``m TV (2m² = ...)`` (squared L2)."""
    msq = getattr(d, "margin_sq", None)
    return f"{d.margin:g}" if msq is None else f"{d.margin:g} TV (2m² = {msq:.2e})"


def identically_zero(values: Any) -> bool:
    """A floor that measured nothing: every finite value exactly 0.0 (bit-identical logits),
    or no finite value at all."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    return not len(x) or not bool(np.any(x != 0.0))


def select_floor(table: pd.DataFrame, setting: str) -> tuple[str, pd.DataFrame, str]:
    """The floor the decision reads: (kind, the table with that floor as ``floor_tv``, a note
    for the verdict line). ``setting`` a kind: that floor, noted when identically 0; ``auto``:
    the first of ``FLOOR_ORDER`` measured and not identically 0, the ones passed over named; if
    every measured floor is identically 0, the last measured, said so."""
    have = [k for k in FLOOR_ORDER if FLOOR_COLUMNS[k] in table.columns]
    kinds = have if setting == "auto" else [setting]
    zero = [k for k in kinds if k in have and identically_zero(table[FLOOR_COLUMNS[k]])]
    pick = next((k for k in kinds if k in have and k not in zero), None)
    if pick is None:
        pick = kinds[-1] if kinds else "batch"
        note = "identically 0: bit-identical, measures nothing"
        if setting == "auto" and len(zero) > 1:
            note = f"every floor measured identically 0 ({', '.join(zero)}): measures nothing"
    else:
        passed = [k for k in zero if FLOOR_ORDER.index(k) < FLOOR_ORDER.index(pick)]
        note = f"auto: {', '.join(passed)} identically 0, skipped" if passed else ""
    col = FLOOR_COLUMNS.get(pick, "floor_tv")
    out = table.drop(columns=[c for c in FLOOR_COLUMNS.values() if c in table.columns])
    out["floor_tv"] = table[col] if col in table.columns else np.nan
    return pick, out, note


@dataclass(frozen=True)
class DriftResult:
    """Claim (b) decided from the logits. TVs are per token; ``pooled`` is the mean over
    sequences of Σ_t TV_t (a bound on the TV of the whole sequence's law under a product
    coupling of positions), ``pooled_ucb`` its upper bound.

    Not a ``FamilyResult``: claim (b) is an equivalence decision (TOST on one-sided bootstrap-t
    bounds, three outcomes) at its own α, not a family of p-value tests sharing claim (a)'s α.
    """

    drift: float
    drift_ucb: float
    floor: float
    floor_ucb: float
    statistic: float  # D = drift − floor
    lcb: float
    ucb: float
    margin: float
    alpha: float
    decision: DriftDecision
    n_sequences: int
    n_floor: int
    n_tokens: int
    p99: float
    flips: float  # the fraction of tokens whose argmax differs
    pooled: float
    pooled_ucb: float
    floor_kind: str = "batch"
    floor_note: str = ""  # e.g. "auto: batch identically 0, skipped" (``select_floor``)

    @property
    def rejected(self) -> bool:
        """The claim fails: drift beyond the floor plus the margin (exit 1)."""
        return self.decision == "beyond"

    @property
    def line(self) -> str:
        """The verdict line of claim (b) (every output prints it)."""
        conf = f"{1 - self.alpha:.0%}"
        head = (
            f"numerics drift {self.drift:.4f} per token (≤ {self.drift_ucb:.4f} at {conf}), "
            f"floor ({self.floor_kind}{'; ' + self.floor_note if self.floor_note else ''}) "
            f"{self.floor:.4f} + margin {self.margin:g}: "
        )
        tail = (
            f"; D = drift − floor {self.statistic:+.4f} in [{self.lcb:+.4f}, {self.ucb:+.4f}]; "
            f"p99 {self.p99:.4f}, argmax flips {self.flips:.2%}, Σ_t TV_t {self.pooled:.3f} "
            f"(≤ {self.pooled_ucb:.3f}) over {self.n_sequences} sequences (claim b)"
        )
        return head + decision_words(self.decision, self.lcb, self.ucb, ".4f") + tail

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rejected": self.rejected, "line": self.line}


def to_resolve(d: DriftResult) -> tuple[float, float] | None:
    """The factors ``(k_drift, k_floor)`` by which the drift's and the floor's sequence counts
    would grow for an unresolved claim (b) to resolve, were D to stay at its estimate; None when
    the estimate sits on the margin or the bounds are not finite.

    Notes
    -----
    The bound's one-sided width w on the side that would decide (the UCB toward ``within`` below
    the margin, the LCB toward ``beyond`` above it) must fall to g = |margin − D|. Widths shrink
    as 1/√n; w² is split as c·(w_d² + w_f²) with the drift's and the floor's own widths (their
    bounds at α), c fitted to this run. The batch floor grows alone when that suffices (the drift
    grows too only as far as the floor's rows need: they are a subset of the drift's); when the
    drift's own width is already too wide, and for floors measured on every drift sequence
    (prefill, dtype), both grow by (w/g)². An estimate, stated as one.
    """
    stat, g = d.statistic, abs(d.margin - d.statistic)
    w = d.ucb - stat if stat <= d.margin else stat - d.lcb
    wd, wf = d.drift_ucb - d.drift, d.floor_ucb - d.floor
    if not all(math.isfinite(x) for x in (w, wd, wf)) or g <= 0 or wd**2 + wf**2 <= 0:
        return None
    both = (w / g) ** 2
    c = w**2 / (wd**2 + wf**2)
    if d.floor_kind == "batch" and g**2 > c * wd**2:
        kf = c * wf**2 / (g**2 - c * wd**2)
        return max(1.0, kf * d.n_floor / d.n_sequences), max(1.0, kf)
    return both, both


BOOTSTRAP_RESAMPLES = 4000
CHUNK = 1 << 22  # floats per resampling block


def bootstrap_t(
    strata: list[np.ndarray], alpha: float, rng: np.random.Generator, resamples: int
) -> tuple[float, float, float]:
    """Statistic Σ_s u_s over the strata, with its one-sided bootstrap-t bounds (LCB, UCB),
    each at level ``alpha``: resampling within each stratum (docs/numerics.md). A stratum of one
    term contributes no variance; se = 0 gives LCB = UCB = the statistic."""
    strata = [np.asarray(u, dtype=float) for u in strata if len(u)]
    stat = float(sum(u.sum() for u in strata))

    def var(x: np.ndarray) -> np.ndarray:  # n_k · Var_k(u) along the last axis
        n = x.shape[-1]
        return n * x.var(axis=-1, ddof=1) if n > 1 else np.zeros(x.shape[:-1])

    se = math.sqrt(float(sum(var(u) for u in strata)))
    if se == 0.0:
        return stat, stat, stat
    tot = np.zeros(resamples)
    v = np.zeros(resamples)
    for u in strata:
        step = max(1, CHUNK // len(u))  # resamples per block: memory ≤ CHUNK floats
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            x = u[rng.integers(0, len(u), size=(hi - lo, len(u)))]
            tot[lo:hi] += x.sum(-1)
            v[lo:hi] += var(x)
    return stat, *studentized_bounds(stat, se, tot, np.sqrt(v), alpha)


def studentized_bounds(
    stat: float, se: float, boot: np.ndarray, boot_se: np.ndarray, alpha: float
) -> tuple[float, float]:
    """One-sided bootstrap-t bounds (LCB, UCB), each at level ``alpha``, of ``stat`` (standard
    error ``se``) from its resampled values ``boot`` and their standard errors ``boot_se``;
    resamples with ``boot_se`` 0 are dropped, fewer than two left give infinite bounds."""
    ok = boot_se > 0
    t = (boot[ok] - stat) / boot_se[ok]
    if len(t) < 2:
        return -math.inf, math.inf
    hi, lo = np.quantile(t, [1 - alpha, alpha])
    return stat - float(hi) * se, stat - float(lo) * se


def _bounds(
    x: np.ndarray, alpha: float, rng: np.random.Generator, resamples: int
) -> tuple[float, float]:
    """Mean and one-sided bootstrap-t upper bound (level α) of i.i.d. terms ``x``."""
    n = len(x)
    if n < 2:
        return float(x.mean()), math.inf
    m, _, ucb = bootstrap_t([x / n], alpha, rng, resamples)
    return m, ucb


def split_lcb(
    d: np.ndarray, f: np.ndarray, alpha: float, rng: np.random.Generator, resamples: int
) -> float:
    """D's lower bound from its two parts, α split evenly (Bonferroni): the drift's one-sided
    bootstrap-t lower bound at α/2 minus the floor's upper bound at α/2, each from its own
    sequences (``d``, ``f``: per-sequence means, at least two each).

    Notes
    -----
    If LCB(drift) ≤ E drift and UCB(floor) ≥ E floor, their difference is ≤ E D; so it misses
    with probability at most α/2 + α/2 (the union bound), whatever the dependence between the
    parts, and the floor's skew is met by the floor's own bootstrap-t. The pairing of a
    sequence's drift and floor is not used: conservative when they are positively correlated.
    """
    _, lo_d, _ = bootstrap_t([d / len(d)], alpha / 2, rng, resamples)
    _, _, hi_f = bootstrap_t([f / len(f)], alpha / 2, rng, resamples)
    return lo_d - hi_f


def decide_drift(
    table: pd.DataFrame,
    *,
    margin: float,
    alpha: float,
    rng: np.random.Generator,
    floor_kind: str = "batch",
    resamples: int = BOOTSTRAP_RESAMPLES,
    floor_note: str = "",
) -> DriftResult | None:
    """Claim (b) from ``spectest.numerics.table``'s per-token table (``numerics.COLUMNS``); None
    when it has no measured token (nothing to claim). ``rng`` draws the bootstrap resamples.
    Fewer than two drift or floor sequences leave the bounds infinite: ``unresolved``. The UCB
    is the paired bootstrap-t bound; the LCB the lower of that bound and ``split_lcb``."""
    t = table[np.isfinite(table["tv"].to_numpy(dtype=float))]
    if not len(t):
        return None
    keys = list(SEQUENCE_KEYS)
    g = t.groupby(keys, sort=False)
    per = pd.DataFrame({"d": g["tv"].mean(), "pooled": g["tv"].sum()})
    fl = t[np.isfinite(t["floor_tv"].to_numpy(dtype=float))]
    per = per.join(fl.groupby(keys, sort=False)["floor_tv"].mean().rename("f"), how="outer")
    d = per["d"].dropna().to_numpy(dtype=float)
    f = per["f"].dropna().to_numpy(dtype=float)
    pooled = per["pooled"].dropna().to_numpy(dtype=float)
    drift, drift_ucb = _bounds(d, alpha, rng, resamples)
    pooled_m, pooled_ucb = _bounds(pooled, alpha, rng, resamples)
    floor, floor_ucb = _bounds(f, alpha, rng, resamples) if len(f) else (math.nan, math.inf)
    stat = drift - floor if len(f) else math.nan
    if len(d) >= 2 and len(f) >= 2:
        has_d, has_f = per["d"].notna().to_numpy(), per["f"].notna().to_numpy()
        u = per["d"].fillna(0.0).to_numpy() / len(d) - per["f"].fillna(0.0).to_numpy() / len(f)
        strata = [u[(has_d == a) & (has_f == b)] for a, b in ((1, 1), (1, 0), (0, 1))]
        stat, lcb, ucb = bootstrap_t(strata, alpha, rng, resamples)
        # drawn last, so the UCB and readouts keep their draws (docs/numerics.md "Calibration")
        lcb = min(lcb, split_lcb(d, f, alpha, rng, resamples))
    else:
        lcb, ucb = -math.inf, math.inf
    decision = tost(lcb, ucb, margin)
    return DriftResult(
        drift=drift,
        drift_ucb=drift_ucb,
        floor=floor,
        floor_ucb=floor_ucb,
        statistic=stat,
        lcb=lcb,
        ucb=ucb,
        margin=float(margin),
        alpha=float(alpha),
        decision=decision,
        n_sequences=len(d),
        n_floor=len(f),
        n_tokens=len(t),
        p99=float(np.quantile(t["tv"].to_numpy(dtype=float), 0.99)),
        flips=float(t["flip"].astype(bool).mean()),
        pooled=pooled_m,
        pooled_ucb=pooled_ucb,
        floor_kind=floor_kind,
        floor_note=floor_note,
    )
