"""Sequential testing: ``stage_sizes``, ``look_alphas``, ``decide_look`` → ``Look`` and
``path_dict``.

The why and the details: docs/internals.md "spectest/sequential.py".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spectest.errors import ConfigError

SPENDING = ("equal", "proportional")
# decisions after a look
REJECT = "reject"  # the candidate differs: stop
RESOLVED = "resolved"  # not rejected and the resolution asked for is reached: stop
BUDGET = "budget"  # not rejected, last stage, resolution not reached: stop (inconclusive)
CONTINUE = "continue"  # grow the sample to the next stage


def stage_sizes(per_arm: int, max_per_arm: int | None) -> tuple[int, ...]:
    """Seeds per arm after each stage: per_arm, 2·per_arm, 4·per_arm, ..., max_per_arm.

    The last stage is capped at ``max_per_arm`` (so it need not be a power of two times
    ``per_arm``). ``max_per_arm`` None (or equal to ``per_arm``) is a single stage.
    """
    for name, v in (("per_arm", per_arm), ("max_per_arm", max_per_arm)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"seeds.{name}: must be an integer >= 1, got {v!r}")
    if max_per_arm is None:
        return (per_arm,)
    if max_per_arm < per_arm:
        raise ConfigError(
            f"seeds.max_per_arm: must be >= per_arm ({per_arm!r}), got {max_per_arm!r}"
        )
    sizes = [per_arm]
    while sizes[-1] < max_per_arm:
        sizes.append(min(2 * sizes[-1], max_per_arm))
    return tuple(sizes)


def look_alphas(alpha: float, sizes: Sequence[int], spending: str = "equal") -> tuple[float, ...]:
    """The α of each look; they sum to ``alpha`` (docs/internals.md: the union bound).

    ``equal``: α/K at each of the K looks. ``proportional``: α·(n_k − n_{k−1})/n_K, the share of
    the seeds the stage adds (spends little early, when the sample is small and a real bug
    must be blatant to show).
    """
    if not (0.0 < alpha < 1.0):
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")
    if spending not in SPENDING:
        raise ConfigError(f"spending must be one of {list(SPENDING)!r}, got {spending!r}")
    if not sizes or any(b <= a for a, b in itertools.pairwise(sizes)):
        raise ConfigError(f"stage sizes must be increasing, got {list(sizes)!r}")
    K = len(sizes)
    if spending == "equal":
        return tuple(alpha / K for _ in sizes)
    prev = [0, *sizes[:-1]]
    return tuple(alpha * (n - p) / sizes[-1] for n, p in zip(sizes, prev, strict=True))


@dataclass(frozen=True)
class Look:
    """What one look saw and decided."""

    stage: int  # 0-based
    per_arm: int  # cumulative seeds per arm analysed at this look
    alpha: float  # the level this look tested at
    alpha_spent: float  # Σ of the levels of looks 0..stage
    rejected: bool  # the candidate's analysis rejected at ``alpha``
    mde_tv: float | None  # the resolution reached (TV; None if unknown)
    decision: str  # REJECT | RESOLVED | BUDGET | CONTINUE
    required_mde_tv: float | None = None  # the resolution the stop rule asked for (None: none)
    requirement: str = "none"  # where it comes from (``decision.claims.required_resolution``)
    claim_tv: float | None = None  # the power claim checked (``decision.claims.power_claim``)
    claim: str = ""  # where it comes from (``PowerClaim.where``)


def decide_look(
    stage: int,
    sizes: Sequence[int],
    alphas: Sequence[float],
    *,
    rejected: bool,
    mde_tv: float | None,
    max_mde_tv: float | None,
    requirement: str = "protocol",
    claim_tv: float | None = None,
    claim_source: str = "",
) -> Look:
    """The decision after look ``stage``: reject → stop; else the power claim meets the
    requirement (``max_mde_tv``) → stop; else the last stage → stop (budget spent); else
    continue. Without ``max_mde_tv`` a sampler that is never rejected runs to the last stage.

    ``max_mde_tv`` is the requirement the verdict applies (``decision.claims.
    required_resolution``: the protocol's ``tests.power.max_mde_tv``, else 0.15), ``requirement``
    where it comes from; ``claim_tv`` the power claim the verdict checks (``decision.claims.
    power_claim``: the MDE, or the weakest killed tooth's size, whichever is smaller; the MDE
    ``mde_tv`` when not given): the run stops "resolved" exactly when the verdict would accept
    the claim. A killed tooth's size does not grow with the seeds, so a run whose tooth already
    meets the requirement stops at its first look unless it rejects."""
    if not (0 <= stage < len(sizes)) or len(alphas) != len(sizes):
        raise ConfigError(f"look {stage!r}: outside the {len(sizes)} planned stages")
    if claim_tv is None and not claim_source:
        claim_tv = mde_tv
    resolved = (
        max_mde_tv is not None
        and claim_tv is not None
        and claim_tv == claim_tv
        and claim_tv <= max_mde_tv
    )
    if rejected:
        decision = REJECT
    elif resolved:
        decision = RESOLVED
    elif stage == len(sizes) - 1:
        decision = BUDGET
    else:
        decision = CONTINUE
    return Look(
        stage=stage,
        per_arm=int(sizes[stage]),
        alpha=float(alphas[stage]),
        alpha_spent=float(sum(alphas[: stage + 1])),
        rejected=bool(rejected),
        mde_tv=None if mde_tv is None or mde_tv != mde_tv else float(mde_tv),
        decision=decision,
        required_mde_tv=None if max_mde_tv is None else float(max_mde_tv),
        requirement=requirement if max_mde_tv is not None else "none",
        claim_tv=None if claim_tv is None or claim_tv != claim_tv else float(claim_tv),
        claim=claim_source,
    )


def path_dict(
    looks: Sequence[Look], sizes: Sequence[int], spending: str, alpha: float
) -> dict[str, Any]:
    """The path of the evidence, JSON-ready: the plan, every look, the seeds used."""
    return {
        "alpha": alpha,
        "spending": spending,
        "stages": list(sizes),
        "looks": [asdict(lk) for lk in looks],
        "seeds_used_per_arm": looks[-1].per_arm if looks else 0,
        "stopped": looks[-1].decision if looks else None,
    }
