"""The fuzzer (``tools/fuzz.py``, ``tools/fuzzing``) kept honest in CI.

- A fixed subset of its cases — seed 0, the first ``SUBSET`` cases of each kind, one of them
  re-run as a real ``python -m spectest`` process — runs through the same worker and oracle as a
  fuzzing run and must be clean. Deterministic: the cases are a pure function of (seed, kind,
  index), so the same inputs run every time; their outcomes are exact (no statistics decide
  cleanliness: the toy runs' verdicts may be 0, 1 or 3, all clean), and the engine cases'
  timeouts have seconds of slack below their bounds.
- The oracle flags every unclean outcome it claims to (synthetic reports, and a real run
  directory tampered with), so a clean subset is not a check that cannot fail.
- Generation is deterministic and the schedule keeps its proportions.

The full run (≥ 10 000 cases) is recorded in results/LOG.md; this module costs ~1 min on two
loaded cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from toy_protocol import write_toy
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import fuzz  # noqa: E402
from fuzzing import KINDS, make_case, schedule  # noqa: E402
from fuzzing.oracle import agree, judge  # noqa: E402

SUBSET = 5  # cases of each kind


def test_cases_are_a_pure_function_of_seed_kind_and_index() -> None:
    for kind in KINDS:
        for i in range(20):
            a, b = make_case(0, i, kind), make_case(0, i, kind)
            assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        assert make_case(0, 3, kind)["files"] != make_case(1, 3, kind)["files"]


def test_schedule_keeps_the_proportions_and_is_seeded() -> None:
    kinds = schedule(0, 10_000, fuzz.DEFAULT_WEIGHTS)
    counts = {k: kinds.count(k) for k in KINDS}
    assert counts == {k: round(10_000 * w) for k, w in fuzz.DEFAULT_WEIGHTS.items()}
    w = fuzz.DEFAULT_WEIGHTS
    assert kinds == schedule(0, 10_000, w) != schedule(1, 10_000, w)
    head = fuzz.generate(0, 40, 0, fuzz.DEFAULT_WEIGHTS)
    tail = fuzz.generate(0, 20, 20, fuzz.DEFAULT_WEIGHTS)
    assert [c["id"] for c in head[20:]] == [c["id"] for c in tail]  # --start resumes the schedule


def test_fixed_subset_is_clean(tmp_path: Path) -> None:
    cases = [make_case(0, i, kind) for kind in KINDS for i in range(SUBSET)]
    # the first case of the subset is also run as a real process (rate 1 on a one-case list)
    tally = fuzz.run_cases(cases[1:], tmp_path / "fuzz", workers=1, log_every=0)
    sub = fuzz.run_cases(cases[:1], tmp_path / "sub", workers=1, subprocess_rate=1.0, log_every=0)
    assert tally.unclean == [] and sub.unclean == [], tally.unclean + sub.unclean
    assert sum(tally.cases.values()) == len(cases) - 1
    assert sub.subprocess_runs == 1 and sub.subprocess_agree == 1
    modes = {c["mode"] for c in cases}
    assert modes == {"cli", "command", "http", "resume"}, modes


# ----------------------------------------------------------------------------- the oracle
def _case(**kw: object) -> dict:
    case = {"id": "t-00000", "mode": "cli", "out": "run", "bound_s": 10.0, "expect": None}
    case.update(kw)
    return case


def _obs(code: int | None, stderr: str = "", **kw: object) -> dict:
    return {"exit": code, "stdout": "", "stderr": stderr, "exception": None, "wall": 1.0, **kw}


@pytest.mark.parametrize(
    "case, obs, says",
    [
        (_case(), _obs(2, "error: x", exception="Traceback ...\nValueError"), "traceback"),
        (_case(), _obs(4, "Traceback (most recent call last):\nerror: x"), "traceback text"),
        (_case(), _obs(7, "error: x"), "outside the documented codes"),
        (_case(), _obs(1), "exit 1 without a complete run directory"),
        (_case(out=None), _obs(1), "exit 1 that is not a verdict"),
        (_case(), _obs(0), "exit 0 without a complete run directory"),
        (_case(), _obs(2, "Usage: x\nerror: y"), "2 stderr line(s)"),
        (_case(), _obs(2, ""), "0 stderr line(s)"),
        (_case(), _obs(4, "error: internal error: ValueError"), "internal error"),
        (_case(), _obs(2, "error: x", wall=11.0), "past the bound"),
        (_case(), _obs(None, hung=True, wall=40.0), "hang"),
        (_case(expect=[0, 1, 3]), _obs(2, "error: x"), "expected one of [0, 1, 3]"),
        (_case(), _obs(None, harness_error="boom"), "harness error"),
    ],
)
def test_oracle_flags_each_unclean_outcome(
    tmp_path: Path, case: dict, obs: dict, says: str
) -> None:
    problems = judge(case, obs, tmp_path)
    assert any(says in p for p in problems), problems


def test_oracle_accepts_clean_outcomes(tmp_path: Path) -> None:
    assert judge(_case(), _obs(2, "error: x\nusing the shipped protocol ci"), tmp_path) == []
    assert judge(_case(mode="command", out=None), _obs(0), tmp_path) == []
    marked = "FUZZ-PLUGIN-SAYS hi\nerror: x"
    assert judge(_case(), _obs(2, marked), tmp_path) == []


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    d = tmp_path_factory.mktemp("run")
    proto = write_toy(d, teeth={"null_arm": False, "epsilons": [], "mutants": []},
                      seeds={"per_arm": 4}, positions=1)  # fmt: skip
    r = CliRunner().invoke(
        __import__("spectest.cli", fromlist=["app"]).app,
        ["run", "--config", str(proto), "--out", str(d / "run"), "--no-progress"],
    )
    assert r.exit_code in (0, 1, 3), r.stderr
    return d, r.exit_code


def test_oracle_checks_the_run_directory(complete_run: tuple[Path, int]) -> None:
    d, code = complete_run
    assert judge(_case(), _obs(code), d) == []
    other = {0: 3, 1: 3, 3: 0}[code]
    assert any("summary.json's verdict says" in p for p in judge(_case(), _obs(other), d))
    assert any("run directory is complete" in p for p in judge(_case(), _obs(2, "error: x"), d))
    samples = d / "run" / "samples.parquet"
    data = samples.read_bytes()
    try:
        samples.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit: the manifest check fails
        problems = judge(_case(), _obs(code), d)
        assert any("run directory broken" in p for p in problems), problems
    finally:
        samples.write_bytes(data)


def test_oracle_flags_a_tooth_claim_and_a_stale_resume(tmp_path: Path) -> None:
    """Issue 33: an exit 0 resting on a tooth's size (the old rule), a support-only kill that
    does not say so, and a resume after an edited kernel that reused every shard are unclean;
    the claim rules' and the resume rules' clean outcomes pass."""
    from fuzzing.oracle import judge_claim, judge_resume

    run = tmp_path / "run"
    run.mkdir()

    def summary(verdict: dict, notes: list[str] | None = None) -> None:
        (run / "summary.json").write_text(json.dumps({"verdict": verdict, "notes": notes or []}))

    tooth = {"tv": 0.08, "source": "tooth", "tooth": "eps=0.5", "exact": True}
    summary(
        {
            "decision": "equivalent",
            "power_claim": tooth,
            "max_mde_tv": 0.15,
            "scope": {"cells_tested": 4},
            "headline": "x, as the killed tooth eps=0.5 shows",
        }
    )
    assert len(judge_claim(run)) == 2
    mde = {"tv": 0.1, "source": "mde"}
    summary(
        {
            "decision": "equivalent",
            "power_claim": mde,
            "max_mde_tv": 0.15,
            "scope": {"cells_tested": 4},
            "headline": "ok",
            "teeth": [],
        }
    )
    assert judge_claim(run) == []
    summary(
        {
            "decision": "equivalent",
            "power_claim": {"tv": None, "source": "none"},
            "max_mde_tv": 1.0,
            "scope": {"cells_tested": 0},
        }
    )
    assert any("no cell-position tested" in p for p in judge_claim(run))
    summary(
        {
            "decision": "inconclusive",
            "teeth": [{"arm": "mutant:x", "support_only": True, "label": "killed (size 0.02)"}],
        }
    )
    assert any("support only" in p for p in judge_claim(run))
    case = _case(mode="resume", edit={"op": "buggy", "files": {}})
    summary({}, ["shards: 0 generated, 4 resumed from run"])
    assert judge_resume(case, _obs(0, first_exit=0), tmp_path)
    summary({}, ["provenance: arm 'candidate' runs something else ...", "shards: 2 generated"])
    assert judge_resume(case, _obs(1, first_exit=0), tmp_path) == []
    tamper = _case(mode="resume", edit={"op": "tamper_shard", "files": {}})
    obs = _obs(0, first_exit=0, touched="candidate__p0.samples.parquet")
    assert judge_resume(tamper, obs, tmp_path)
    obs = _obs(2, "error: run/shards/candidate__p0.samples.parquet: sha256 differs",
               first_exit=0, touched="candidate__p0.samples.parquet")  # fmt: skip
    assert judge_resume(tamper, obs, tmp_path) == []


def test_agree_flags_a_different_exit_code(tmp_path: Path) -> None:
    a, b = _obs(2, f"error: {tmp_path}/x"), _obs(4, "error: y")
    problems, _ = agree(_case(), a, tmp_path, b, tmp_path)
    assert problems and "oracle disagreement" in problems[0]
    same, notes = agree(_case(), a, tmp_path, _obs(2, f"error: {tmp_path}/x"), tmp_path)
    assert same == [] and notes == []
