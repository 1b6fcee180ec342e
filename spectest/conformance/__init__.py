"""``spectest conformance``: does an engine honour the engine contract (``engines.base``)? The
checks (``CHECKS``), run on small jobs of real models (``check``, ``check_arm``), and their report.
Knows nothing about statistics. What each check requires: docs/conformance.md. Why and details:
docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spectest.conformance.session import (
    CHECKS,
    DEFAULT_CONFIGS,
    DEFAULT_DRAFT,
    DEFAULT_PROMPT,
    DEFAULT_TARGET,
    RUN_KEY,
    UNKNOWN_KEY,
    CheckResult,
    ConformanceReport,
    Status,
    Workload,
    _Failed,
    _Session,
)
from spectest.engines.base import (
    NEEDS,
    ROUNDS_KINDS,
    SEEDS_KINDS,
    WHITEBOX_KINDS,
    Engine,
    Models,
    options_dict,
)
from spectest.errors import ConfigError, SpectestError

__all__ = [
    "CHECKS",
    "DEFAULT_CONFIGS",
    "DEFAULT_DRAFT",
    "DEFAULT_PROMPT",
    "DEFAULT_TARGET",
    "RUN_KEY",
    "CheckResult",
    "ConformanceReport",
    "Status",
    "Workload",
    "check",
    "check_arm",
    "protocol_arm",
]


def check(
    engine: str | type[Engine],
    options: Mapping[str, Any] | Any = None,
    *,
    models: Models | None = None,
    target: str = DEFAULT_TARGET,
    draft: str = DEFAULT_DRAFT,
    device: str = "cpu",
    dtype: str | None = None,
    workload: Workload | None = None,
    roles: Sequence[str] = ("reference", "candidate"),
    base_dir: Path | None = None,
) -> ConformanceReport:
    """Run every check on ``engine`` (a registered name, or an ``Engine`` subclass not
    registered yet) with ``options`` (the protocol's mapping for ``engines.<arm>`` minus
    ``name``, or already parsed ``Options``). ``models``: the pair to run on (default: ``target``
    and ``draft`` loaded from the zoo, as ``spectest run`` loads them)."""
    from spectest.models.zoo import load_pair

    work = workload or Workload()
    results: list[CheckResult] = []
    label = engine if isinstance(engine, str) else getattr(engine, "name", "") or repr(engine)
    try:
        cls = _run_check(results, "class", lambda: _class_check(engine))
        opts = _run_check(results, "options", lambda: _options_check(cls, options, base_dir))
    except _Failed:
        return ConformanceReport(label, tuple(results))
    if models is None:
        t, d = load_pair(target, draft, device=device, dtype=dtype, seed=0)
        models = Models(t, d)
    assert models.target is not None, "conformance needs the target (its vocabulary)"
    V = int(models.target.vocab_size)
    if not work.prompt or any(not 0 <= i < V for i in work.prompt):
        raise ConfigError(f"conformance: prompt ids {list(work.prompt)} are not ids in [0, {V})")
    _Session(cls, opts, models, work, results).run(roles)
    return ConformanceReport(label, tuple(results))


def check_arm(path: str | Path, arm: str = "candidate", *, seeds: int = 4) -> ConformanceReport:
    """``check`` on the engine of a protocol's ``reference`` or ``candidate`` arm, with what a
    run gives it (``protocol_arm``), on ``seeds`` seeds per config."""
    a = protocol_arm(path, arm, seeds)
    return check(
        a.choice.name,
        a.choice.options,
        models=a.models,
        workload=a.work,
        roles=(arm,),
        base_dir=Path(a.protocol.source).parent,
    )


@dataclasses.dataclass(frozen=True)
class ProtocolArm:
    """A protocol's arm as a run gives it to its engine (``protocol_arm``)."""

    protocol: Any  # protocol.Protocol
    choice: Any  # its engines.<arm> (protocol.EngineChoice)
    models: Models
    work: Workload  # the first prompt, the configs, positions and drafter; ``seeds`` seeds


def protocol_arm(path: str | Path, arm: str, seeds: int) -> ProtocolArm:
    """The engine, models and job of the protocol's ``reference`` or ``candidate`` arm: its
    options, models, first prompt, configs, positions and drafter; ``seeds`` seeds per config."""
    from spectest.generation import load_models
    from spectest.prompts import prompt_token_ids
    from spectest.protocol import load_protocol

    if arm not in ("reference", "candidate"):
        raise ConfigError(f"--arm must be reference or candidate, got {arm!r}")
    if isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"--seeds: expected an integer >= 1, got {seeds!r}")
    p = load_protocol(path)
    models = load_models(p)
    assert models.target is not None
    ids = prompt_token_ids(p, models.target.vocab_size, (models.target, models.draft))
    prompt = tuple(next(iter(ids.values())))
    work = Workload(prompt, tuple(p.configs), seeds, p.positions, p.drafter)
    choice = p.reference_engine if arm == "reference" else p.candidate_engine
    return ProtocolArm(p, choice, models, work)


def _run_check(results: list[CheckResult], name: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` as check ``name``: pass (its value returned) or fail (``_Failed`` raised)."""
    try:
        value = fn()
    except _Failed as f:
        results.append(f.result)
        raise
    except SpectestError as err:
        res = CheckResult(name, "fail", str(err), infrastructure=err.exit_code == 4)
        results.append(res)
        raise _Failed(res) from None
    results.append(CheckResult(name, "pass", value[1] if isinstance(value, tuple) else ""))
    return value[0] if isinstance(value, tuple) else value


def _class_check(engine: str | type[Engine]) -> tuple[type[Engine], str]:
    from spectest.engines.registry import engine_class, target_of

    cls = engine_class(engine) if isinstance(engine, str) else engine
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ConfigError(f"{cls!r} is not a spectest Engine subclass")
    bad = [
        f"{attr} = {getattr(cls, attr)!r} (expected one of {allowed})"
        for attr, allowed in (
            ("needs", NEEDS),
            ("whitebox", WHITEBOX_KINDS),
            ("rounds", ROUNDS_KINDS),
            ("seeds", SEEDS_KINDS),
        )
        if getattr(cls, attr) not in allowed
    ]
    if not isinstance(cls.name, str) or not cls.name:
        bad.append(f"name = {cls.name!r} (expected the registry name)")
    if not isinstance(cls.uses_variant, bool):
        bad.append(f"uses_variant = {cls.uses_variant!r} (expected true or false)")
    mb = cls.max_batch
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
        bad.append(f"max_batch = {mb!r} (expected None or an integer >= 1)")
    o = cls.Options
    if not (dataclasses.is_dataclass(o) and o.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        bad.append("Options must be a frozen dataclass")
    else:
        try:
            o()
        except TypeError as err:
            bad.append(f"Options() needs a default for every field ({err})")
    if bad:
        raise ConfigError(f"engine {cls.name!r}: " + "; ".join(bad))
    where = target_of(cls.name) if isinstance(engine, str) else f"{cls.__module__}:{cls.__name__}"
    return (
        cls,
        f"{cls.name} ({where}): needs {cls.needs}, whitebox {cls.whitebox}, rounds "
        f"{cls.rounds}, seeds {cls.seeds}",
    )


def _options_check(cls: type[Engine], options: Any, base_dir: Path | None) -> tuple[Any, str]:
    where = f"engines.{cls.name}"
    if isinstance(options, cls.Options):
        opts = options
    else:
        raw = {k: v for k, v in dict(options or {}).items() if (k, v) != ("name", cls.name)}
        opts = cls.parse_options(raw, where, base_dir)
    canon = options_dict(opts)
    again = cls.parse_options(canon, where, base_dir)
    if again != opts:
        raise ConfigError(
            f"{where}: the canonical options {canon!r} parse to {again!r}, not {opts!r} "
            "(a stored protocol would not run the same engine)"
        )
    try:
        cls.parse_options({**canon, UNKNOWN_KEY: 1}, where, base_dir)
    except ConfigError as err:
        if UNKNOWN_KEY not in str(err):
            raise ConfigError(
                f"{where}: an unknown key was refused without naming it: {err}"
            ) from None
    else:
        raise ConfigError(f"{where}: the unknown key {UNKNOWN_KEY!r} was accepted")
    return opts, f"{json.dumps(canon, default=str)[:200]}"
