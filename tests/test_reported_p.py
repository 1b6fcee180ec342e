"""Engine-reported probabilities: the protocol field, the family conditional on them, the audit.

- ``probs`` of a ``spectest-jsonl/1`` result is checked field by field like every field
  (``engines.replies``): a bool, NaN, a value above 1, p + cdf_lo > 1, the wrong length;
  through the real command engine, probs in some results only, or too few, are exit 2.
- ``stats.reported_p``: the fast PIT equals its slow reference; under H0 (tokens drawn from the
  reported laws) the family fails in ≤ α of 400 replications; an engine sampling one law and
  reporting another is caught; the cross-check tolerates rounding and flags a wrong law.
- The example program ``reporting_engine.py`` through the real command engine: honest (exact
  speculative, rounds reported) passes; the liar that reports the correct p while sampling the
  top-p-before-temperature law is caught (exit 1, ``support_reported``), and the one that
  reports the law it sampled is caught by the cross-check (exit 1, ``crosscheck_teacher``);
  the same through ``spectest reported-p`` (exit 1 naming the cross-check; exit 2 for a
  program that reports no probabilities).

False-failure rates: every statistical test uses fixed seeds (deterministic). Over fresh seeds
the H0 count exceeds its bound 12 of 400 with probability < 1e-3 (binomial, α = 0.01); the
honest program fails with probability ≤ α = 0.01.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from spectest.engines import replies
from spectest.stats import pit, reported_p

ROOT = Path(__file__).resolve().parents[1]


def _result(probs: object, n: int = 2) -> dict[str, object]:
    return {"type": "result", "id": 0, "seed": 1, "tokens": list(range(n)), "probs": probs}


def _check(obj: dict[str, object]) -> None:
    replies.check(replies.result_line(4, 10), obj)
    replies.check_probs(obj)


def test_probs_field_is_optional_and_checked() -> None:
    _check(_result(None))
    _check(_result([{"p": 0.5, "cdf_lo": 0.5}, {"p": 1, "cdf_lo": None}]))
    _check(_result([{"p": 0.25}, {"p": 0.5, "cdf_lo": 0.5 + 5e-7}]))  # rounding slack
    bad = [
        ([{"p": True}, {"p": 0.5}], "probs[0].p"),
        ([{"p": float("nan")}, {"p": 0.5}], "probs[0].p"),
        ([{"p": 1.5}, {"p": 0.5}], "probs[0].p"),
        ([{"p": 0.5}, {"cdf_lo": 0.5}], "probs[1].p"),
        ([{"p": 0.5, "cdf_lo": -0.1}, {"p": 0.5}], "probs[0].cdf_lo"),
        ([{"p": 0.7, "cdf_lo": 0.4}, {"p": 0.5}], "probs[0]"),
        ([{"p": 0.5}], "probs"),
        ("0.5", "probs"),
    ]
    for probs, path in bad:
        with pytest.raises(replies.Violation) as info:
            _check(_result(probs))
        assert info.value.path == path, (probs, str(info.value))


def test_pit_matches_slow_reference() -> None:
    rng = np.random.default_rng(1)
    p, lo = rng.random(50) * 0.5, rng.random(50) * 0.5
    fast = pit.pit_values(lo, p, np.random.default_rng(7))
    slow = pit.pit_values_slow(lo, p, np.random.default_rng(7))
    np.testing.assert_array_equal(fast, slow)


def _draw(
    rng: np.random.Generator, n: int, V: int = 12, report_shift: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """n tokens, each from a fresh Dirichlet law; reported: that law, or (report_shift > 0) a
    law moved towards uniform, i.e. sampled from one law and reported another."""
    law = rng.dirichlet(np.full(V, 0.5), size=n)  # [n, V]
    x = (law.cumsum(1) > rng.random((n, 1))).argmax(1)  # [n]
    rep = (1 - report_shift) * law + report_shift / V
    rank = np.argsort(-rep, axis=1, kind="stable")  # ties: smaller id first
    pos = np.argsort(rank, axis=1)  # [n, V] rank of every id
    sorted_rep = np.take_along_axis(rep, rank, 1)
    lo = sorted_rep.cumsum(1) - sorted_rep  # [n, V] mass before, in rank order
    i = np.arange(n)
    return rep[i, x], lo[i, pos[i, x]]


def test_family_false_failure_rate_under_h0_is_at_most_alpha() -> None:
    rng = np.random.default_rng(2026)
    fails = 0
    for _ in range(400):
        p, lo = _draw(rng, 300)
        fails += not reported_p.reported_family(p, lo, rng).ok
    assert fails <= 12, fails  # α = 0.01: 4 expected


def test_family_catches_a_law_reported_but_not_sampled() -> None:
    rng = np.random.default_rng(5)
    p, lo = _draw(rng, 3000, report_shift=0.5)
    res = reported_p.reported_family(p, lo, rng)
    assert res.exit_code == 1 and "pit_cvm_reported" in res.failed
    assert "conditional on the engine's reported p" in res.lines()[0]


def test_crosscheck_tolerates_rounding_and_flags_another_law() -> None:
    rng = np.random.default_rng(3)
    p, lo = rng.random(1000) * 0.5, rng.random(1000) * 0.5
    noisy = p + rng.normal(0, 1e-6, 1000)
    assert reported_p.crosscheck(p, lo, noisy, lo).passed
    few = p.copy()
    few[:5] = 0.0  # 0.5 % of tokens across a filter's edge: allowed (max_fraction 1 %)
    assert reported_p.crosscheck(p, lo, few, lo).passed
    wrong = reported_p.crosscheck(p, lo, p * 1.05, lo)
    assert not wrong.passed and wrong.test == "crosscheck_teacher"
    assert not reported_p.crosscheck(p, lo, p, lo + 0.01).passed  # the cdf_lo half counts too
    assert reported_p.crosscheck(p, np.full(1000, np.nan), p, lo).passed  # p alone


def test_without_cdf_lo_only_support_and_crosscheck_run() -> None:
    rng = np.random.default_rng(4)
    p = rng.random(100)
    res = reported_p.reported_family(p, np.full(100, np.nan), rng, teacher=(p, p))
    assert [t.test for t in res.tests] == ["support_reported", "crosscheck_teacher"]
    zero = reported_p.reported_family(np.r_[p, 0.0], np.full(101, np.nan), rng)
    assert zero.failed == ("support_reported",)


@pytest.mark.slow
def test_example_program_honest_passes_and_both_liars_are_caught() -> None:
    import torch

    from spectest.engines import reported
    from spectest.engines.base import Models
    from spectest.engines.command import CommandEngine
    from spectest.models.zoo import load_pair
    from spectest.sampling.params import SamplingParams

    torch.set_num_threads(1)
    target, draft = load_pair("bundled:target", "bundled:draft")
    configs = [
        ("t0.6-p0.8", SamplingParams(temperature=0.6, top_p=0.8)),
        ("t1.5-p0.8", SamplingParams(temperature=1.5, top_p=0.8)),
    ]
    outcome = {}
    for lie in ("none", "correct", "sampled"):
        cmd = ["{python}", "{programs}/reporting_engine.py", "--lie", lie]
        cmd += ["--speculative"] if lie == "none" else []
        eng = CommandEngine(
            CommandEngine.parse_options({"command": cmd}, "t"), Models(target, draft)
        )
        try:
            c = reported.collect(eng, target, (1, 2, 3), configs, range(64), 8)
        finally:
            eng.close()
        assert len(c.p) == 2 * 64 * 8
        if lie == "none":
            assert c.rounds > 0  # the honest program reports its rounds too
        outcome[lie] = reported.audit(c, np.random.default_rng(0))
    assert outcome["none"].exit_code == 0, outcome["none"].lines()
    assert outcome["correct"].exit_code == 1 and "support_reported" in outcome["correct"].failed
    assert outcome["sampled"].exit_code == 1
    assert outcome["sampled"].failed == ("crosscheck_teacher",), outcome["sampled"].lines()


def _protocol(tmp_path: Path, program: str, *extra: str) -> Path:
    cmd = ", ".join(f'"{a}"' for a in ("{python}", "{programs}/" + program, *extra))
    path = tmp_path / f"{program}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            version: 2
            name: reported-p-test
            models: {{target: bundled:target, draft: bundled:draft}}
            drafter: {{kind: sampled, k: 3}}
            prompts: {{file: {ROOT / "protocols/prompts/english-2.jsonl"}, limit: 1}}
            configs:
              t0.6-p0.8: {{temperature: 0.6, top_p: 0.8}}
              t1.5-p0.8: {{temperature: 1.5, top_p: 0.8}}
            seeds: {{per_arm: 64}}
            positions: 8
            engines:
              candidate: {{name: command, command: [{cmd}]}}
            """
        )
    )
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "spectest", *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


@pytest.mark.slow
def test_cli_catches_the_liar_and_refuses_an_engine_without_probs(tmp_path: Path) -> None:
    liar = _cli("reported-p", "--config", str(_protocol(tmp_path, "reporting_engine.py",
                                                         "--lie", "sampled")))  # fmt: skip
    assert liar.returncode == 1, liar.stdout + liar.stderr
    assert "FAIL (crosscheck_teacher)" in liar.stdout
    assert "conditional on the engine's reported p" in liar.stdout
    mute = _cli("reported-p", "--config", str(_protocol(tmp_path, "builtin_engine.py")))
    assert mute.returncode == 2, mute.stdout + mute.stderr
    assert "reported no probabilities" in mute.stderr


MIXED = """\
import json, sys
print(json.dumps({"type": "hello", "protocol": "spectest-jsonl/1"}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    for i, seed in enumerate(job["seeds"]):
        res = {"type": "result", "id": job["id"], "seed": seed, "tokens": [1, 2]}
        if i == 0 or "{mode}" == "short":
            res["probs"] = [{{"p": 0.5, "cdf_lo": 0.1}}] * (2 if "{mode}" == "mixed" else 1)
        print(json.dumps(res), flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "match"),
    [("mixed", "reported by 1 of 2 results"), ("short", "field 'probs': expected a list of 2")],
)
def test_command_engine_refuses_probs_in_some_results_or_of_the_wrong_length(
    tmp_path: Path, mode: str, match: str
) -> None:
    from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
    from spectest.engines.command import CommandEngine
    from spectest.sampling.params import SamplingParams

    prog = tmp_path / "prog.py"
    prog.write_text(MIXED.replace("{mode}", mode).replace("{{", "{").replace("}}", "}"))
    opts = CommandEngine.parse_options({"command": [sys.executable, str(prog)]}, "t")
    eng = CommandEngine(opts, Models(None, None))
    sp = SamplingParams(temperature=1.0)
    job = ArmJob(
        arm="candidate", role="candidate", variant=None, prompt_id="p0", prompt_ids=(1,),
        rows=(RowSpec("c", 1, sp), RowSpec("c", 2, sp)), num_positions=2, run_key=0,
        batch_size=2, drafter=DrafterSpec(onehot=False),
    )  # fmt: skip
    try:
        with pytest.raises(replies.ReplyError, match=match) as info:
            eng.generate(job)
        assert info.value.exit_code == 2
    finally:
        eng.close()


def test_the_audit_result_is_a_family_result() -> None:
    """The standalone audit's result is a ``FamilyResult`` (issue 30): its table holds the
    checks, the cross-check does not count as tested, a failing check is a ``Failure``."""
    from spectest.stats.families import FamilyResult

    rng = np.random.default_rng(4)
    p = np.r_[rng.random(100), 0.0]
    res = reported_p.reported_family(p, np.full(101, np.nan), rng, teacher=(p, p))
    assert isinstance(res, FamilyResult) and res.rejected and not res.ok and not res.black_box
    assert list(res.table["test"]) == ["support_reported", "crosscheck_teacher"]
    assert (res.n_tested, res.alpha) == (1, reported_p.DEFAULT_ALPHA)
    assert [f.line.split(":")[0] for f in res.failing] == ["support_reported"]
