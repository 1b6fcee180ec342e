"""The engine sections of a protocol (version 1's ``engine``, version 2's ``engines``), the
``candidate: acceptor:SPEC`` shorthand and the floor arm with its rule.

The why and the details: docs/internals.md "spectest/protocol/engine_sections.py".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError
from spectest.protocol.fields import Fields
from spectest.protocol.spec import (
    ACCEPTOR_PREFIX,
    ENGINES_CANDIDATE,
    ENGINES_REFERENCE,
    FLOOR_ORDERS,
    FLOOR_SHAPES,
    FLOOR_TEACHER,
    EngineChoice,
    FloorSpec,
    Protocol,
)

MAX_BATCH_SIZE = 2**20  # rows per engine batch (an engine may allocate per batch row)


def engines(
    c: Fields, top: Mapping[str, Any], version: int, candidate: str, base_dir: Path | None
) -> tuple[EngineChoice, EngineChoice, str]:
    """The reference and candidate engines (and the candidate string as hashed): version 1's
    ``engine`` mapping or version 2's ``engines``, and the ``acceptor:`` shorthand."""
    if version == 1:
        raw, prefix = _v1_engines(c, top), "engine"
    else:
        if "engine" in top:
            raise c.fail("engine", "is version 1's form: version 2 uses 'engines'")
        raw = {"reference": "builtin", "candidate": "builtin"}
        raw.update(c.mapping(top.get("engines", {}) or {}, "engines", ("reference", "candidate")))
        prefix = "engines"
    prefix_c = f"{prefix}.candidate"
    if candidate.startswith(ACCEPTOR_PREFIX):
        cand_raw = raw["candidate"]
        if cand_raw != "builtin":
            raise c.fail(
                "candidate",
                f"{candidate!r} selects the acceptor engine, but {prefix}.candidate is "
                f"{cand_raw!r}",
            )
        raw["candidate"] = {"name": "acceptor", "kernel": candidate[len(ACCEPTOR_PREFIX) :]}
        prefix_c = "candidate"
        if version != 1:  # version 2 hashes the engine; the candidate variant is then 'exact'
            candidate = "exact"
    reference = _engine_choice(c, raw["reference"], f"{prefix}.reference", base_dir)
    return reference, _engine_choice(c, raw["candidate"], prefix_c, base_dir), candidate


def floor(
    c: Fields, value: Any, reference: EngineChoice, batch_size: int, base_dir: Path | None
) -> FloorSpec | None:
    """``arms.floor``: the floor arm's engine (``reference`` by default), exactly
    one other shape and the margin (``spec.FloorSpec``); None when absent."""
    import json

    from spectest.stats.token_floor import DEFAULT_TOKEN_MARGIN

    if value is None:
        return None
    arms = c.mapping(value, "arms", ("floor",))
    if arms.get("floor") is None:
        return None
    keys = ("engine", "margin", *FLOOR_SHAPES, FLOOR_TEACHER, "sequences")
    f = c.mapping(arms["floor"], "arms.floor", keys)
    # with teacher_forced, batch_size is the teacher's batch shape, not a floor arm's
    shapes = [k for k in (*FLOOR_SHAPES, FLOOR_TEACHER) if k in f]
    if FLOOR_TEACHER in f and "batch_size" in f:
        shapes.remove("batch_size")
    if len(shapes) != 1:
        got = " and ".join(shapes) if shapes else "none"
        raise c.fail(
            "arms.floor",
            "name exactly one shape: batch_size, concurrency or order, or teacher_forced: true "
            f"(got {got})",
        )
    raw: list[tuple[str, Any]] = []
    engine, eng = reference, f.get("engine", "reference")
    if eng != "reference":
        engine = _engine_choice(c, eng, "arms.floor.engine", base_dir)
        raw.append(("engine", json.dumps(engine.canonical(), sort_keys=True)))
    else:
        raw.append(("engine", "reference"))
    teacher = None
    if shapes[0] == FLOOR_TEACHER:
        order, (teacher, size) = None, _teacher(c, f, engine, raw)
    else:
        if "sequences" in f:
            raise c.fail("arms.floor.sequences", "only with teacher_forced: true")
        engine, size, order, entry = _floor_shape(c, f, shapes[0], engine, batch_size)
        raw.append(entry)
    margin = DEFAULT_TOKEN_MARGIN
    if "margin" in f:
        margin = c.float_(f["margin"], "arms.floor.margin", lambda x: 0 < x < 1, "in (0, 1)")
        raw.append(("margin", margin))
    return FloorSpec(engine, size, order, margin, tuple(raw), teacher)


def _teacher(
    c: Fields, f: Mapping[str, Any], engine: EngineChoice, raw: list[tuple[str, Any]]
) -> tuple[int, int | None]:
    """``teacher_forced: true`` (and ``sequences``, the most sequences per cell forced;
    ``batch_size``, the rows per forward the laws are computed at): the engine must answer "its
    plain law at a prefix" (``engines.plain_laws``), else exit 2. Returns (sequences, batch
    size or None: the default, docs/numerics.md "The teacher's batch shape")."""
    from spectest.engines.plain_laws import refusal
    from spectest.stats.teacher_forced import DEFAULT_SEQUENCES

    if not c.bool_(f[FLOOR_TEACHER], "arms.floor.teacher_forced"):
        raise c.fail("arms.floor.teacher_forced", "only true is meaningful (or leave it out)")
    why = refusal(engine.name, engine.options)
    if why is not None:
        raise c.fail("arms.floor.teacher_forced", why)
    raw.append((FLOOR_TEACHER, True))
    n = DEFAULT_SEQUENCES
    if "sequences" in f:
        n = c.int_(f["sequences"], "arms.floor.sequences", lo=2)
        raw.append(("sequences", n))
    size = None
    if "batch_size" in f:
        if engine.name == "http":
            raise c.fail(
                "arms.floor.batch_size",
                "with teacher_forced, only for an engine spectest runs in process (a server's "
                "laws come one request per prefix)",
            )
        size = c.int_(f["batch_size"], "arms.floor.batch_size", lo=1, hi=MAX_BATCH_SIZE)
        raw.append(("batch_size", size))
    return n, size


def _floor_shape(
    c: Fields, f: Mapping[str, Any], shape: str, engine: EngineChoice, batch_size: int
) -> tuple[EngineChoice, int | None, str | None, tuple[str, Any]]:
    """The floor arm's one shape: (its engine, batch size, order, the hashed entry); a shape
    equal to the reference's is refused."""
    import dataclasses

    same = "the floor arm must differ from the reference in shape"
    if shape == "batch_size":
        size = c.int_(f[shape], "arms.floor.batch_size", lo=1, hi=MAX_BATCH_SIZE)
        if size == batch_size:
            raise c.fail("arms.floor.batch_size", f"{size} is the protocol's batch_size: {same}")
        return engine, size, None, (shape, size)
    if shape == "concurrency":
        n = c.int_(f[shape], "arms.floor.concurrency", lo=1)
        if not hasattr(engine.options, "concurrency"):
            raise c.fail(
                "arms.floor.concurrency",
                f"engine {engine.name!r} has no concurrency option (use batch_size or order)",
            )
        if n == engine.options.concurrency:
            raise c.fail("arms.floor.concurrency", f"{n} is the engine's own concurrency: {same}")
        options = dataclasses.replace(engine.options, concurrency=n)
        return EngineChoice(engine.name, options, engine.uses_variant), None, None, (shape, n)
    order = c.str_(f[shape], "arms.floor.order", FLOOR_ORDERS)
    return engine, None, order, (shape, order)


def _v1_engines(c: Fields, top: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1's closed ``engine`` mapping as version 2's raw ``engines``."""
    if "engines" in top:
        raise c.fail("engines", "needs version: 2 (version 1 names engines under 'engine')")
    e = c.mapping(
        top.get("engine", {}) or {},
        "engine",
        ("reference", "candidate", "assistant_confidence_threshold"),
    )
    raw: dict[str, Any] = {
        "reference": c.str_(e.get("reference", "builtin"), "engine.reference", ENGINES_REFERENCE),
        "candidate": c.str_(e.get("candidate", "builtin"), "engine.candidate", ENGINES_CANDIDATE),
    }
    thr = c.float_(
        e.get("assistant_confidence_threshold", 0.0),
        "engine.assistant_confidence_threshold",
        lambda x: 0.0 <= x < 1.0,
        "in [0, 1)",
    )
    if raw["candidate"] == "hf-assisted":
        raw["candidate"] = {"name": "hf-assisted", "assistant_confidence_threshold": thr}
    elif thr != 0.0:
        raise c.fail(
            "engine.assistant_confidence_threshold",
            f"only meaningful with candidate: hf-assisted, got {thr!r}",
        )
    return raw


def _engine_choice(c: Fields, value: Any, path: str, base_dir: Path | None) -> EngineChoice:
    """``NAME`` or ``{name: NAME, OPTION: VALUE...}`` → ``EngineChoice`` (options parsed by the
    engine class, messages naming the file and ``path``)."""
    from spectest.engines.registry import engine_class

    body = {"name": value} if isinstance(value, str) else value
    if not isinstance(body, Mapping):
        raise c.fail(path, f"expected an engine name or a mapping with 'name', got {value!r}")
    if "name" not in body:
        raise c.fail(f"{path}.name", "required field is missing")
    m = dict(body)
    name = c.str_(m.pop("name"), f"{path}.name")
    try:
        cls = engine_class(name)
    except ConfigError as err:
        raise c.fail(f"{path}.name", str(err)) from None
    options = cls.parse_options(m, f"{c.source}: {path}", base_dir)
    return EngineChoice(name, options, cls.uses_variant)


def check_floor_arm(c: Fields, protocol: Protocol) -> None:
    """A floor arm decides claim (b) from tokens: not beside matched mode (which decides it
    from logits), and its engine must plain-decode (``check_protocol`` as a reference)."""
    from spectest.engines.registry import engine_class

    if protocol.numerics_mode == "matched":
        raise c.fail(
            "arms.floor",
            "tests.numerics resolves to 'matched', which decides claim (b) from the logits "
            "itself: set tests.numerics: exact to decide it from the floor arm's tokens",
        )
    assert protocol.floor is not None
    e = protocol.floor.engine
    rule = engine_class(e.name).check_protocol(
        e.options,
        role="reference",
        variant="exact",
        drafter_kind=protocol.drafter.kind,
        drafter_q=protocol.drafter.q_mode,
    )
    if rule is not None:
        raise c.fail("arms.floor.engine", f"{rule[0]}: {rule[1]}")
