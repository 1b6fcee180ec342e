"""Audit an engine by the probabilities it reports: run it, teacher-force, decide.

Owns ``collect`` (one job's reported claims, ``ArmOutput.reported``, beside spectest's
teacher-forced p of the same tokens) and ``audit`` (that job through
``stats.reported_p.reported_family``). Knows nothing about protocol files, run directories or
``spectest run``'s verdict. What real servers report, and the cross-check's assumption (the
engine was given the protocol's target model): docs/engines-reported-p.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectest import schema
from spectest.engines.base import PLACEHOLDER_TOKEN_ID, ArmJob, DrafterSpec, Engine, RowSpec
from spectest.errors import EngineError
from spectest.models.base import LanguageModel
from spectest.sampling.params import SamplingParams
from spectest.stats import reported_p


@dataclass(frozen=True)
class Collected:
    """One job's emitted tokens (flattened over rows and positions, ended positions dropped):
    the engine's reported ``p`` / ``cdf_lo`` and the teacher's ``p_teacher`` / ``lo_teacher``,
    all [n]; ``rounds`` the engine's round readout rows (0 when it gave none)."""

    p: np.ndarray
    cdf_lo: np.ndarray
    p_teacher: np.ndarray
    lo_teacher: np.ndarray
    rounds: int


def collect(
    engine: Engine,
    target: LanguageModel,
    prompt: Sequence[int],
    configs: Sequence[tuple[str, SamplingParams]],
    seeds: Sequence[int],
    positions: int,
    *,
    run_key: int = 0,
    drafter: DrafterSpec | None = None,
) -> Collected:
    """Run one job (every config × seed) on ``engine`` and teacher-force its tokens.
    ``EngineError`` (exit 2) when the engine reported no probabilities."""
    from spectest.engines.teacher import teacher_force

    rows = tuple(RowSpec(cid, int(s), sp) for cid, sp in configs for s in seeds)
    job = ArmJob(
        arm="candidate",
        role="candidate",
        variant=None,
        prompt_id="p0",
        prompt_ids=tuple(int(t) for t in prompt),
        rows=rows,
        num_positions=positions,
        run_key=run_key,
        batch_size=len(rows),
        drafter=drafter or DrafterSpec(onehot=False),
    )
    out = engine.generate(job)
    if out.reported is None:
        raise EngineError(
            f"engine {engine.name}: reported no probabilities (the result lines' 'probs'); "
            "nothing to audit"
        )
    live = out.tokens != PLACEHOLDER_TOKEN_ID  # [B, T]
    forced = np.where(live, out.tokens, 0).astype(np.int64)  # causal: the filler is never seen
    wb = teacher_force(target, job.prompt_ids, [r.params for r in rows], forced)
    mask = live.reshape(-1)
    rep = out.reported.reshape(-1, 2)[mask]  # [n, 2]
    if np.isnan(rep[:, 0]).any():
        raise EngineError(f"engine {engine.name}: a token without its reported p")
    return Collected(
        p=rep[:, 0],
        cdf_lo=rep[:, 1],
        p_teacher=wb[schema.WB_P].to_numpy()[mask],
        lo_teacher=wb[schema.WB_CDF_LO].to_numpy()[mask],
        rounds=0 if out.rounds is None else len(out.rounds),
    )


def audit(
    collected: Collected,
    rng: np.random.Generator,
    *,
    alpha: float = reported_p.DEFAULT_ALPHA,
    tol: float = reported_p.DEFAULT_TOL,
    max_fraction: float = reported_p.DEFAULT_MAX_FRACTION,
    teacher: bool = True,
) -> reported_p.ReportedResult:
    """The reported-p family of ``collected`` (``teacher=False``: without the cross-check, what
    an engine on a model spectest cannot run gets)."""
    c = collected
    return reported_p.reported_family(
        c.p,
        c.cdf_lo,
        rng,
        teacher=(c.p_teacher, c.lo_teacher) if teacher else None,
        alpha=alpha,
        tol=tol,
        max_fraction=max_fraction,
    )


__all__ = ["Collected", "audit", "collect"]
