"""Parsing: a raw mapping (the YAML as read) → one validated ``Protocol`` (``protocol_from_dict``,
one parse function per section, ``check_rules`` across sections).

The why and the details: docs/internals.md "spectest/protocol/parse.py".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectest.engines.base import DrafterSpec
from spectest.errors import ConfigError
from spectest.models.dtypes import DTYPES
from spectest.prompts import PromptsSpec, is_name, load_prompt_set
from spectest.protocol.budget import check_budget
from spectest.protocol.engine_sections import MAX_BATCH_SIZE, check_floor_arm, engines
from spectest.protocol.engine_sections import floor as floor_arm
from spectest.protocol.fields import Fields, real
from spectest.protocol.spec import (
    ACCEPTOR_PREFIX,
    DEVICES,
    LIMITS_FIELD,
    MATCHABLE_ENGINES,
    NULL_ENGINES,
    PROTOCOL_VERSIONS,
    SAMPLING_KEYS,
    LimitsSpec,
    ModelsSpec,
    Protocol,
    SeedsSpec,
    TeethSpec,
)
from spectest.sampling.params import SamplingParams
from spectest.schema import DRAFTER_KINDS, Q_MODES
from spectest.sequential import SPENDING
from spectest.stats.options import AnalysisOptions, OptionError, options, yaml_paths
from spectest.tooth_size import DEFAULT_BUDGET as DEFAULT_SIZE_BUDGET

TOP_KEYS = (
    "version",
    "name",
    "description",
    "models",
    "drafter",
    "prompts",
    "configs",
    "seeds",
    "positions",
    "candidate",
    "tests",
    "teeth",
    "output",
    "batch_size",
    "engine",
    "engines",
    "limits",
    "arms",
)
REQUIRED = ("version", "name", "models", "drafter", "prompts", "configs", "seeds", "positions")
OPTIONS = dict(options())  # a test setting → its ``stats.options.Option``
MODEL_PREFIXES = (
    "toy:",
    "hf-preset:",
    "realistic:",
    "hf-local:",
    "bundled:",
    "derived:",
    "fixture:",
)


def protocol_from_dict(
    raw: Any, *, source: str = "<protocol>", base_dir: Path | None = None
) -> Protocol:
    """Validate a raw mapping (as ``yaml.safe_load`` returns it) into a ``Protocol``: each
    section in the file's order, then the rules across sections (``check_rules``)."""
    c = Fields(source)
    top = c.mapping(raw, "", allowed=TOP_KEYS, required=REQUIRED)
    version = c.int_(top["version"], "version")
    if version not in PROTOCOL_VERSIONS:
        raise c.fail(
            "version",
            f"unsupported protocol version {version!r} (this spectest reads "
            f"{', '.join(map(str, PROTOCOL_VERSIONS))})",
        )
    name = c.name(top["name"], "name")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise c.fail("description", f"expected a string, got {description!r}")
    models = _models(c, top["models"], base_dir)
    drafter = _drafter(c, top["drafter"])
    prompts = _prompts(c, top["prompts"], base_dir)
    configs = _configs(c, top["configs"])
    seeds = _seeds(c, top["seeds"], name)
    positions = c.int_(top["positions"], "positions", lo=1, hi=4096)
    candidate = _candidate(c, top.get("candidate", "exact"))
    tests = _tests(c, top.get("tests", {}))
    teeth = _teeth(c, top.get("teeth", {}))
    output = c.str_(top.get("output", "results"), "output")
    batch_size = c.int_(top.get("batch_size", 256), "batch_size", lo=1, hi=MAX_BATCH_SIZE)
    reference_engine, candidate_engine, candidate = engines(c, top, version, candidate, base_dir)
    floor = floor_arm(c, top.get("arms"), reference_engine, batch_size, base_dir)
    protocol = Protocol(
        version=version,
        name=name,
        description=description,
        models=models,
        drafter=drafter,
        prompts=prompts,
        configs=configs,
        seeds=seeds,
        positions=positions,
        candidate=candidate,
        tests=tests,
        teeth=teeth,
        output=output,
        batch_size=batch_size,
        source=source,
        reference_engine=reference_engine,
        candidate_engine=candidate_engine,
        limits=_limits(c, top.get("limits", {})),
        floor=floor,
    )
    check_rules(c, protocol)
    return protocol


def check_rules(c: Fields, protocol: Protocol) -> None:
    """The rules across sections, in this order: every mutant can bite under some config with
    this drafter, each engine accepts its role, the candidate's variant and the drafter
    (``Engine.check_protocol``), and the full plan fits ``limits.max_tokens`` (before any work)."""
    from spectest.engines.registry import engine_class

    _check_teeth_can_bite(c, protocol.teeth.mutants, protocol.configs, protocol.drafter)
    variant = "exact" if protocol.candidate.startswith(ACCEPTOR_PREFIX) else protocol.candidate
    for role, choice in (
        ("reference", protocol.reference_engine),
        ("candidate", protocol.candidate_engine),
    ):
        rule = engine_class(choice.name).check_protocol(
            choice.options,
            role=role,
            variant=variant,
            drafter_kind=protocol.drafter.kind,
            drafter_q=protocol.drafter.q_mode,
        )
        if rule is not None:
            raise c.fail(*rule)
    if protocol.tests.numerics == "matched" and (
        protocol.candidate_engine.name not in MATCHABLE_ENGINES
    ):
        raise c.fail(
            "tests.numerics",
            f"'matched' needs a candidate engine that hosts spectest's exact sampler in its own "
            f"loop ({', '.join(MATCHABLE_ENGINES)}), got {protocol.candidate_engine.name!r}: use "
            "'exact' (claim (a) is then the white-box route's; see docs/numerics.md)",
        )
    if protocol.floor is not None:
        check_floor_arm(c, protocol)
    check_budget(protocol)


# ----------------------------------------------------------------------------- sections
def _models(c: Fields, value: Any, base_dir: Path | None) -> ModelsSpec:
    m = c.mapping(value, "models", ("target", "draft", "dtype", "device"), ("target", "draft"))
    return ModelsSpec(
        target=_model_spec(c, m["target"], "models.target", base_dir),
        draft=_model_spec(c, m["draft"], "models.draft", base_dir),
        dtype=c.str_(m.get("dtype", "float32"), "models.dtype", DTYPES),
        device=c.str_(m.get("device", "cpu"), "models.device", DEVICES),
    )


def _model_spec(c: Fields, value: Any, path: str, base_dir: Path | None) -> str:
    spec = c.str_(value, path)
    if not spec.startswith(MODEL_PREFIXES):
        raise c.fail(
            path, f"expected a zoo spec starting with {', '.join(MODEL_PREFIXES)}, got {spec!r}"
        )
    if spec.startswith("hf-local:"):
        raw_dir = Path(spec[len("hf-local:") :]).expanduser()
        candidates = (
            [raw_dir]
            if raw_dir.is_absolute()
            else [(base_dir or Path.cwd()) / raw_dir, Path.cwd() / raw_dir]
        )
        found = next((d for d in candidates if d.is_dir()), None)
        if found is None:
            raise c.fail(path, f"no such model directory {spec!r}")
        spec = f"hf-local:{found.resolve()}"
    return spec


def _drafter(c: Fields, value: Any) -> DrafterSpec:
    d = c.mapping(value, "drafter", ("kind", "k", "q"), ("kind", "k"))
    drafter = DrafterSpec.from_kind(
        c.str_(d["kind"], "drafter.kind", DRAFTER_KINDS),
        c.int_(d["k"], "drafter.k", lo=1, hi=64),
        c.str_(d.get("q", "processed"), "drafter.q", Q_MODES),
    )
    if drafter.onehot and "q" in d and drafter.q_mode != "processed":
        raise c.fail(
            "drafter.q",
            "only meaningful for a sampled drafter (a one-hot drafter has q = δ(x)), "
            f"got {drafter.q_mode!r}",
        )
    return drafter


def _prompts(c: Fields, value: Any, base_dir: Path | None) -> PromptsSpec:
    """``prompts: FILE`` / ``{file: FILE, limit: N}`` (relative to the protocol, then the working
    directory) or ``{shipped: NAME, limit: N}`` (a prompt set shipped with spectest, found from
    a protocol anywhere)."""
    pm = c.mapping(
        {"file": value} if isinstance(value, str) else value,
        "prompts",
        ("file", "shipped", "limit"),
    )
    if ("file" in pm) == ("shipped" in pm):
        raise c.fail("prompts", "give exactly one of file or shipped")
    limit = pm.get("limit")
    shipped = c.str_(pm["shipped"], "prompts.shipped") if "shipped" in pm else None
    return load_prompt_set(
        f"shipped:{shipped}" if shipped else c.str_(pm["file"], "prompts.file"),
        limit=None if limit is None else c.int_(limit, "prompts.limit", lo=1),
        base_dir=base_dir,
        source=c.source,
        shipped=shipped,
    )


def _configs(c: Fields, value: Any) -> tuple[tuple[str, SamplingParams], ...]:
    if not isinstance(value, Mapping) or not value:
        raise c.fail(
            "configs", f"expected a non-empty mapping of named sampling configs, got {value!r}"
        )
    out: list[tuple[str, SamplingParams]] = []
    for cid, body in value.items():
        cid_s = c.name(cid, f"configs.{cid}" if is_name(cid) else "configs")
        b = c.mapping(body if body is not None else {}, f"configs.{cid_s}", SAMPLING_KEYS)
        try:
            sp = SamplingParams(
                temperature=b.get("temperature", 1.0),
                top_k=b.get("top_k", 0),
                top_p=b.get("top_p", 1.0),
                min_p=b.get("min_p", 0.0),
            )
        except ConfigError as err:
            # SamplingParams names the field and the value; prefix file and config.
            raise c.fail(f"configs.{cid_s}", str(err)) from None
        if sp.is_greedy:
            raise c.fail(
                f"configs.{cid_s}.temperature",
                "temperature 0 (greedy) has a deterministic law; "
                "spectest tests sampled configs, got 0",
            )
        out.append(
            (
                cid_s,
                SamplingParams(
                    float(sp.temperature), int(sp.top_k), float(sp.top_p), float(sp.min_p)
                ),
            )
        )
    return tuple(out)


def _seeds(c: Fields, value: Any, name: str) -> SeedsSpec:
    s = c.mapping(
        value,
        "seeds",
        (
            "per_arm",
            "teeth_per_arm",
            "start",
            "key",
            "max_per_arm",
            "spending",
            "reference_per_arm",
        ),
        ("per_arm",),
    )
    per_arm = c.int_(s["per_arm"], "seeds.per_arm", lo=2)
    max_per_arm = s.get("max_per_arm")
    if max_per_arm is not None:
        max_per_arm = c.int_(max_per_arm, "seeds.max_per_arm", lo=per_arm)
    spending = c.str_(s.get("spending", "equal"), "seeds.spending", SPENDING)
    reference_per_arm = s.get("reference_per_arm")
    if reference_per_arm is not None:
        reference_per_arm = c.int_(reference_per_arm, "seeds.reference_per_arm", lo=2)
        if max_per_arm is not None:
            raise c.fail(
                "seeds.reference_per_arm",
                f"{reference_per_arm!r} cannot be combined with seeds.max_per_arm (a sequential "
                "reference grows with the candidate)",
            )
    return SeedsSpec(
        per_arm=per_arm,
        teeth_per_arm=c.int_(s.get("teeth_per_arm", per_arm), "seeds.teeth_per_arm", lo=2),
        start=c.int_(s.get("start", 0), "seeds.start", lo=0, hi=2**53),
        key=c.str_(s.get("key", name), "seeds.key"),
        max_per_arm=max_per_arm,
        spending=spending,
        reference_per_arm=reference_per_arm,
    )


def _candidate(c: Fields, value: Any) -> str:
    """The candidate's sampler variant (a catalogue name), or the ``acceptor:`` shorthand."""
    raw = c.str_(value, "candidate")
    return raw if raw.startswith(ACCEPTOR_PREFIX) else _variant(c, raw, "candidate")


def _tests(c: Fields, value: Any) -> AnalysisOptions:
    """The ``tests`` section: the keys and the values at the settings' YAML paths
    (``stats.options.Option.yaml``), every rule the settings' own; a refusal names the field
    and the value as written."""
    paths = {tuple(path.split(".")): name for name, path in yaml_paths().items()}
    written: dict[str, Any] = {}
    _read_section(c, value, ("tests",), paths, written)
    given = {k: real(v) if OPTIONS[k].real else v for k, v in written.items()}
    try:
        return AnalysisOptions(**given)
    except OptionError as err:
        value = written.get(err.option, err.value)
        path = OPTIONS[err.option].yaml or "tests"
        raise c.fail(path, f"{err.rule}, got {value!r}") from None


def _read_section(
    c: Fields,
    value: Any,
    at: tuple[str, ...],
    paths: dict[tuple[str, ...], str],
    written: dict[str, Any],
) -> None:
    """The settings written under the mapping at ``at`` (its keys: the next part of the
    settings' paths, in the fields' order), into ``written`` (setting → the value as written)."""
    keys = list(dict.fromkeys(p[len(at)] for p in paths if p[: len(at)] == at))
    m = c.mapping(value or {}, ".".join(at), keys)
    for key in keys:
        if (*at, key) in paths:
            if key in m:
                written[paths[(*at, key)]] = m[key]
        else:
            _read_section(c, m.get(key, {}), (*at, key), paths, written)


def _teeth(c: Fields, value: Any) -> TeethSpec:
    th = c.mapping(
        value or {}, "teeth", ("null_arm", "null_engine", "epsilons", "mutants", "size_budget")
    )
    eps_raw = th.get("epsilons", []) or []
    mut_raw = th.get("mutants", []) or []
    if not isinstance(eps_raw, list):
        raise c.fail("teeth.epsilons", f"expected a list of numbers, got {eps_raw!r}")
    if not isinstance(mut_raw, list):
        raise c.fail("teeth.mutants", f"expected a list of variant names, got {mut_raw!r}")
    epsilons = tuple(
        c.float_(e, f"teeth.epsilons[{i}]", lambda x: x > 0.0, "> 0") for i, e in enumerate(eps_raw)
    )
    mutants = tuple(_variant(c, v, f"teeth.mutants[{i}]") for i, v in enumerate(mut_raw))
    for what, seq in (("epsilons", epsilons), ("mutants", mutants)):
        seen: set[Any] = set()  # (a set: a list scan is quadratic in a long hostile list)
        for x in seq:
            if x in seen:
                raise c.fail(f"teeth.{what}", f"duplicate entry {x!r}")
            seen.add(x)
    if "exact" in mutants:
        raise c.fail(
            "teeth.mutants", "'exact' is not a mutant (the null arm is the exact sampler's tooth)"
        )
    return TeethSpec(
        null=c.bool_(th.get("null_arm", True), "teeth.null_arm"),
        null_engine=c.str_(th.get("null_engine", "auto"), "teeth.null_engine", NULL_ENGINES),
        epsilons=epsilons,
        mutants=mutants,
        size_budget=c.int_(th.get("size_budget", DEFAULT_SIZE_BUDGET), "teeth.size_budget", lo=0),
    )


def _limits(c: Fields, value: Any) -> LimitsSpec:
    lm = c.mapping(value or {}, "limits", ("max_tokens",))
    n = lm.get("max_tokens")
    return LimitsSpec(max_tokens=None if n is None else c.int_(n, LIMITS_FIELD, lo=1))


def _variant(c: Fields, value: Any, path: str) -> str:
    spec = c.str_(value, path)
    from spectest.sampling.mutants import get_variant

    try:
        get_variant(spec)
    except Exception as err:  # any rejection of the spec is a config error here
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise c.fail(path, f"unknown sampler variant {spec!r} ({why})") from None
    return spec


# ----------------------------------------------------------------------------- rules
def _check_teeth_can_bite(
    c: Fields,
    mutants: Sequence[str],
    configs: Sequence[tuple[str, SamplingParams]],
    drafter: DrafterSpec,
) -> None:
    """A tooth that provably coincides with the exact sampler in every config of the protocol
    (``SpecVariant.may_differ``) can never be killed: refuse it rather than report a failure."""
    from spectest.sampling.mutants import get_variant

    for i, spec in enumerate(mutants):
        v = get_variant(spec)
        if v.exact:
            raise c.fail(
                f"teeth.mutants[{i}]", f"{spec!r} is an exact design (it must pass, not be killed)"
            )
        onehot = drafter.onehot
        if not any(
            v.may_differ(sp, onehot=onehot, K=drafter.k, q_mode=drafter.q_mode) for _, sp in configs
        ):
            raise c.fail(
                f"teeth.mutants[{i}]",
                f"{spec!r} coincides with the exact sampler under every config with this drafter "
                f"({drafter.kind}, K={drafter.k}, q={drafter.q_mode}): it cannot be killed",
            )
