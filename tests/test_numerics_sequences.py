"""How many sequences claim (b) measures in matched mode (``tests.numerics_sequences``,
``tests.numerics_floor_sequences``) and what an unresolved claim (b) says would resolve it
(``stats.drift.to_resolve``, the reason line). docs/numerics.md "How many sequences".

The settings' validation and YAML paths are tests/test_settings.py's. Everything here is
deterministic (fixed inputs, fixed seeds): exact checks, and one seeded check of the estimate.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from toy_protocol import TOY, write_toy

from spectest import schema
from spectest.decision.ladder import _narrowing
from spectest.generation import EngineSet, generate_shard, matched_drift, run_key
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol import load_protocol
from spectest.stats.drift import DriftResult, decide_drift, to_resolve

# session 20's Qwen3-8B run (results/LOG.md "lead (session 20)"): D +0.0012 in [-0.0027, +0.0036]
EIGHT_B = DriftResult(
    drift=0.03325, drift_ucb=0.03394, floor=0.03208, floor_ucb=0.03468, statistic=0.00118,
    lcb=-0.00266, ucb=0.00357, margin=0.002, alpha=0.05, decision="unresolved",
    n_sequences=768, n_floor=72, n_tokens=768 * 32, p99=0.29, flips=0.03, pooled=1.06,
    pooled_ucb=1.09,
)  # fmt: skip


def _width_after(d: DriftResult, kd: float, kf: float) -> float:
    """The deciding bound's width with the drift's and the floor's sequences grown by kd, kf
    (``to_resolve``'s model: w² = c·(w_d² + w_f²), each part shrinking as 1/√n)."""
    w = d.ucb - d.statistic if d.statistic <= d.margin else d.statistic - d.lcb
    wd, wf = d.drift_ucb - d.drift, d.floor_ucb - d.floor
    c = w**2 / (wd**2 + wf**2)
    return math.sqrt(c * (wd**2 / kd + wf**2 / kf))


def test_the_floor_grows_alone_when_that_suffices() -> None:
    """A floor-dominated interval: the floor alone grows, to exactly the width that resolves."""
    d = dataclasses.replace(EIGHT_B, statistic=0.0, ucb=0.0036, lcb=-0.0037)
    kd, kf = to_resolve(d)  # type: ignore[misc]
    assert kd == 1.0 and 1.0 < kf and kf * d.n_floor <= d.n_sequences
    assert _width_after(d, kd, kf) == pytest.approx(d.margin - d.statistic)


def test_the_drift_grows_as_far_as_the_floor_needs() -> None:
    """The 8B run: 18× the floor is more than the drift's 768 sequences hold, so the drift grows
    to hold them; the width then resolves (or better: the drift grew too)."""
    kd, kf = to_resolve(EIGHT_B)  # type: ignore[misc]
    assert kf == pytest.approx(17.99, abs=0.01) and kd == pytest.approx(kf * 72 / 768)
    assert _width_after(EIGHT_B, 1.0, kf) == pytest.approx(EIGHT_B.margin - EIGHT_B.statistic)
    assert _width_after(EIGHT_B, kd, kf) < EIGHT_B.margin - EIGHT_B.statistic


def test_both_grow_for_a_floor_on_every_sequence_or_a_wide_drift() -> None:
    """The prefill floor is measured on every drift sequence: both grow by (w/g)². So do both
    when the drift's own width is already wider than the gap. Above the margin the LCB side
    decides."""
    g = EIGHT_B.margin - EIGHT_B.statistic
    both = ((EIGHT_B.ucb - EIGHT_B.statistic) / g) ** 2
    prefill = dataclasses.replace(EIGHT_B, floor_kind="prefill", n_floor=768)
    assert to_resolve(prefill) == pytest.approx((both, both))
    wide = dataclasses.replace(EIGHT_B, drift_ucb=EIGHT_B.drift + 0.003)
    assert to_resolve(wide) == pytest.approx((both, both))
    above = dataclasses.replace(EIGHT_B, statistic=0.003, lcb=0.0005, ucb=0.006)
    k = ((0.003 - 0.0005) / 0.001) ** 2  # (w_lo / (D − margin))²
    kd, kf = to_resolve(above)  # type: ignore[misc]
    # the floor alone (within the drift's sequences) takes more floor than both grown together
    assert _width_after(above, kd, kf) == pytest.approx(0.001) and kd == 1.0 and kf > k


def test_nothing_to_estimate() -> None:
    """D exactly on the margin, or bounds that are not finite: no estimate."""
    assert to_resolve(dataclasses.replace(EIGHT_B, statistic=0.002)) is None
    assert to_resolve(dataclasses.replace(EIGHT_B, ucb=math.inf)) is None
    assert to_resolve(dataclasses.replace(EIGHT_B, floor_ucb=math.inf)) is None


def test_the_reason_line_names_the_settings_in_matched_mode_only() -> None:
    line = _narrowing(EIGHT_B, matched=True)
    assert "tests.numerics_floor_sequences about 1296 (72 now)" in line
    assert "tests.numerics_sequences about 1.7× its value (768 now)" in line
    assert "were D to stay at 0.0012" in line and '"How many sequences"' in line
    assert _narrowing(EIGHT_B, matched=False) == "more sequences narrow it"
    prefill = dataclasses.replace(EIGHT_B, floor_kind="prefill", n_floor=768)
    assert "numerics_floor_sequences" not in _narrowing(prefill, matched=True)


def _drift_table(n_drift: int, n_floor: int, shift: float, seed: int) -> pd.DataFrame:
    """Per-token TVs of ``n_drift`` sequences (8 positions), the first ``n_floor`` with a floor:
    E drift = E floor + ``shift``, both right-skewed, the floor's sequence means ~12× noisier
    (a per-sequence term of sd 0.006), as in the 8B run."""
    rng = np.random.default_rng(seed)
    d = 0.011 + shift + rng.gamma(2.0, 0.0005, size=(n_drift, 8)) - 0.001
    f = 0.011 + rng.gamma(1.0, 0.006, size=(n_drift, 1)) - 0.006 + np.zeros((n_drift, 8))
    f[n_floor:] = np.nan
    n = np.arange(n_drift)
    return pd.DataFrame({
        schema.PROMPT_ID: "p0", schema.CONFIG_ID: "a", schema.SEED: np.repeat(n, 8),
        schema.POSITION: np.tile(np.arange(8), n_drift),
        "tv": d.reshape(-1), "flip": False, "floor_tv": f.reshape(-1),
    })  # fmt: skip


def test_the_deciding_width_shrinks_as_one_over_root_n() -> None:
    """``to_resolve``'s model on seeded synthetic runs (floor-dominated, skewed like the 8B
    run's floor): over 12 seeds the mean deciding width (UCB − D) at 40 floor sequences is √15
    times the mean at 600, within 15 % (measured 3.93 against 3.87). Deterministic (fixed
    seeds); a single run's width is itself an estimate, so the model is checked on the mean."""
    widths: dict[int, list[float]] = {40: [], 600: []}
    for seed in range(12):
        for n in widths:
            table = _drift_table(800, n, 0.0005, 100 + seed)
            r = decide_drift(table, margin=0.002, alpha=0.05, rng=np.random.default_rng(seed),
                             resamples=1000)  # fmt: skip
            assert r is not None
            widths[n].append(r.ucb - r.statistic)
    ratio = float(np.mean(widths[40]) / np.mean(widths[600]))
    assert ratio == pytest.approx(math.sqrt(600 / 40), rel=0.15)


def test_growing_the_floor_as_asked_resolves_a_seeded_run() -> None:
    """One seeded synthetic run at 40 floor sequences is unresolved; with the floor grown as the
    reason line asks (fresh draws, the same laws) it is decided. Deterministic (fixed seeds)."""
    small = decide_drift(_drift_table(800, 40, 0.0008, 3), margin=0.002, alpha=0.05,
                         rng=np.random.default_rng(5))  # fmt: skip
    assert small is not None and small.decision == "unresolved"
    kd, kf = to_resolve(small)  # type: ignore[misc]
    assert kd == 1.0 and math.ceil(40 * kf) == 601
    big = decide_drift(_drift_table(800, 601, 0.0008, 2), margin=0.002, alpha=0.05,
                       rng=np.random.default_rng(5))  # fmt: skip
    assert big is not None and big.decision == "within"


def test_the_settings_reach_the_replay(tmp_path: Path) -> None:
    """A matched toy run's claim (b) table measures ``tests.numerics_sequences`` sequences per
    cell (the first seeds) and ``tests.numerics_floor_sequences`` floor sequences spread over the
    cells (at least 2 a cell), for the defaults and for stated values."""
    seen = {}
    for name, tests in (
        ("default", {}),
        ("set", {"numerics_sequences": 5, "numerics_floor_sequences": 12}),
    ):
        path = write_toy(
            tmp_path / name, tests={**TOY["tests"], "numerics": "matched", **tests},
            seeds={"per_arm": 40}, teeth={"null_arm": False, "epsilons": [], "mutants": []},
        )  # fmt: skip
        p = load_protocol(path)
        plan = make_plan(p)
        arm = plan.arm("matched")
        engines = EngineSet(p, [arm], plan)
        ids = prompt_token_ids(p, 16)
        parts = [
            generate_shard(p, arm, pid, i, engines, run_key(p), lambda n: None)
            for pid, i in ids.items()
        ]
        engines.close()
        samples = pd.concat([s for s, _ in parts], ignore_index=True)
        rounds = pd.concat([r for _, r in parts if r is not None], ignore_index=True)
        table = matched_drift(p, samples, rounds, engines.models, fast=False)
        per = table.groupby([schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED])
        seqs = per["tv"].size().groupby(level=[0, 1]).size()
        floors = per["floor_tv"].apply(lambda x: x.notna().all()).groupby(level=[0, 1]).sum()
        seen[name] = (set(seqs), set(floors), per.ngroups)
    assert seen["default"] == ({32}, {16}, 4 * 32)  # 64 over 4 cells: 16 a cell
    assert seen["set"] == ({5}, {3}, 4 * 5)  # 12 over 4 cells: 3 a cell


def test_token_claims_name_their_own_settings() -> None:
    """Beside a floor arm the sequences are the arms' seeds; teacher-forced, ``arms.floor``'s
    ``sequences``: the reason line names those, with no estimate."""
    from spectest.stats.teacher_forced import TeacherForcedResult
    from spectest.stats.token_floor import TokenFloorResult

    kw = dict(drift=1e-4, floor=5e-5, statistic=5e-5, lcb=-1e-5, ucb=2e-4, margin=0.01,
              margin_sq=2e-4, alpha=0.05, decision="unresolved", units=24, sequences=256,
              floor_sequences=256)  # fmt: skip
    token = _narrowing(TokenFloorResult(**kw), matched=False)  # type: ignore[arg-type]
    assert "seeds.per_arm" in token and "seeds.reference_per_arm" in token
    teacher = _narrowing(TeacherForcedResult(**kw), matched=False)  # type: ignore[arg-type]
    assert "arms.floor.sequences" in teacher
