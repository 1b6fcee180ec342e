"""Issue 21: matched numerics mode — the protocol field, the matched arm, the toy LM's simulated
numerics, the drift measurement (exact checks against the run's own recorded p) and the TOST
decision of claim (b) on exact inputs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from toy_protocol import TOY, write_toy

from spectest import schema
from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec, rounds_frame, samples_frame
from spectest.engines.builtin import speculative_decode
from spectest.errors import ConfigError
from spectest.models.zoo import load_model
from spectest.numerics.table import _verify_logits, drift_table
from spectest.plan import make_plan
from spectest.protocol import load_protocol, protocol_from_dict
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs
from spectest.shipped import list_shipped
from spectest.stats.drift import bootstrap_t, decide_drift

NUM_TARGET = "toy:V=16,order=2,scale=2.0,seed=3,numerics=0.02"


def _proto(tmp_path: Path, **tests: object) -> object:
    path = write_toy(tmp_path, tests={**TOY["tests"], **tests})  # type: ignore[dict-item]
    return load_protocol(path)


# ----------------------------------------------------------------------------- protocol, plan
def test_numerics_fields_hashed_only_when_set(tmp_path: Path) -> None:
    base = _proto(tmp_path / "a")
    auto = _proto(tmp_path / "b", numerics="auto", numerics_floor="auto", numerics_margin=0.002)
    assert base.hash == auto.hash  # type: ignore[attr-defined]
    assert "numerics" not in base.tests.canonical()  # type: ignore[attr-defined]
    matched = _proto(tmp_path / "c", numerics="matched")
    assert matched.hash != base.hash  # type: ignore[attr-defined]
    assert matched.tests.canonical()["numerics"] == "matched"  # type: ignore[attr-defined]
    margin = _proto(tmp_path / "d", numerics_margin=0.003)
    assert margin.hash != base.hash  # type: ignore[attr-defined]


def test_shipped_protocols_resolve_exact_in_float32() -> None:
    shipped = list_shipped()
    assert shipped
    for s in shipped:
        p = load_protocol(s.file)
        if p.models.dtype == "float32":
            assert p.numerics_mode == "exact", s.name
            assert all(a.role != "matched" for a in make_plan(p).arms), s.name


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("fuzzy", "tests.numerics"),
        ("alone", "tests.numerics_floor"),
        (-0.1, "tests.numerics_margin"),
    ],
)
def test_numerics_bad_values_name_the_field(tmp_path: Path, value: object, field: str) -> None:
    key = field.split(".")[1]
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _proto(tmp_path, **{key: value})


def test_auto_is_matched_for_bf16_and_exact_otherwise(tmp_path: Path) -> None:
    path = write_toy(tmp_path, models={**TOY["models"], "dtype": "bfloat16"})  # type: ignore[dict-item]
    assert load_protocol(path).numerics_mode == "matched"
    assert _proto(tmp_path / "f").numerics_mode == "exact"  # type: ignore[attr-defined]


def test_matched_refused_for_an_engine_that_cannot_host_it(tmp_path: Path) -> None:
    write_toy(tmp_path)
    raw = {
        **TOY,
        "version": 2,
        "tests": {**TOY["tests"], "numerics": "matched"},  # type: ignore[dict-item]
        "engines": {"candidate": {"name": "command", "command": ["true"]}},
    }
    with pytest.raises(ConfigError, match=r"tests\.numerics: 'matched' needs"):
        protocol_from_dict(raw, source="x", base_dir=tmp_path)


def test_matched_arm_last_disjoint_and_the_reference_of_every_other(tmp_path: Path) -> None:
    exact = make_plan(_proto(tmp_path / "e"))  # type: ignore[arg-type]
    plan = make_plan(_proto(tmp_path / "m", numerics="matched"))  # type: ignore[arg-type]
    assert plan.matched and not exact.matched
    assert plan.arms[-1].name == "matched" and plan.arms[-1].variant == "exact"
    assert plan.arms[-1].engine.name == "builtin"
    # every earlier arm keeps its seeds; the matched arm's are new and disjoint
    assert [(a.name, a.seeds) for a in plan.arms[:-1]] == [(a.name, a.seeds) for a in exact.arms]
    assert all(not plan.arms[-1].seeds.overlaps(a.seeds) for a in plan.arms[:-1])
    assert len(plan.arms[-1].seeds) == len(plan.arm("reference").seeds)
    assert [a.name for a in plan.comparisons] == [a.name for a in exact.comparisons]
    for a in plan.comparisons:
        assert plan.reference_for(a) == "matched"
        assert exact.reference_for(a) == "reference"
    assert plan.reference_for("matched") == "reference"
    teeth = make_plan(_proto(tmp_path / "t", numerics="matched"), teeth_only=True)  # type: ignore[arg-type]
    assert teeth.matched  # the teeth are judged against the matched arm too


# ----------------------------------------------------------------------------- the toy's numerics
def test_toy_numerics_depend_on_the_forward_shape_only() -> None:
    m = load_model(NUM_TARGET)
    plain = load_model("toy:V=16,order=2,scale=2.0,seed=3")
    x = torch.tensor([[1, 2, 3, 4]] * 3)

    def steps(model, B):  # one position per forward
        c = model.new_cache(B)
        return torch.cat([model.forward(c, x[:B, i : i + 1]) for i in range(4)], 1)

    wide = m.forward(m.new_cache(3), x)
    assert not torch.equal(wide, steps(m, 3))  # verify schedule ≠ decode
    assert not torch.equal(steps(m, 3)[:1], steps(m, 1))  # batch 3 ≠ alone
    assert torch.equal(steps(m, 3), steps(m, 3))  # deterministic
    assert torch.equal(plain.forward(plain.new_cache(3), x), steps(plain, 3))  # σ = 0: exact
    gap = (wide - plain.forward(plain.new_cache(3), x)).abs().max().item()
    assert 0 < gap <= 0.02 * math.sqrt(3) + 1e-6  # |σ z| ≤ σ √3


# ----------------------------------------------------------------------------- the measurement
def _spec(target, rows, T=6, K=3, batch=None):
    draft = load_model("toy:V=16,order=2,scale=1.0,seed=4")
    req = DecodeRequest(
        [1, 2, 3],
        rows,
        num_positions=T,
        run_key=7,
        prompt_id="p0",
        batch_size=batch or len(rows),
        whitebox=True,
    )
    out = speculative_decode(
        target, draft, req, drafter=DrafterSpec(onehot=True, k=K), variant=get_variant("exact")
    )
    return (
        samples_frame(np.asarray(out.tokens), "p0", rows, "matched", out.whitebox),
        rounds_frame(out.rounds, "p0", rows, "matched"),
    )


def test_replayed_verify_laws_are_the_runs_own() -> None:
    """Exact: at every emitted position the replayed verify law gives the emitted token the very
    probability the run recorded (white-box ``wb_p``), so the replay is the run's schedule."""
    target = load_model(NUM_TARGET)
    sp = SamplingParams(temperature=0.9, top_p=0.95)
    rows = [RowSpec("a", s, sp) for s in range(24)]
    samples, rounds = _spec(target, rows, batch=8)
    tokens = samples.pivot(index=schema.SEED, columns=schema.POSITION, values=schema.TOKEN_ID)
    toks = torch.tensor(tokens.to_numpy(), dtype=torch.int64)
    commits = [
        (g.sort_values("round")["accepted"].to_numpy() + 1).tolist()
        for _, g in rounds.groupby(schema.SEED, sort=True)
    ]
    wb = samples.pivot(index=schema.SEED, columns=schema.POSITION, values=schema.WB_P).to_numpy()
    for lo in range(0, 24, 8):  # the run's batches
        keep = torch.arange(8)
        logits = _verify_logits(
            target, torch.tensor([1, 2, 3]), toks[lo : lo + 8], commits[lo : lo + 8], 3, keep
        )
        p = logits_to_probs(logits, SamplingTensors.from_params([sp] * 8))
        got = p.gather(2, toks[lo : lo + 8, :, None])[..., 0].numpy()
        np.testing.assert_array_equal(got, wb[lo : lo + 8])


def test_drift_is_zero_without_numerics_and_positive_with() -> None:
    sp = SamplingParams(temperature=0.8)
    rows = [RowSpec("a", s, sp) for s in range(16)]
    cfg = [("a", sp)]
    for spec, positive in (("toy:V=16,order=2,scale=2.0,seed=3", False), (NUM_TARGET, True)):
        target = load_model(spec)
        s, r = _spec(target, rows)
        t = drift_table(
            target, s, r, {"p0": [1, 2, 3]}, cfg, arm="matched", K=3, batch_size=16,
            positions=6, rows_per_cell=16, floor_rows_per_cell=4,
        )  # fmt: skip
        assert len(t) == 16 * 6 and t["floor_tv"].notna().sum() == 4 * 6
        assert (t["tv"].to_numpy() > 0).any() == positive
        assert (t["floor_tv"].dropna().to_numpy() > 0).any() == positive
        if not positive:
            assert (t["tv"] == 0).all() and not t["flip"].any()


@pytest.mark.parametrize("elements", [1, 7 * 6 * 40, 2**27])
def test_the_laws_many_rows_at_once_equal_one_position_at_a_time(elements: int) -> None:
    """``_tvs`` (whole rows' positions per call, ``TV_ELEMENTS`` at a time: one row, some rows
    with a ragged last call, all) equals the call per position it replaced, bit for bit, under
    both pipelines, with mixed parameters: it moves rows between calls, never changes a law."""
    from spectest.numerics import table
    from spectest.sampling.pipeline import FAST, REFERENCE

    g = torch.Generator().manual_seed(5)
    M, T, V = 7, 6, 40
    a = torch.randn(M, T, V, generator=g) * 3
    b = a + torch.randn(M, T, V, generator=g) * 0.05
    b[2, 3] = a[2, 3].flip(-1)  # a flip
    params = [
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.6, min_p=0.1),
    ] * 3
    params = params[:M]
    for probs in (REFERENCE.probs, FAST.probs):
        want_tv, want_flip = np.zeros((M, T)), np.zeros((M, T), dtype=bool)
        st = SamplingTensors.from_params(params)
        for t in range(T):
            want_tv[:, t] = table._tv(a[:, t], b[:, t], st, probs).numpy()
            want_flip[:, t] = table._flip(a[:, t], b[:, t]).numpy()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(table, "TV_ELEMENTS", elements)
            tv, flip = table._tvs(a, b, params, probs)
        assert np.array_equal(tv, want_tv) and np.array_equal(flip, want_flip)
        assert want_flip[2, 3] and (want_tv > 0).sum() > M * T // 2  # not vacuous


# ----------------------------------------------------------------------------- the decision
def _table(d: list[list[float]], f: list[list[float]]) -> pd.DataFrame:
    """Sequences ``d`` (per-token TVs); the first ``len(f)`` also have floor TVs ``f``."""
    rows = []
    for s, tvs in enumerate(d):
        for t, tv in enumerate(tvs):
            fl = f[s][t] if s < len(f) else math.nan
            rows.append(("p0", "a", s, t, tv, tv > 0.5, fl))
    return pd.DataFrame(rows, columns=["prompt_id", "config_id", "seed", "position", "tv",
                                       "flip", "floor_tv"])  # fmt: skip


def _bootstrap_t_slow(strata, alpha, rng, resamples):
    """The reference: one resample at a time, plain Python sums and variances (same draws)."""
    import statistics

    strata = [list(map(float, u)) for u in strata if len(u)]
    stat = sum(sum(u) for u in strata)
    se = math.sqrt(sum(len(u) * statistics.variance(u) for u in strata if len(u) > 1))
    draws = [rng.integers(0, len(u), size=(resamples, len(u))) for u in strata]
    ts = []
    for b in range(resamples):
        xs = [[u[i] for i in idx[b]] for u, idx in zip(strata, draws, strict=True)]
        tot = sum(sum(x) for x in xs)
        v = sum(len(x) * statistics.variance(x) for x in xs if len(x) > 1)
        if v > 0:
            ts.append((tot - stat) / math.sqrt(v))
    hi, lo = np.quantile(np.array(ts), [1 - alpha, alpha])
    return stat, stat - hi * se, stat - lo * se


def test_bootstrap_t_matches_the_slow_reference() -> None:
    """Two strata of fixed inputs, the same seeded draws: the fast path equals the reference."""
    a = np.array([0.004, 0.001, 0.009, 0.002, 0.003, 0.030])  # right-skewed, like TV
    b = np.array([-0.002, -0.001, -0.004, -0.0015])
    fast = bootstrap_t([a, b], 0.05, np.random.default_rng(7), 300)
    slow = _bootstrap_t_slow([a, b], 0.05, np.random.default_rng(7), 300)
    assert fast == pytest.approx(slow, rel=1e-12, abs=1e-15)
    stat, lcb, ucb = fast
    assert stat == pytest.approx(a.sum() + b.sum()) and lcb < stat < ucb
    # skew: the long right tail of ``a`` makes the bounds asymmetric, the upper one further out
    # (a symmetric t interval would miss above more often than α)
    assert ucb - stat > 2 * (stat - lcb)


def test_bootstrap_t_without_variance_is_the_statistic() -> None:
    assert bootstrap_t([np.array([0.25, 0.25]), np.array([1.0])], 0.05,
                       np.random.default_rng(0), 100) == (1.5, 1.5, 1.5)  # fmt: skip


def test_drift_statistic_and_bounds_by_hand() -> None:
    d = [[0.001, 0.003], [0.002, 0.004], [0.006, 0.002], [0.001, 0.001]]
    f = [[0.002, 0.002], [0.001, 0.003], [0.003, 0.001]]
    r = decide_drift(_table(d, f), margin=0.002, alpha=0.05, rng=np.random.default_rng(1))
    assert r is not None
    dm = np.array([0.002, 0.003, 0.004, 0.001])
    fm = np.array([0.002, 0.002, 0.002])
    assert r.drift == pytest.approx(dm.mean()) and r.floor == pytest.approx(fm.mean())
    assert r.statistic == pytest.approx(dm.mean() - fm.mean())
    assert r.lcb < r.statistic < r.ucb and r.drift_ucb > r.drift and r.floor_ucb == r.floor
    assert r.pooled == pytest.approx((2 * dm).mean()) and r.pooled_ucb > r.pooled
    assert r.n_sequences == 4 and r.n_floor == 3 and r.n_tokens == 8
    assert r.decision == ("within" if r.ucb <= 0.002 else "unresolved")
    assert "claim b" in r.line and f"{r.drift:.4f}" in r.line


def test_drift_bounds_use_the_pairing_exactly() -> None:
    """Every floor sequence is a drift sequence shifted by exactly 0.25 (binary-exact values):
    D's variance with the pairing is 0, so the paired UCB is D = 0.25 (Welch's unpaired
    variance would not be): within at margin 0.25. The LCB is the lower of the paired bound
    (0.25) and the split one (``split_lcb``, no pairing, issue 31 item 4), so just below the
    margin it is not beyond: with 4 sequences the split bound is far below."""
    d = [[0.5], [0.75], [1.0], [0.625]]
    f = [[0.25], [0.5], [0.75], [0.375]]
    for margin, decision in ((0.25, "within"), (0.2499, "unresolved")):
        r = decide_drift(_table(d, f), margin=margin, alpha=0.05, rng=np.random.default_rng(0))
        assert r is not None and (r.statistic, r.ucb) == (0.25, 0.25) and r.lcb < 0.0
        assert r.decision == decision


@pytest.mark.parametrize(
    ("shift", "decision"), [(0.0, "within"), (0.01, "beyond"), (0.002, "unresolved")]
)
def test_tost_decisions(shift: float, decision: str) -> None:
    """D = shift exactly (the floor's sequences are the drift's, shifted, plus a jitter of mean
    exactly 0, so se > 0): D = 0 is within the margin 0.002, D = 0.01 beyond it, D = the margin
    itself neither (both one-sided bounds straddle it)."""
    rng = np.random.default_rng(0)  # fixed inputs; the decision is a function of them
    base = rng.uniform(0.002, 0.004, size=(200, 4))
    jit = rng.normal(0.0, 1e-4, size=(200, 4))
    jit -= jit.mean()
    r = decide_drift(_table((base + shift + jit).tolist(), base.tolist()), margin=0.002,
                     alpha=0.05, rng=np.random.default_rng(1))  # fmt: skip
    assert r is not None and r.statistic == pytest.approx(shift, abs=1e-15)
    assert r.decision == decision
    assert r.rejected == (decision == "beyond")


def test_too_few_floor_sequences_is_unresolved_and_empty_is_none() -> None:
    rng = np.random.default_rng(0)
    r = decide_drift(_table([[0.0], [0.0], [0.0]], [[0.0]]), margin=0.002, alpha=0.05, rng=rng)
    assert r is not None and r.decision == "unresolved" and math.isinf(r.ucb)
    empty = _table([], [])
    assert decide_drift(empty, margin=0.002, alpha=0.05, rng=rng) is None


# ----------------------------------------------------------------------------- calibration
def test_small_calibration_of_matched_mode() -> None:
    """The small version of benchmarks/drift_calibration.py (the 200-replication run is in
    results/LOG.md): 20 null replications under simulated numerics. A family false alarm has
    probability ≤ α = 0.05 each, so ≥ 5 of 20 has probability ≤ 0.0026 (binomial): the
    test's false-failure rate. No replication may end "beyond" (the true D ≈ 0 < margin)."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "drift_calibration.py"
    out = subprocess.run(
        [sys.executable, str(script), "--reps", "20", "--seeds", "100", "--measured", "32",
         "--floor-rows", "16", "--permutations", "50"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    summary = json.loads(out.stdout.splitlines()[-1].removeprefix("SUMMARY "))
    assert summary["reps"] == 20
    assert summary["null_rejected"] <= 4, summary
    assert summary["drift_beyond"] == 0, summary
    assert summary["drift_mean"] > 0 and summary["floor_mean"] > 0
