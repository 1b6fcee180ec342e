"""Claim (b) teacher-forced from top-n lists (issue 31; ``stats.teacher_forced`` coarsened
mode, ``engines.plain_laws._top_n``): U1 with an "other" bin against its dense definition; a
list that covers the support (the fake server's ``--probs cut`` asked for 8 ≥ its 8 kept ids)
gives the same law table and the same U1 as the whole vocabulary; on a synthetic engine whose
lists miss mass, a correct candidate is not "beyond" and one that moves mass outside the lists
is; "within" is reachable only when the outside mass is below the margin; lists that are not
laws are refused (exit 2).

False-failure rates: deterministic (fixed seeds). Over seeds (benchmarks/
teacher_forced_top_n_calibration.py, 200 replications at n 400): the correct candidate is
"beyond" 2.0 % [0.5, 5.0 %] of the time with lists of 4 of 10 ids, and "within" 96.5 % with 9
of 10 and m 0.1 (n 3000 here: more); the mass-moving candidate has U1 ≈ 4e-2 against
2m² = 2e-4 (≥ 50 sd).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from spectest import schema
from spectest.engines.base import Models
from spectest.engines.http import HTTPEngine
from spectest.engines.plain_laws import LawAsker, _top_n
from spectest.engines.replies import Violation
from spectest.engines.server_raw_law import processed_from_list, processed_law
from spectest.errors import EngineError, ExitCode, InputError
from spectest.sampling.params import SamplingParams
from spectest.stats.teacher_forced import (
    LAWS,
    _u1,
    _unit,
    decide_teacher_forced,
    law_dict,
    prefix_key,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fake_completion_server import CUT, LAW  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from teacher_forced_top_n_calibration import engine as _engine  # noqa: E402
from test_teacher_forced import _brute  # noqa: E402  (the dense U1, with the "other" bin)


def test_coarsened_u1_is_its_definition() -> None:
    df, table = _engine(3, 4, 9, 0.2)
    laws, mass, _ = law_dict(table)
    X = df.pivot(index=schema.SEED, columns=schema.POSITION, values=schema.TOKEN_ID).to_numpy()
    rng = np.random.default_rng(4)
    assert mass < 0.99
    for t in range(2):
        u = _unit(X, t, laws, ("p", "c"))
        assert u is not None and u.P.shape[1] == 4 + 1  # the 4 listed ids and "other"
        for w in (np.ones(9), rng.integers(0, 3, size=9).astype(float)):
            got, _ = _u1(u, w[None, :])
            assert got[0] == pytest.approx(_brute(X, t, laws, w), rel=1e-10, abs=1e-12)


def _decide(df: pd.DataFrame, table: pd.DataFrame, margin: float) -> object:
    rng = np.random.default_rng(0)
    return decide_teacher_forced(df, table, margin=margin, alpha=0.05, rng=rng, resamples=400)


def test_coarsened_mode_keeps_beyond_and_states_the_outside_mass() -> None:
    good = _decide(*_engine(1, 4, 600, 0.0), margin=0.01)
    bad = _decide(*_engine(1, 4, 600, 0.15), margin=0.01)
    assert good.coarsened and good.outside_max > 0.01
    assert good.decision == "unresolved" and bad.decision == "beyond"
    assert "within is out of reach: outside max" in good.line and "mean" in good.line
    assert bad.lcb > 2 * 0.01**2


def test_within_is_reachable_when_the_outside_mass_is_below_the_margin() -> None:
    df, table = _engine(2, 9, 3000, 0.0)  # the 10th id: outside, of small mass
    r = _decide(df, table, margin=0.1)
    assert r.coarsened and r.outside_max < 0.05
    assert r.decision == "within" and r.ucb <= (0.1 - r.outside_max) ** 2
    assert "within needs UCB <= (m - outside max)^2" in r.line


def _asker(tmp_path: Path, probs: int) -> LawAsker:
    argv = ["{python}", str(ROOT / "tests" / "fake_completion_server.py"), "--port", "{port}"]
    raw = {"api": "openai", "model": "tiny", "server": [*argv, "--probs", "cut"], "probs": probs}
    choice = SimpleNamespace(name="http", options=HTTPEngine.parse_options(raw, "t"))
    return LawAsker(choice, Models(SimpleNamespace(vocab_size=16), None))


def test_a_list_covering_the_support_is_the_whole_law(tmp_path: Path) -> None:
    """``--probs cut`` keeps 8 ids: asked for 8 (a top-n list) or 16 (the vocabulary), the same
    law at every prefix and the same U1 on one candidate."""
    tokens = np.array([[1, 2, 3], [1, 4, 0], [5, 6, 7], [1, 2, 6]])
    sp = SamplingParams(temperature=0.8, top_k=8)
    got = {}
    for n in (8, 16):
        asker = _asker(tmp_path, n)
        try:
            got[n] = asker.laws([1, 2, 3], sp, tokens)
        finally:
            asker.close()
    assert got[8].keys() == got[16].keys()
    for h, (ids, p) in got[8].items():
        assert ids.tolist() == got[16][h][0].tolist() == list(range(8))
        np.testing.assert_allclose(p, CUT[:8], rtol=0, atol=1e-12)
    cols = [schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED, schema.POSITION, schema.TOKEN_ID]
    df = pd.DataFrame(
        [("p", "c", s, t, int(tokens[s, t])) for s in range(4) for t in range(3)], columns=cols
    )
    res = []
    for n in (8, 16):
        rows = [("p", "c", len(h), prefix_key(np.array(h)), *law) for h, law in got[n].items()]
        res.append(_decide(df, pd.DataFrame(rows, columns=list(LAWS)), margin=0.01))
    assert not res[0].coarsened and res[0].statistic == pytest.approx(res[1].statistic, abs=1e-12)
    assert res[0].decision == res[1].decision


def test_lists_that_are_not_laws_are_refused_with_exit_2() -> None:
    def table(ids: list[int], p: list[float]) -> pd.DataFrame:
        return pd.DataFrame([("p", "c", 0, "", np.array(ids), np.array(p))], columns=list(LAWS))

    for ids, p in (([1, 1], [0.5, 0.3]), ([1, 2], [0.7, 0.6]), ([1, 2], [0.5, np.nan])):
        with pytest.raises(InputError, match="not a law") as e:
            law_dict(table(ids, p))
        assert e.value.exit_code == ExitCode.BAD_INPUT
    for raw in ([(1, -0.1), (1, -0.2)], [(1, -0.1), (20, -3.0)], [(1, -0.1), (2, 0.5)], [(1, -1)]):
        with pytest.raises(EngineError, match="not a top-2 list") as e2:
            _top_n(raw, 2, 16, "w")
        assert "\n" not in str(e2.value) and e2.value.exit_code == ExitCode.BAD_INPUT
    ids, p = _top_n([(3, -2.0), (1, -2.0), (2, -0.5)], 2, 16, "w")  # the extra entry dropped
    assert ids.tolist() == [1, 2] and p[1] == pytest.approx(np.exp(-0.5))


RAW = np.log(np.sort(np.random.default_rng(7).dirichlet(np.full(16, 0.5)))[::-1])  # descending


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=6),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=0.8, top_p=0.6),  # the bracket on Z decides the cut
        SamplingParams(temperature=0.7, min_p=0.2),
    ],
)
def test_a_raw_top_n_list_rebuilds_the_law_where_it_closes_inside(sp: SamplingParams) -> None:
    """The top 6 raw entries give the same processed law as all 16 (spectest's pipeline)."""
    full = processed_law(list(enumerate(RAW.tolist())), 16, sp, "w").numpy()
    got = processed_from_list(range(6), np.exp(RAW[:6]).tolist(), 16, sp, "w").numpy()
    assert np.flatnonzero(full).max() < 6
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.5, top_p=0.8),  # the bracket on Z straddles the cut
        SamplingParams(temperature=1.0, top_k=7),  # k > n
        SamplingParams(temperature=1.0, top_p=0.999),  # the nucleus leaves the list
        SamplingParams(temperature=1.0),  # no filter: the tail is in the law
        SamplingParams(temperature=0.7, min_p=1e-9),  # min-p cuts no listed token
    ],
)
def test_a_raw_top_n_list_that_does_not_fix_the_law_is_refused(sp: SamplingParams) -> None:
    with pytest.raises(Violation, match=r"(closes inside|that) the top-6 raw list"):
        processed_from_list(range(6), np.exp(RAW[:6]).tolist(), 16, sp, "w")


def _llamacpp(tmp_path: Path, mode: str, law_probs: int | None) -> tuple[LawAsker, Path]:
    log = tmp_path / f"{mode}-{law_probs}.jsonl"
    argv = ["{python}", str(ROOT / "tests" / "fake_completion_server.py"), "--port", "{port}"]
    raw = {"api": "llamacpp", "server": [*argv, "--probs", mode, "--log", str(log)]}
    if law_probs is not None:
        raw["law_probs"] = law_probs
    choice = SimpleNamespace(name="http", options=HTTPEngine.parse_options(raw, "t"))
    return LawAsker(choice, Models(SimpleNamespace(vocab_size=16), None)), log


def test_llamacpp_law_probs_asks_a_top_n_list_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """``law_probs`` 6: ``n_probs`` 6, the fake server's top 6 of ``LAW`` (mass 81/136: read
    coarsened); unset: ``n_probs`` = V 16, the whole law; a list with an id twice: exit 2."""
    tokens = np.array([[1, 2], [3, 4]])
    sp = SamplingParams(temperature=1.0)
    for law_probs, n in ((6, 6), (None, 16)):
        asker, log = _llamacpp(tmp_path, "exact", law_probs)
        try:
            got = asker.laws([1, 2, 3], sp, tokens)
        finally:
            asker.close()
        sent = [b for _, b in map(json.loads, log.read_text().splitlines())]
        assert {(b["n_probs"], b["post_sampling_probs"]) for b in sent} == {(n, True)}
        for ids, p in got.values():
            assert ids.tolist() == list(range(n))
            np.testing.assert_allclose(p, LAW[:n], rtol=0, atol=1e-12)
    asker, _ = _llamacpp(tmp_path, "dup", 6)
    try:
        with pytest.raises(EngineError, match=r"not a top-6 list .* \(7 entries, 6 distinct") as e:
            asker.laws([1, 2, 3], sp, tokens)
    finally:
        asker.close()
    assert "\n" not in str(e.value) and e.value.exit_code == ExitCode.BAD_INPUT
