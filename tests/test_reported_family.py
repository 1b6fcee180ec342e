"""Claim (a) from engine-reported probabilities inside ``spectest run`` (issue 31 item 1).

- Parsing each server's reply shape through the real ``http`` engine and a real loopback server
  (``tests/fake_completion_server.py``): llama.cpp's ``completion_probabilities`` (post-sampling
  ``prob`` / ``top_probs``; the speculative path's empty list is "not reported"), the OpenAI
  ``logprobs`` (``token_id:N`` keys; the sampled token vLLM adds beside the top n is not part of
  the list); a reply naming another token is exit 2. The option is hashed only when set.
- The truncated PIT (``pit.pit_interval``) is exactly U(0, 1) under the reported law, by
  enumeration of every token of random laws and every list length (no sampling), and equals its
  slow reference.
- ``reported_p.ReportedFamily``: round slots from reported rounds (a tiling; totals per
  sequence are not one), the floor-measured tolerance, and the family end to end in ``spectest
  run`` with the example program ``reporting_engine.py``: honest → claim (a) no difference;
  the liar that reports the law it sampled → DIFFERENT (exit 1) by the cross-check. The PIT's
  V are one per row of the arm, so a row leaving the reported set changes no other row's u.

False-failure rates: every statistical check uses fixed seeds (deterministic); the honest run
fails with probability ≤ its family's α share (0.05 / 4 families here) over fresh seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectest import schema as sc
from spectest.engines import replies, server_probs
from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec, options_dict
from spectest.engines.http import HTTPEngine
from spectest.sampling.params import SamplingParams
from spectest.stats import pit, reported_p
from spectest.stats.reported_p import crosscheck_tol, slot_of

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_completion_server.py"
LAW = [(16 - v) / 136 for v in range(16)]


def _job(n: int = 4, T: int = 5) -> ArmJob:
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    return ArmJob(
        arm="candidate", role="candidate", variant=None, prompt_id="p0", prompt_ids=(1, 2, 3),
        rows=tuple(RowSpec("c", 100 + i, sp) for i in range(n)), num_positions=T, run_key=9,
        batch_size=16, drafter=DrafterSpec(onehot=False, k=3),
    )  # fmt: skip


def _generate(api: str, n: int, *flags: str) -> tuple[np.ndarray, np.ndarray]:
    raw = {"api": api, "server": ["{python}", str(FAKE), "--port", "{port}", *flags], "probs": n}
    eng = HTTPEngine(HTTPEngine.parse_options(raw, "t"), Models(None, None))
    try:
        out = eng.generate(_job())
    finally:
        eng.close()
    assert out.reported is not None
    return out.tokens, out.reported


def _expected(tok: int, n: int) -> tuple[float, float, float]:
    mass = sum(LAW[:n])
    if tok < n:
        return LAW[tok], sum(LAW[:tok]), mass
    return LAW[tok], float("nan"), min(mass, 1 - LAW[tok])


@pytest.mark.parametrize("api", ["llamacpp", "openai"])
@pytest.mark.parametrize("n", [3, 16])
def test_server_reports_are_parsed_into_p_cdf_lo_and_list_mass(api: str, n: int) -> None:
    tokens, rep = _generate(api, n)
    assert rep.shape == (*tokens.shape, 3)
    for (b, t), tok in np.ndenumerate(tokens):
        np.testing.assert_allclose(rep[b, t], _expected(int(tok), n), rtol=1e-12, atol=1e-12)
    if n == 3:  # the fake's tokens are in [0, 16): some fall outside a top-3 list
        assert np.isnan(rep[..., 1]).any() and np.isfinite(rep[..., 1]).any()


def test_llamacpp_speculative_tokens_without_a_list_are_not_reported() -> None:
    _, rep = _generate("llamacpp", 16, "--probs", "spec-empty")
    assert np.isnan(rep[:, 1::2]).all() and np.isfinite(rep[:, 0::2, 0]).all()


def test_a_report_for_another_token_is_exit_2() -> None:
    with pytest.raises(replies.ReplyError, match=r"completion_probabilities\[0\]\.id") as info:
        _generate("llamacpp", 4, "--probs", "bad-id")
    assert info.value.exit_code == 2


def test_openai_shapes_are_checked() -> None:
    lp = {
        "tokens": ["token_id:2"],
        "token_logprobs": [-1.0],
        "top_logprobs": [{"token_id:2": -1.0}],
    }
    good = {"choices": [{"token_ids": [2], "logprobs": lp}]}
    assert server_probs.reported_of("openai", good, [2], 4) == [(np.exp(-1.0), 0.0, np.exp(-1.0))]
    for path, bad in [
        ("tokens[0]", {"tokens": ["two"]}),
        ("token_logprobs[0]", {"token_logprobs": [0.5]}),
        ("tokens[0]", {"tokens": ["token_id:3"]}),
    ]:
        reply = json.loads(json.dumps(good))
        reply["choices"][0]["logprobs"].update(bad)
        with pytest.raises(replies.Violation) as info:
            server_probs.reported_of("openai", reply, [2], 4)
        assert info.value.path.endswith(path), (bad, str(info.value))


def test_probs_option_is_hashed_only_when_set() -> None:
    base = {"api": "llamacpp", "url": "http://127.0.0.1:1"}
    assert "probs" not in options_dict(HTTPEngine.parse_options(base, "t"))
    assert options_dict(HTTPEngine.parse_options({**base, "probs": 8}, "t"))["probs"] == 8
    assert server_probs.request_fields("llamacpp", 8) == {"n_probs": 8, "post_sampling_probs": True}


def _enumerated_cdf(p: np.ndarray, lo: np.ndarray, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """P(u ≤ a) when token v has probability p[v] and PIT interval [lo[v], lo[v] + w[v])."""
    frac = np.clip((a[:, None] - lo[None, :]) / np.where(w > 0, w, 1.0)[None, :], 0.0, 1.0)
    return (frac * p[None, :]).sum(1)


def test_truncated_pit_is_exactly_uniform_by_enumeration() -> None:
    rng = np.random.default_rng(0)
    a = np.linspace(0.0, 1.0, 101)
    for _ in range(20):
        V = int(rng.integers(2, 12))
        law = rng.dirichlet(np.full(V, 0.4))
        order = np.lexsort((np.arange(V), -law))  # descending, ties by id
        rank = np.argsort(order)
        before = np.cumsum(law[order]) - law[order]
        for n in range(1, V + 1):
            S = law[order[:n]].sum()
            inside = rank < n
            cdf_lo = np.where(inside, before[rank], np.nan)
            lo, w, ok = pit.pit_interval(law, cdf_lo, np.full(V, S))
            assert ok.all()
            np.testing.assert_allclose(_enumerated_cdf(law, lo, w, a), a, atol=1e-12)
            slow = [pit.pit_interval_slow(law[v], cdf_lo[v], S) for v in range(V)]
            np.testing.assert_array_equal(np.array([s[0] for s in slow]), lo)
            np.testing.assert_array_equal(np.array([s[1] for s in slow]), w)
    # p alone (no cdf_lo, no list mass) has no exact PIT
    assert not pit.pit_interval(np.r_[0.5], np.r_[np.nan], np.r_[np.nan])[2].any()


def test_truncated_pit_detects_a_list_the_tokens_were_not_drawn_from() -> None:
    """The enumeration's converse: tokens drawn from another law give a CDF off the diagonal."""
    law = np.array([0.5, 0.3, 0.2])
    drawn = np.array([0.2, 0.3, 0.5])
    lo, w, _ = pit.pit_interval(law, np.array([0.0, 0.5, np.nan]), np.full(3, 0.8))
    a = np.linspace(0, 1, 11)
    assert np.abs(_enumerated_cdf(drawn, lo, w, a) - a).max() > 0.1


def _reported_rows(n: int, seed: int) -> pd.DataFrame:
    """``n`` rows of tokens drawn from ``LAW`` (full law reported), every third not reported
    (a llama.cpp draft's tokens)."""
    g = np.random.default_rng(seed)
    tok = g.choice(len(LAW), size=n, p=LAW)
    p = np.asarray(LAW)[tok]
    lo = np.cumsum(LAW)[tok] - p
    keep = np.arange(n) % 3 != 1
    return pd.DataFrame(
        {
            sc.SEED: np.arange(n),
            sc.REP_P: np.where(keep, p, np.nan),
            sc.REP_CDF_LO: np.where(keep, lo, np.nan),
            sc.REP_MASS: np.nan,
        }
    )


def test_a_row_leaving_the_reported_set_moves_no_other_rows_pit() -> None:
    """One V per row of the arm (``reported_p.reported_pit``): a row whose report comes or goes
    (a draft acceptance flipped by numerics) changes its own u only, so a decision moves as far
    as its data did. With a V per reported row every later row's u would change."""
    df = _reported_rows(300, seed=1)
    rep, u = reported_p.reported_pit(df, np.random.default_rng(5))
    assert u is not None and len(u) == len(rep) == 200
    lo = rep[sc.REP_CDF_LO].to_numpy()
    v = np.random.default_rng(5).random(len(df))[df[sc.REP_P].notna().to_numpy()]
    np.testing.assert_array_equal(u, lo + v * rep[sc.REP_P].to_numpy())  # the stated V
    for i in (0, 3, 150, 297):  # a reported row leaves the set
        gone = df.copy()
        gone.loc[i, [sc.REP_P, sc.REP_CDF_LO]] = np.nan
        _, u2 = reported_p.reported_pit(gone, np.random.default_rng(5))
        assert u2 is not None and len(u2) == len(u) - 1
        others = rep.index != i
        np.testing.assert_array_equal(u2, u[others])
    # a row no PIT interval exists for (p alone): no u at all, and the same draws consumed
    alone = df.copy()
    alone.loc[0, sc.REP_CDF_LO] = np.nan
    rng = np.random.default_rng(5)
    assert reported_p.reported_pit(alone, rng)[1] is None
    assert rng.random() == np.random.default_rng(5).random(len(df) + 1)[-1]


def _rounds(rows: list[tuple[int, ...]]) -> pd.DataFrame:
    cols = ["seed", "round", sc.POSITION, "drafted", "accepted", "emitted"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(**{sc.PROMPT_ID: "p0", sc.CONFIG_ID: "c", sc.ARM: "candidate"})


def _tokens(seed_positions: list[tuple[int, int]]) -> pd.DataFrame:
    s, t = zip(*seed_positions, strict=True)
    return pd.DataFrame({sc.PROMPT_ID: "p0", sc.CONFIG_ID: "c", sc.SEED: s, sc.POSITION: t})


def test_round_slots_from_a_tiling_and_none_from_totals() -> None:
    toks = _tokens([(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1)])
    r = _rounds([(1, 0, 0, 3, 2, 3), (1, 1, 3, 3, 0, 1), (1, 2, 4, 3, 3, 1), (2, 0, 0, 3, 3, 2)])
    np.testing.assert_array_equal(slot_of(toks, r), [0, 1, 2, 0, 0, 0, 1])
    totals = _rounds([(1, 0, 0, 6, 2, 5), (2, 0, 0, 6, 1, 2)])  # llama.cpp's draft_n readout
    assert slot_of(toks, totals) is None
    assert slot_of(toks, None) is None
    assert slot_of(toks, r.iloc[:2]) is None  # position 4 of seed 1 is in no round


def test_crosscheck_tolerance_is_the_measured_floor_when_larger() -> None:
    rng = np.random.default_rng(1)
    p = rng.random(2000)
    ref = pd.DataFrame({sc.REP_P: p, sc.WB_P: p + rng.normal(0, 0.01, 2000)})
    tol, floor = crosscheck_tol(ref)
    assert tol == floor and 0.02 < floor < 0.05
    exact = pd.DataFrame({sc.REP_P: p, sc.WB_P: p})
    assert crosscheck_tol(exact) == (reported_p.DEFAULT_TOL, 0.0)
    assert crosscheck_tol(pd.DataFrame({sc.REP_P: p}))[0] == reported_p.DEFAULT_TOL


def _protocol(tmp_path: Path, lie: str) -> Path:
    extra = ', "--speculative"' if lie == "none" else ""
    path = tmp_path / f"{lie}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            version: 2
            name: reported-run-{lie}
            models: {{target: bundled:target, draft: bundled:draft}}
            drafter: {{kind: sampled, k: 3}}
            prompts: {{file: {ROOT / "protocols/prompts/english-2.jsonl"}, limit: 1}}
            configs:
              t0.6-p0.8: {{temperature: 0.6, top_p: 0.8}}
              t1.5-p0.8: {{temperature: 1.5, top_p: 0.8}}
            seeds: {{per_arm: 64}}
            positions: 8
            teeth: {{null_arm: false}}
            engines:
              candidate: {{name: command, command: ["{{python}}", "{{programs}}/reporting_engine.py", "--lie", "{lie}"{extra}]}}
            """  # noqa: E501
        )
    )
    return path


@pytest.mark.slow
def test_run_decides_claim_a_from_reported_probabilities(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = {}
    for lie in ("none", "sampled"):
        proc = subprocess.run(
            [sys.executable, "-m", "spectest", "run", "--config", str(_protocol(tmp_path, lie)),
             "--out", str(tmp_path / lie)],
            capture_output=True, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        summary = json.loads((tmp_path / lie / "summary.json").read_text())
        out[lie] = (proc.returncode, proc.stdout, summary["details"]["candidate"])
    code, stdout, details = out["none"]
    assert code in (0, 3), stdout  # 3: the power rule at 64 seeds, not a rejection
    assert "claim (a) from engine-reported p: no difference found" in stdout
    assert details["reported_rejected"] is False and details["reported_candidate_tokens"] == 1024
    assert "slot_" in stdout or details["alpha_reported"] > 0
    code, stdout, details = out["sampled"]
    assert code == 1, stdout
    assert "claim (a) from engine-reported p: differs" in stdout
    assert "reported-p crosscheck_teacher (approximate)" in stdout
    assert details["reported_rejected"] is True


def _byo(path: Path, rng: np.random.Generator, reported_law: np.ndarray | None) -> Path:
    """A bring-your-own samples file: 300 sequences of 2 tokens from LAW16 (position-free);
    ``reported_law``: the law the file claims each token was drawn from (None: no claim)."""
    law = np.array(LAW)
    n = 300
    toks = (np.cumsum(law)[None, :] < rng.random((n * 2, 1))).sum(1)  # inverse CDF
    seeds, pos = np.repeat(np.arange(n), 2), np.tile([0, 1], n).astype(np.int32)
    df = pd.DataFrame(
        {sc.PROMPT_ID: "p0", sc.CONFIG_ID: "c", sc.SEED: seeds, sc.POSITION: pos, sc.TOKEN_ID: toks}
    )
    if reported_law is not None:
        rank = np.argsort(-reported_law, kind="stable")
        before = np.empty(16)
        before[rank] = np.cumsum(reported_law[rank]) - reported_law[rank]
        df[sc.REP_P], df[sc.REP_CDF_LO] = reported_law[toks], before[toks]
    df.to_parquet(path)
    return path


def test_compare_decides_claim_a_from_reported_columns(tmp_path: Path) -> None:
    from spectest.byo_compare import compare_files

    rng = np.random.default_rng(7)
    ref = _byo(tmp_path / "ref.parquet", rng, None)
    honest = _byo(tmp_path / "honest.parquet", rng, np.array(LAW))
    lying = _byo(tmp_path / "lying.parquet", rng, np.full(16, 1 / 16))  # claims uniform
    ok = compare_files(ref, honest, out=tmp_path / "ok")
    bad = compare_files(ref, lying, out=tmp_path / "bad")
    assert ok.summary["details"]["candidate"]["reported_rejected"] is False
    assert ok.summary["details"]["candidate"]["reported_candidate_tokens"] == 600
    assert bad.summary["details"]["candidate"]["reported_rejected"] is True
    assert bad.verdict.exit_code == 1
    scope = bad.verdict.scope
    assert scope is not None
    lines = [f.verdict_line for f in scope.families]
    assert any("claim (a) from engine-reported p: differs" in line for line in lines)


def test_top_n_mass_outside_is_stated_in_the_verdict_line_and_summary() -> None:
    from spectest.stats.battery import AnalysisOptions, analyze
    from spectest.stats.family_cells import CellFamily
    from spectest.stats.reported_p import ReportedFamily

    rng = np.random.default_rng(3)
    law = np.array(LAW)
    n, top = 400, 4
    frames = []
    for arm in ("reference", "candidate"):
        toks = (np.cumsum(law)[None, :] < rng.random((n, 1))).sum(1)
        inside = toks < top  # LAW is descending in id: the top 4 are ids 0-3
        frames.append(pd.DataFrame({
            sc.PROMPT_ID: "p0", sc.CONFIG_ID: "c", sc.ARM: arm, sc.SEED: np.arange(n),
            sc.POSITION: np.zeros(n, np.int32), sc.TOKEN_ID: toks, sc.REP_P: law[toks],
            sc.REP_CDF_LO: np.where(inside, np.cumsum(law)[toks] - law[toks], np.nan),
            sc.REP_MASS: law[:top].sum(),
        }))  # fmt: skip
    a = analyze(
        pd.concat(frames, ignore_index=True), reference="reference", candidate="candidate",
        options=AnalysisOptions(null_permutations=10, trie_depth=0, sequence=False),
        families=[CellFamily(), ReportedFamily()],
    )  # fmt: skip
    res = a.families["reported"]
    assert not res.rejected and not res.control_failed
    outside = 1 - law[:top].sum()
    assert f"mass outside {outside:.3g} on average" in res.verdict_line
    s = res.summary()
    assert abs(s["reported_candidate_mass_outside_mean"] - outside) < 1e-12
    assert 0.3 < s["reported_candidate_outside_fraction"] < 0.6  # P(id >= 4) = 0.46


@pytest.mark.slow
def test_beside_a_teacher_forced_floor_the_reported_p_rejection_decides(tmp_path: Path) -> None:
    """The ``correct`` liar (top-p before temperature, reporting the law it should have used)
    with claim (b) teacher-forced and the built-in white-box family off: only the reported-p
    family is exact here, and its rejection (tokens reported at p = 0, the PIT) is the
    sampler's, not numerics: DIFFERENT (exit 1). Session 11 found this INCONCLUSIVE (exit 3):
    beside a floor arm only the white-box family counted. Deterministic (the protocol's seeds);
    the support test cannot reject an honest engine (p = 0 is never drawn)."""
    path = _protocol(tmp_path, "correct")
    text = path.read_text().replace(
        "teeth: {null_arm: false}\n",
        "teeth: {null_arm: false}\ntests: {whitebox: false}\n"
        "arms: {floor: {teacher_forced: true}}\n",
    )
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", str(path), "--out",
         str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert "teacher-forced" in proc.stdout and "claim (a) from engine-reported p: differs" in (
        proc.stdout
    ), proc.stdout[-3000:]
    assert proc.returncode == 1 and "DIFFERENT (exit 1)" in proc.stdout, proc.stdout[-3000:]
