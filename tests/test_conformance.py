"""``spectest conformance``: engines that honour the contract pass, engines that break one rule
fail that check and no other, an engine whose hello says its seeds are ignored is "not
reproducible" (exit 0), a program that cannot start is exit 4. Real engines throughout: the
built-in and hf engines on small models, the command engine on real child processes (small
programs written here, the shipped example program), the shipped OpenVINO / mistral.rs / MLX
programs where their venvs are set up (opt-in, slow). Exact checks: no statistics."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import venv_engines
import yaml

from spectest import conformance
from spectest.conformance import CHECKS, Workload, check, check_arm
from spectest.engines.base import ArmJob, ArmOutput, DrafterSpec, Engine, rounds_from_tuples
from spectest.engines.builtin import BuiltinEngine
from spectest.models.zoo import load_pair

ROOT = Path(__file__).resolve().parents[1]
TOY = {"target": "toy:V=16,order=2,scale=2.0,seed=3", "draft": "toy:V=16,order=2,scale=1.0,seed=4"}
TINY = {"target": "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3",
        "draft": "derived:first_layers,layers=1"}  # fmt: skip


@pytest.fixture(scope="module")
def toy_models() -> Any:
    from spectest.engines.base import Models

    return Models(*load_pair(TOY["target"], TOY["draft"]))


def statuses(report: conformance.ConformanceReport) -> dict[str, str]:
    """check [role] → status."""
    return {f"{r.name} [{r.role}]" if r.role else r.name: r.status for r in report.results}


# ----------------------------------------------------------------------------- engines that pass
def test_builtin_conforms_on_every_check(toy_models) -> None:
    report = check("builtin", {}, models=toy_models)
    report.assert_ok()
    assert report.exit_code == 0 and report.ran
    got = statuses(report)
    for name in CHECKS:
        if name not in ("class", "options", "provenance", "close"):
            assert got[f"{name} [reference]"] == "pass", name
            assert got[f"{name} [candidate]"] == "pass", name
    assert report.lines()[-1].startswith("CONFORMS (exit 0): engine builtin")


def test_hf_engines_conform_and_generate_is_per_job() -> None:
    gen = check("hf-generate", {}, **TINY, roles=("reference",))
    gen.assert_ok()
    assert statuses(gen)["batch composition [reference]"] == "skip"  # seeds per job, declared
    check("hf-assisted", {}, **TINY, roles=("candidate",)).assert_ok()


# ----------------------------------------------------------------------------- one rule broken
class _Plain(BuiltinEngine):
    """The built-in engine's plain loop under another name (a Python plug-in class)."""

    name = "plain-test"
    needs = "target"

    def generate(self, job: ArmJob) -> ArmOutput:
        return super().generate(dataclasses.replace(job, variant=None))


class _NeedsLies(_Plain):
    """Declares needs = "target" and reads the draft anyway."""

    name = "needs-lies"

    def generate(self, job: ArmJob) -> ArmOutput:
        assert self.models.draft is not None, "no draft"
        return super().generate(job)


class _BatchDependent(_Plain):
    """Seeds per row claimed, but the first row of a job decides every row's seed."""

    name = "batch-dependent"

    def generate(self, job: ArmJob) -> ArmOutput:
        first = job.rows[0].seed
        rows = tuple(dataclasses.replace(r, seed=r.seed + first) for r in job.rows)
        return super().generate(dataclasses.replace(job, rows=rows))


class _BadRounds(_Plain):
    """Rounds that do not add up to the tokens."""

    name = "bad-rounds"
    rounds = "readout"

    def generate(self, job: ArmJob) -> ArmOutput:
        out = super().generate(job)
        rounds = [(i, 0, 0, 3, 1, 2) for i in range(len(job.rows))]  # 2 of T tokens
        return ArmOutput(out.tokens, rounds_from_tuples(rounds), False, out.whitebox)


class _AcceptsAnyOption(_Plain):
    """Options that do not refuse an unknown key."""

    name = "lax-options"

    @classmethod
    def parse_options(cls, raw: Any, where: str, base_dir: Path | None = None) -> Any:
        return cls.Options()


class _BadDeclaration(_Plain):
    name = "bad-declaration"
    seeds = "sometimes"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("cls", "failing"),
    [
        (_Plain, set()),
        (_NeedsLies, {"needs [reference]"}),
        (_BatchDependent, {"batch composition [reference]"}),
        (_BadRounds, {"rounds [reference]"}),
        (_AcceptsAnyOption, {"options"}),
        (_BadDeclaration, {"class"}),
    ],
)
def test_each_broken_rule_fails_its_check_only(toy_models, cls: type[Engine], failing: set) -> None:
    report = check(cls, {}, models=toy_models, roles=("reference",))
    got = {k for k, v in statuses(report).items() if v == "fail"}
    assert got == failing, "\n".join(report.lines())
    assert report.exit_code == (0 if not failing else 2)
    if failing:
        assert report.lines()[-1].startswith(f"DOES NOT CONFORM (exit 2): engine {cls.name}")


def test_an_engine_that_refuses_every_role_ran_nothing(toy_models) -> None:
    """hf-assisted refuses a one-hot drafter (check_protocol): no job, exit 3, not a pass."""
    work = Workload(drafter=DrafterSpec(onehot=True, k=2))
    report = check("hf-assisted", {}, models=toy_models, workload=work)
    assert not report.ran and report.ok and report.exit_code == 3
    assert report.headline().startswith("INCONCLUSIVE (exit 3): engine hf-assisted: no job ran")


def test_bad_workload_is_bad_input(toy_models) -> None:
    from spectest.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prompt ids \[1, 99\] are not ids in \[0, 16\)"):
        check("builtin", {}, models=toy_models, workload=Workload(prompt=(1, 99)))


# ----------------------------------------------------------------------------- command programs
HELLO = {"type": "hello", "protocol": "spectest-jsonl/1", "engine": "t"}
PROGRAM = """
import hashlib, json, random, sys
HELLO = {hello}
print(json.dumps(HELLO)); sys.stdout.flush()
counter = 0
for line in sys.stdin:
    job = json.loads(line)
    if job.get("type") != "job":
        continue
    for seed, key in zip(job["seeds"], job["row_keys"]):
        {draw}
        toks = [rng.randrange(16) for _ in range(job["max_tokens"])]
        print(json.dumps({{"type": "result", "id": job["id"], "seed": seed, "tokens": toks,
                          "rounds": [{{"drafted": 3, "accepted": 2, "emitted": len(toks)}}]}}))
    sys.stdout.flush()
"""
DRAWS = {
    "per row": "rng = random.Random(key)",  # honours its row key
    "process-wide": "counter += 1; rng = random.Random(counter)",  # ignores it
}


def _program(tmp_path: Path, hello: dict[str, Any], draw: str) -> list[str]:
    prog = tmp_path / f"prog-{len(list(tmp_path.iterdir()))}.py"
    prog.write_text(textwrap.dedent(PROGRAM.format(hello=repr(hello), draw=DRAWS[draw])))
    return [sys.executable, str(prog)]


def test_command_program_that_honours_seeds_conforms(tmp_path, toy_models) -> None:
    report = check("command", {"command": _program(tmp_path, HELLO, "per row")}, models=toy_models)
    report.assert_ok()
    got = statuses(report)
    assert got["same seeds [candidate]"] == got["batch composition [candidate]"] == "pass"
    assert got["white-box [candidate]"] == "skip"  # tokens only
    assert got["rounds [candidate]"] == "pass"  # a readout may aggregate (one entry per row)


def test_command_program_whose_hello_says_seeds_ignored_is_not_reproducible(
    tmp_path, toy_models
) -> None:
    hello = {**HELLO, "seeds": "ignored: one process-wide RNG"}
    report = check("command", {"command": _program(tmp_path, hello, "process-wide")},
                   models=toy_models)  # fmt: skip
    got = statuses(report)
    assert (
        got["same seeds [candidate]"]
        == got["batch composition [candidate]"]
        == ("not reproducible")
    )
    assert report.ok and report.exit_code == 0, "\n".join(report.lines())
    assert "rows are not reproducible from their seeds (the engine says so)" in report.headline()


def test_command_program_that_claims_seeds_but_ignores_them_fails(tmp_path, toy_models) -> None:
    report = check("command", {"command": _program(tmp_path, HELLO, "process-wide")},
                   models=toy_models, roles=("candidate",))  # fmt: skip
    got = {k for k, v in statuses(report).items() if v == "fail"}
    assert got == {"same seeds [candidate]", "batch composition [candidate]"}
    assert "the same job twice gave other tokens for row" in "\n".join(report.lines())


def test_command_program_that_cannot_start_is_infrastructure(tmp_path, toy_models) -> None:
    report = check("command", {"command": [str(tmp_path / "missing-program")]},
                   models=toy_models, roles=("candidate",))  # fmt: skip
    assert report.exit_code == 4, "\n".join(report.lines())
    assert any(r.infrastructure and "cannot start" in r.detail for r in report.failures)


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "spectest", "conformance", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip


def test_cli_on_a_protocol_arm_and_by_name(tmp_path) -> None:
    """``--config P --arm A`` takes the arm's engine, options, models, prompt and configs; the
    exit code is the report's (0 / 2 / 4); usage errors are 2."""
    body = {
        "version": 2, "name": "conf", "models": TOY, "drafter": {"kind": "sampled", "k": 2},
        "prompts": {"file": "p.jsonl"}, "configs": {"a": {"temperature": 0.9, "top_k": 5}},
        "seeds": {"per_arm": 10}, "positions": 3,
        "engines": {"candidate": {"name": "command",
                                  "command": _program(tmp_path, HELLO, "process-wide")}},
    }  # fmt: skip
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "ids": [1, 2, 3]}\n')
    (tmp_path / "conf.yaml").write_text(yaml.safe_dump(body))
    r = _cli("--config", str(tmp_path / "conf.yaml"), "--arm", "candidate", "--seeds", "3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FAIL  same seeds [candidate]" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("DOES NOT CONFORM (exit 2): engine command")
    r = _cli("--config", str(tmp_path / "conf.yaml"), "--arm", "reference", "--seeds", "2")
    assert r.returncode == 0 and "engine builtin honours the contract" in r.stdout, r.stdout
    r = _cli("builtin", "--target", TOY["target"], "--draft", TOY["draft"], "--seeds", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli("builtin", "--config", str(tmp_path / "conf.yaml"))
    assert r.returncode == 2 and "give exactly one of ENGINE or --config" in r.stderr
    r = _cli("no-such-engine")
    assert r.returncode == 2 and "unknown engine 'no-such-engine'" in r.stdout


def test_shipped_example_program_conforms() -> None:
    """protocols/command-example.yaml's candidate: {programs}/builtin_engine.py."""
    report = check_arm(ROOT / "protocols" / "command-example.yaml", "candidate", seeds=2)
    report.assert_ok()
    assert statuses(report)["same seeds [candidate]"] == "pass"


# ----------------------------------------------------------------------------- shipped programs
SHIPPED = [  # (engine, protocol, arm, failing checks, checks that may go either way): LOG h21
    ("openvino", "openvino-null", "candidate", set(), set()),
    ("openvino", "openvino-spec", "reference", set(), set()),
    # OpenVINO GenAI 2026.4.1.0's speculative pipeline replays only 83.3 % of sequences from
    # rng_seed (results/LOG.md), so each replay check over 6 rows (3 seeds) passes about
    # 0.833**6 = 1/3 of the time: "same seeds" passed on the project's CI (2026-12-01) and failed
    # here. Either may go either way; every other check must pass.
    ("openvino", "openvino-spec", "candidate",
     set(), {"same seeds [candidate]", "batch composition [candidate]"}),
    ("mistralrs", "mistralrs-spec", "candidate", set(), set()),  # seeds "ignored": not reproducible
    ("mlx", "mlx-spec", "candidate", set(), set()),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "protocol", "arm", "failing", "either"), SHIPPED,
                         ids=[f"{c[1]}-{c[2]}" for c in SHIPPED])  # fmt: skip
def test_shipped_engine_programs(
    engine: str, protocol: str, arm: str, failing: set, either: set
) -> None:
    """Opt-in: only where ``spectest setup ENGINE`` already made the venv (no install here)."""
    if venv_engines.switched_off() or not venv_engines.ready(engine):
        pytest.skip(venv_engines.skip_reason(engine) or f"run `spectest setup {engine}` first")
    report = check_arm(ROOT / "protocols" / f"{protocol}.yaml", arm, seeds=3)
    got = {k for k, v in statuses(report).items() if v == "fail"}
    assert failing <= got <= failing | either, "\n".join(report.lines())
    if engine == "mistralrs":
        assert statuses(report)[f"same seeds [{arm}]"] == "not reproducible"
    else:
        assert report.ran and not any(r.infrastructure for r in report.results)
