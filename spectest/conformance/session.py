"""What ``spectest conformance`` runs and reports: its small jobs (``Workload``), its results
(``CheckResult``, ``ConformanceReport``) and one engine instance through every check
(``_Session``: per-role jobs, output, early stops, rounds, progress, white-box, seeds, provenance
and close). What each check requires: docs/conformance.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spectest.engines.base import (
    PLACEHOLDER_TOKEN_ID,
    ROUNDS_COLUMNS,
    ArmJob,
    ArmOutput,
    DrafterSpec,
    Engine,
    Models,
    RowSpec,
    check_output,
    samples_frame,
)
from spectest.errors import ExitCode, SpectestError
from spectest.sampling.params import SamplingParams

Status = Literal["pass", "fail", "skip", "not reproducible"]
CHECKS = (
    "class",
    "options",
    "needs",
    "output",
    "early stop",
    "rounds",
    "progress",
    "white-box",
    "same seeds",
    "batch composition",
    "provenance",
    "close",
)
DEFAULT_TARGET = "bundled:target"
DEFAULT_DRAFT = "bundled:draft"
DEFAULT_PROMPT = (1, 2, 3)  # ids every vocabulary has (a protocol's arm: its first prompt)
DEFAULT_CONFIGS = (
    ("t0.8-p0.9", SamplingParams(temperature=0.8, top_p=0.9)),
    ("t1.2-k8", SamplingParams(temperature=1.2, top_k=8)),
)  # one filter each: engines whose filter order cannot be set accept them
RUN_KEY = 20_261_201
UNKNOWN_KEY = "no_such_option_conformance"


@dataclass(frozen=True)
class CheckResult:
    """One check: its name (``CHECKS``), where it ran (a role, or ``""``), status and detail."""

    name: str
    status: Status
    detail: str = ""
    role: str = ""
    infrastructure: bool = False  # failed because the engine's process or server could not run

    def line(self) -> str:
        where = f" [{self.role}]" if self.role else ""
        return f"{self.status.upper():<5} {self.name}{where}" + (
            f": {self.detail}" if self.detail else ""
        )


@dataclass(frozen=True)
class ConformanceReport:
    """Every check of one engine; ``ok`` when none failed."""

    engine: str
    results: tuple[CheckResult, ...]

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def ran(self) -> bool:
        """Whether any job ran (every role may be refused by the engine's ``check_protocol``)."""
        return any(r.name == "output" for r in self.results)

    @property
    def exit_code(self) -> int:
        if self.ok:
            return int(ExitCode.OK if self.ran else ExitCode.INCONCLUSIVE)
        if any(r.infrastructure for r in self.failures):
            return int(ExitCode.INFRASTRUCTURE)
        return int(ExitCode.BAD_INPUT)

    def headline(self) -> str:
        n = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        unrep = any(r.status == "not reproducible" for r in self.results)
        tail = f"{n['pass']} passed, {n['skip']} skipped" + (
            "; rows are not reproducible from their seeds (the engine says so)" if unrep else ""
        )
        if self.ok and not self.ran:
            return f"INCONCLUSIVE (exit 3): engine {self.engine}: no job ran ({tail})"
        if self.ok:
            return f"CONFORMS (exit 0): engine {self.engine} honours the contract: {tail}"
        return (
            f"DOES NOT CONFORM (exit {self.exit_code}): engine {self.engine}: "
            f"{n['fail']} check(s) failed, {tail}"
        )

    def lines(self) -> list[str]:
        return [r.line() for r in self.results] + [self.headline()]

    def assert_ok(self) -> None:
        """For a plug-in's own pytest: ``AssertionError`` listing every line unless ok."""
        if not self.ok:
            raise AssertionError("\n".join(self.lines()))


class _Failed(Exception):
    """A check failed; carries its result."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.detail)
        self.result = result


@dataclass(frozen=True)
class Workload:
    """The small jobs every role runs: one prompt, configs × seeds rows, T positions."""

    prompt: tuple[int, ...] = DEFAULT_PROMPT
    configs: tuple[tuple[str, SamplingParams], ...] = DEFAULT_CONFIGS
    seeds: int = 4
    positions: int = 5
    drafter: DrafterSpec = dataclasses.field(
        default_factory=lambda: DrafterSpec(onehot=False, q_mode="processed", k=3)
    )

    def rows(self) -> tuple[RowSpec, ...]:
        return tuple(
            RowSpec(cid, 1000 + s, sp) for cid, sp in self.configs for s in range(self.seeds)
        )


class _Session:
    """One engine instance (built on the models it declares, as a run shares one per engine
    choice) through every role's jobs, then its provenance and close."""

    def __init__(
        self,
        cls: type[Engine],
        options: Any,
        models: Models,
        work: Workload,
        results: list[CheckResult],
    ) -> None:
        self.cls, self.options, self.models = cls, options, models
        self.work, self.results = work, results
        assert models.target is not None, "conformance needs a target model (its vocabulary)"
        self.vocab = int(models.target.vocab_size)
        self.engine: Engine | None = None

    def add(
        self, name: str, status: Status, detail: str = "", role: str = "", infra: bool = False
    ) -> None:
        self.results.append(CheckResult(name, status, detail, role, infra))

    def variant(self, role: str) -> str | None:
        return "exact" if role == "candidate" and self.cls.uses_variant else None

    def admitted(self, role: str) -> bool:
        d = self.work.drafter
        refusal = self.cls.check_protocol(
            self.options, role=role, variant="exact", drafter_kind=d.kind, drafter_q=d.q_mode
        )
        if refusal is not None:
            self.add(
                "needs", "skip", f"the engine refuses the role: {refusal[0]}: {refusal[1]}", role
            )
        return refusal is None

    def build(self, roles: Sequence[str], strict: bool) -> Engine:
        """The engine on the models it declares (``strict``) or on the whole pair."""
        m = self.models
        if strict:
            draft = any(self.cls.needs_draft(self.variant(r)) for r in roles)
            m = Models(m.target if self.cls.needs != "none" else None, m.draft if draft else None)
        return _call(lambda: self.cls(self.options, m), "__init__")

    def run(self, roles: Sequence[str]) -> None:
        from spectest.engines import children

        before = {id(c) for c in children.live()}
        admitted = [r for r in roles if self.admitted(r)]
        try:
            self.engine = self.build(admitted, strict=True)
            for role in admitted:
                self.role(role, admitted)
        except SpectestError as err:
            self.add(
                "needs", "fail", f"the engine cannot be built: {err}", infra=err.exit_code == 4
            )
        finally:
            if self.engine is not None:
                self.finish(before)

    def job(
        self, role: str, rows: Sequence[RowSpec], batch: int, whitebox: bool = False
    ) -> tuple[ArmJob, list[int]]:
        ticks: list[int] = []
        w = self.work
        job = ArmJob(
            role,
            role,
            self.variant(role),
            "p0",
            w.prompt,
            tuple(rows),
            w.positions,
            RUN_KEY,
            batch,
            w.drafter,
            whitebox,
            ticks.append,
        )
        return job, ticks

    def generate(self, job: ArmJob) -> ArmOutput:
        assert self.engine is not None
        out = _call(lambda: self.engine.generate(job), "generate")  # type: ignore[union-attr]
        check_output(out, job, self.vocab, self.cls.name)
        return out

    def first(self, role: str, roles: Sequence[str], job: ArmJob) -> ArmOutput | None:
        """The role's first job: ``needs``, then ``output``; None when it cannot go on."""
        try:
            out = self.generate(job)
            self.add("needs", "pass", f"ran on the declared models (needs {self.cls.needs})", role)
        except SpectestError as err:
            if err.exit_code == 4:
                self.add("output", "fail", str(err), role, infra=True)
                return None
            try:  # the whole pair: does it run when given what it did not declare?
                full = self.build(roles, strict=False)
                out = _call(lambda: full.generate(job), "generate")
            except SpectestError:
                self.add("output", "fail", str(err), role, infra=err.exit_code == 4)
                return None
            self.add(
                "needs",
                "fail",
                f"declares needs {self.cls.needs!r} but fails without the "
                f"models it did not declare: {err}",
                role,
            )
            assert self.engine is not None
            self.engine.close()
            self.engine = full
            try:
                check_output(out, job, self.vocab, self.cls.name)
            except SpectestError as err2:
                self.add("output", "fail", str(err2), role)
                return None
        B, T = out.tokens.shape
        self.add("output", "pass", f"int64 [{B}, {T}], ids in [0, {self.vocab})", role)
        return out

    def role(self, role: str, roles: Sequence[str]) -> None:
        rows = self.work.rows()
        job, ticks = self.job(role, rows, len(rows))
        out = self.first(role, roles, job)
        if out is None:
            return
        self.outcome("early stop", role, lambda: _early_stop(out, job))
        self.outcome("rounds", role, lambda: _rounds_check(out, job, self.cls.rounds))
        self.outcome("progress", role, lambda: _progress_check(ticks, len(rows)))
        self.whitebox(role, rows, out)
        self.seeds(role, rows, job, out)

    def outcome(self, name: str, role: str, fn: Callable[[], str]) -> None:
        try:
            self.add(name, "pass", fn(), role)
        except (_Mismatch, SpectestError) as err:
            self.add(name, "fail", str(err), role, infra=getattr(err, "exit_code", 2) == 4)

    def whitebox(self, role: str, rows: Sequence[RowSpec], out: ArmOutput) -> None:
        if self.cls.whitebox in ("tokens", "none"):
            why = (
                "tokens only: a run's shared teacher forces them"
                if self.cls.whitebox == "tokens"
                else "the engine gives no white-box columns"
            )
            self.add("white-box", "skip", f"whitebox = {self.cls.whitebox!r}: {why}", role)
            return
        job, _ = self.job(role, rows, len(rows), whitebox=True)

        def run() -> str:
            from spectest import schema

            got = self.generate(job)
            wb = got.whitebox
            if wb is None:
                raise _Mismatch("asked for white-box columns, got none")
            missing = [c for c in schema.WHITEBOX_COLUMNS if c not in wb.columns]
            if missing:
                raise _Mismatch(f"white-box columns missing: {missing}")
            if self.engine is not None and self.engine.seeds_claim() != "ignored":
                _same_tokens(out, got, rows, rows, "asking for white-box columns changed")
            return f"{len(wb)} rows of {', '.join(schema.WHITEBOX_COLUMNS)}"

        self.outcome("white-box", role, run)

    def seeds(self, role: str, rows: Sequence[RowSpec], job: ArmJob, out: ArmOutput) -> None:
        assert self.engine is not None
        claim = self.engine.seeds_claim()
        if claim == "ignored":
            note = "the engine says its rows are not reproducible from their seeds"
            self.add("same seeds", "not reproducible", note, role)
            self.add("batch composition", "not reproducible", note, role)
            return
        self.outcome(
            "same seeds",
            role,
            lambda: _same_tokens(out, self.generate(job), rows, rows, "the same job twice gave"),
        )
        if claim == "per job":
            self.add(
                "batch composition",
                "skip",
                "the engine declares seeds per job (a row's tokens may depend on its batch)",
                role,
            )
            return
        flipped = list(reversed(rows))
        job2, _ = self.job(role, flipped, max(1, len(rows) // 3))
        self.outcome(
            "batch composition",
            role,
            lambda: _same_tokens(
                out,
                self.generate(job2),
                rows,
                flipped,
                f"the rows reversed in batches of {job2.batch_size} gave",
            ),
        )

    def finish(self, before: set[int]) -> None:
        from spectest.engines import children

        engine = self.engine
        assert engine is not None

        def prov() -> str:
            p = _call(engine.provenance, "provenance")
            text = json.dumps(p)
            if not isinstance(p, dict) or p.get("name") != self.cls.name:
                raise _Mismatch(f"expected a mapping with name {self.cls.name!r}, got {text[:200]}")
            return text[:200]

        def close() -> str:
            _call(engine.close, "close")
            left = [c for c in children.live() if id(c) not in before]
            if left:
                raise _Mismatch(f"{len(left)} child process(es) still running after close()")
            return "no child process left running"

        self.outcome("provenance", "", prov)
        self.outcome("close", "", close)


class _Mismatch(Exception):
    """A check's finding (its message is the detail)."""


def _call(fn: Callable[[], Any], method: str) -> Any:
    """A plug-in's method, contained: whatever it lets escape is one ``EngineError`` line."""
    from spectest.contain import contained, escape_reason

    return contained(lambda err: f"{method}() {escape_reason(err)}", fn)


def _same_tokens(
    a: ArmOutput, b: ArmOutput, rows_a: Sequence[RowSpec], rows_b: Sequence[RowSpec], what: str
) -> str:
    """Every (config, seed) row of ``a`` has the same tokens in ``b``."""
    where = {(r.config_id, r.seed): i for i, r in enumerate(rows_b)}
    for i, r in enumerate(rows_a):
        j = where[(r.config_id, r.seed)]
        if not np.array_equal(a.tokens[i], b.tokens[j]):
            raise _Mismatch(
                f"{what} other tokens for row (config {r.config_id}, seed {r.seed}): "
                f"{a.tokens[i].tolist()} then {b.tokens[j].tolist()}"
            )
    return f"{len(rows_a)} rows equal"


def _early_stop(out: ArmOutput, job: ArmJob) -> str:
    from spectest.stats.histograms import validate_samples

    ended = int((out.tokens[:, -1] == PLACEHOLDER_TOKEN_ID).sum())
    validate_samples(samples_frame(out.tokens, job.prompt_id, job.rows, job.arm))
    if not ended:
        return "no sequence ended early (the -1 suffix rule holds)"
    return f"{ended} of {len(job.rows)} sequences ended early: shorter sequences of a valid table"


def _rounds_check(out: ArmOutput, job: ArmJob, declared: str) -> str:
    r = out.rounds
    if r is None:
        return f"none returned (rounds = {declared!r})"
    if declared == "none":
        raise _Mismatch("returned rounds but declares rounds = 'none'")
    if out.rounds_tested != (declared == "tested"):
        raise _Mismatch(f"rounds_tested = {out.rounds_tested} but declares rounds = {declared!r}")
    # a readout may aggregate (OpenVINO's program reports a request's totals as one entry): the
    # per-round bound emitted <= accepted + 1 applies to tested rounds only
    tested = out.rounds_tested
    lengths = (out.tokens != PLACEHOLDER_TOKEN_ID).sum(axis=1)
    for row in range(len(job.rows)):
        g = r[r["row"] == row]
        if g.empty:
            continue
        c = {k: g[k].to_numpy() for k in ROUNDS_COLUMNS}
        where = f"row {row} (seed {job.rows[row].seed})"
        starts = np.concatenate([[0], np.cumsum(c["emitted"])[:-1]])
        problems = [
            (not np.array_equal(c["round"], np.arange(len(g))), "rounds not numbered 0..n-1"),
            (
                not np.array_equal(c["position"], starts),
                "a round's position is not the tokens emitted before it",
            ),
            (bool((c["accepted"] > c["drafted"]).any()), "accepted > drafted"),
            (tested and bool((c["emitted"] > c["accepted"] + 1).any()), "emitted > accepted + 1"),
            (
                int(c["emitted"].sum()) != int(lengths[row]),
                f"emitted counts sum to {int(c['emitted'].sum())}, the row has {int(lengths[row])} "
                "tokens",
            ),
        ]
        for bad, what in problems:
            if bad:
                raise _Mismatch(f"{where}: {what}: {g[list(ROUNDS_COLUMNS)].to_dict('list')}")
    kind = "tested" if out.rounds_tested else "readout"
    return f"{len(r)} rounds over {r['row'].nunique()} rows, consistent ({kind})"


def _progress_check(ticks: list[int], n: int) -> str:
    if not ticks:
        return "never ticked (a run's progress bar stays still; allowed)"
    if any(b < a for a, b in itertools.pairwise(ticks)) or ticks[-1] > n or ticks[0] < 0:
        raise _Mismatch(f"ticks must be non-decreasing counts in [0, {n}], got {ticks[:20]}")
    return f"{len(ticks)} ticks, last {ticks[-1]} of {n}"
