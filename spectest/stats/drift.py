"""The numerics-drift decision (issue 21, claim (b)): drift − floor against a stated margin,
TOST style, from the per-token table ``spectest.numerics`` measures (numpy/scipy only).

Owns: ``DriftResult`` (the drift per token with its bound, the floor with its bound, the
statistic D = drift − floor with both bounds, the decision ``within`` / ``beyond`` /
``unresolved``, the readouts p99, argmax flips and the pooled sequence bound Σ_t TV_t, and the
one line every verdict output prints) and ``decide_drift``.

Notes
-----
The unit is the sequence: ``d_s`` = mean over the positions of sequence s of TV_t(verify,
decode), ``f_s`` = the same between decode in the run's batch and decode alone, for the floor's
sequences. Sequences are independent (disjoint seeds, each TV a deterministic function of its
own sequence), so the means of ``d_s`` and ``f_s`` are averages of i.i.d. terms and D = mean(d)
− mean(f) has the Welch standard error sqrt(s_d²/n_d + s_f²/n_f); the floor's sequences are a
subset of the drift's; ignoring their covariance overstates the variance when it is positive (it
then only widens the bounds). The bounds are one-sided Student-t at level α each with Welch's
degrees of freedom (a CLT statement: TV per token is skewed, p99 ≈ 25× the mean in issue 21, so
the level is approximate below a few dozen sequences; ``benchmarks/drift_calibration.py``
measures it: at 64 / 32 sequences the upper bound missed in 3 % and the lower bound in 8 % of
200 replications, results/LOG.md — the "beyond" side is the approximate one). Decision (two
one-sided tests, the pre-declared statistic D and margin m): ``within`` when UCB(D) ≤ m (D ≤ m
shown at level α), ``beyond`` when LCB(D) > m (D > m shown at level α), else ``unresolved``,
with the resolution reached (the bound's half-width). Each is a level-α test (asymptotically),
so a verdict's false-fail rate is ≤ α when D ≤ m and its false-pass rate ≤ α when D > m, up to
the skew noted above.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats as sps

DriftDecision = Literal["within", "beyond", "unresolved"]
SEQUENCE_KEYS = ("prompt_id", "config_id", "seed")


@dataclass(frozen=True)
class DriftResult:
    """Claim (b) decided: see the module docstring. TVs are per token; ``pooled`` is the mean
    over sequences of Σ_t TV_t (a bound on the TV of the whole sequence's law under a product
    coupling of positions), ``pooled_ucb`` its upper bound."""

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
            f"floor ({self.floor_kind}) {self.floor:.4f} + margin {self.margin:g}: "
        )
        tail = (
            f"; D = drift − floor {self.statistic:+.4f} in [{self.lcb:+.4f}, {self.ucb:+.4f}]; "
            f"p99 {self.p99:.4f}, argmax flips {self.flips:.2%}, Σ_t TV_t {self.pooled:.3f} "
            f"(≤ {self.pooled_ucb:.3f}) over {self.n_sequences} sequences (claim b)"
        )
        what = {
            "within": "within numerics",
            "beyond": "drift beyond numerics",
            "unresolved": f"unresolved at resolution ±{(self.ucb - self.lcb) / 2:.4f}",
        }[self.decision]
        return head + what + tail

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rejected": self.rejected, "line": self.line}


def _bounds(x: np.ndarray, alpha: float) -> tuple[float, float]:
    """Mean and one-sided upper bound (Student t, level α) of i.i.d. terms ``x``."""
    n = len(x)
    m = float(x.mean())
    if n < 2:
        return m, math.inf
    return m, m + float(sps.t.ppf(1 - alpha, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)


def decide_drift(
    table: pd.DataFrame, *, margin: float, alpha: float, floor_kind: str = "batch"
) -> DriftResult | None:
    """Claim (b) from ``spectest.numerics``'s per-token table (``numerics.COLUMNS``); None
    when it has no measured token (nothing to claim). Fewer than two floor sequences leave the
    bounds infinite: ``unresolved``."""
    t = table[np.isfinite(table["tv"].to_numpy(dtype=float))]
    if not len(t):
        return None
    g = t.groupby(list(SEQUENCE_KEYS), sort=False)
    d = g["tv"].mean().to_numpy(dtype=float)
    pooled = g["tv"].sum().to_numpy(dtype=float)
    fl = t[np.isfinite(t["floor_tv"].to_numpy(dtype=float))]
    f = fl.groupby(list(SEQUENCE_KEYS), sort=False)["floor_tv"].mean().to_numpy(dtype=float)
    drift, drift_ucb = _bounds(d, alpha)
    pooled_m, pooled_ucb = _bounds(pooled, alpha)
    floor, floor_ucb = _bounds(f, alpha) if len(f) else (math.nan, math.inf)
    stat = drift - floor if len(f) else math.nan
    if len(d) >= 2 and len(f) >= 2:
        vd, vf = float(d.var(ddof=1)) / len(d), float(f.var(ddof=1)) / len(f)
        se = math.sqrt(vd + vf)
        den = (vd**2 / (len(d) - 1) + vf**2 / (len(f) - 1)) if se > 0 else 0.0
        df = (se**4 / den) if den > 0 else float(len(d) + len(f) - 2)
        q = float(sps.t.ppf(1 - alpha, df))
        lcb, ucb = stat - q * se, stat + q * se
    else:
        lcb, ucb = -math.inf, math.inf
    decision: DriftDecision = (
        "within" if ucb <= margin else "beyond" if lcb > margin else "unresolved"
    )
    return DriftResult(
        drift=drift, drift_ucb=drift_ucb, floor=floor, floor_ucb=floor_ucb, statistic=stat,
        lcb=lcb, ucb=ucb, margin=float(margin), alpha=float(alpha), decision=decision,
        n_sequences=len(d), n_floor=len(f), n_tokens=len(t),
        p99=float(np.quantile(t["tv"].to_numpy(dtype=float), 0.99)),
        flips=float(t["flip"].astype(bool).mean()), pooled=pooled_m, pooled_ucb=pooled_ucb,
        floor_kind=floor_kind,
    )  # fmt: skip
