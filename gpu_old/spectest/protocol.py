"""Protocols: YAML → one frozen, validated, hashed ``Protocol`` (expanded by ``spectest.plan``).

Owns: the protocol file format (``version: 1`` and ``version: 2``), every validation message
about it, the choice of engine for the reference and candidate arms (``EngineChoice``: a
registered name and that engine's parsed options), CLI
overrides (applied to the raw mapping *before* validation, so an override is checked exactly like
a YAML value), the protocol hash and the protocol's YAML form (``to_raw``). The prompt-set file
format lives in ``spectest.prompts``; arms, seed ranges and shards in ``spectest.plan``.

Knows nothing about models, files of results or statistics, nor about what an engine does: an
engine is resolved through ``spectest.engines.registry`` only to parse its options and run its
cross-field rules (``Engine.check_protocol``). Model specs and the candidate's variant are strings
here, checked for form (variants against the mutant catalogue); loading them is the runner's.

Versions
--------
Version 1 names engines with the closed ``engine: {reference, candidate,
assistant_confidence_threshold}`` mapping; version 2 with ``engines: {reference: E, candidate:
E}``, each ``E`` a registered name or ``{name: NAME, OPTION: VALUE, ...}``. In both,
``candidate: acceptor:SPEC`` is shorthand for the candidate engine ``{name: acceptor, kernel:
SPEC}``. A version-1 file hashes exactly as it did before version 2 existed (``canonical``).

Every error is a ``ConfigError`` whose message is one line naming the protocol file, the field
path and the offending value (``{value!r}``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spectest.errors import ConfigError
from spectest.inputs import read_input, refused
from spectest.prompts import (
    NAME_RULE,
    Prompt,
    PromptsSpec,
    is_name,
    load_prompt_set,
    prompts_jsonl,
)
from spectest.sampling.params import SamplingParams
from spectest.sequential import SPENDING
from spectest.tooth_size import DEFAULT_BUDGET as DEFAULT_SIZE_BUDGET

PROTOCOL_VERSION = 2  # the newest version this spectest reads (and writes for new files)
PROTOCOL_VERSIONS = (1, 2)
DRAFTER_KINDS = ("onehot", "sampled")
Q_MODES = ("processed", "temperature", "raw")
MULTIPLICITY_METHODS = ("bh", "by", "maxT")
DTYPES = ("float32", "float64", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
ENGINES_REFERENCE = ("builtin", "hf-generate")  # version 1's closed lists (engines/hf.py)
ENGINES_CANDIDATE = ("builtin", "hf-assisted")
ACCEPTOR_PREFIX = "acceptor:"  # candidate: acceptor:SPEC = engines.candidate {acceptor, kernel}
LIMITS_FIELD = "limits.max_tokens"
_MODEL_PREFIXES = (
    "toy:",
    "hf-preset:",
    "realistic:",
    "hf-local:",
    "bundled:",
    "derived:",
    "fixture:",
)


# ----------------------------------------------------------------------------- dataclasses
@dataclass(frozen=True)
class ModelsSpec:
    """The model pair: zoo specs (``bundled:target``, ``toy:V=16,...``, ``hf-preset:NAME``,
    ``hf-local:/dir``), the weights' dtype and the device."""

    target: str
    draft: str
    dtype: str = "float32"
    device: str = "cpu"


@dataclass(frozen=True)
class DrafterSpec:
    """How drafts are proposed: ``onehot`` (greedy draft, q = δ(x)) or ``sampled`` (x ~ q), K
    tokens per round; for a sampled drafter, which q: ``processed`` (the same
    temperature/top-k/top-p/min-p pipeline as the target), ``temperature`` (temperature only,
    SGLang EAGLE) or ``raw`` (softmax of raw logits)."""

    kind: str
    k: int
    q: str = "processed"


@dataclass(frozen=True)
class SeedsSpec:
    """Seeds per arm. Arms get disjoint consecutive ranges starting at ``start`` (see ``Plan``);
    teeth arms use ``teeth_per_arm`` seeds (default ``per_arm``). ``key`` names the run key from
    which every row key is derived (default: the protocol name).

    Sequential runs (``spectest.sequential``): with ``max_per_arm`` the reference and candidate
    arms grow in stages, doubling from ``per_arm`` to ``max_per_arm`` seeds, with a look after
    each stage at the α share of ``spending`` ("equal" or "proportional"); the run stops at the
    first rejection or once ``tests.power.max_mde_tv`` is reached.

    ``reference_per_arm`` (default ``per_arm``): seeds of the plain reference arm, which every
    comparison (candidate and teeth) shares. A larger reference buys power where a two-sample test
    pays for the reference's variance — the teacher-mode white-box tests of token-only engines
    (``stats.whitebox_teacher``: the directed z's variance factor is 1 + n_cand/n_ref, so
    4 × ``per_arm`` takes it from 2 to 1.25) and every black-box family (N_eff = 2·n_a·n_b/n).
    Every family takes unequal arm sizes (permutations keep the sizes). Not combined with
    ``max_per_arm`` (a sequential reference grows with the candidate)."""

    per_arm: int
    teeth_per_arm: int
    start: int
    key: str
    max_per_arm: int | None = None
    spending: str = "equal"
    reference_per_arm: int | None = None

    @property
    def reference(self) -> int:
        """Seeds of the reference arm (``reference_per_arm``, default ``per_arm``)."""
        return self.per_arm if self.reference_per_arm is None else self.reference_per_arm

    def canonical(self) -> dict[str, Any]:
        """The fields as plain values; the sequential ones and ``reference_per_arm`` only when
        set, so a protocol without them keeps the hash it had before they existed."""
        out = vars(self).copy()
        if self.max_per_arm is None:
            del out["max_per_arm"], out["spending"]
        if self.reference_per_arm is None:
            del out["reference_per_arm"]
        return out


@dataclass(frozen=True)
class TrieSpec:
    """Prefix-conditional tests: trie nodes to ``depth`` tokens kept when they hold at least
    ``min_count`` sequences per arm (seed 002's "t2 | t1 strata ≥ 200")."""

    depth: int
    min_count: int


@dataclass(frozen=True)
class TestsSpec:
    """Which tests run and how they are judged."""

    alpha: float
    multiplicity: str
    min_expected: float
    trie: TrieSpec
    whitebox: bool
    null_permutations: int
    max_mde_tv: float | None  # power requirement: the run's MDE (TV) must not exceed this
    sequence: bool = True  # the sequence-level family (stats.sequence); hashed only when off


@dataclass(frozen=True)
class TeethSpec:
    """The harness's teeth: a null arm (exact sampler, disjoint seeds) that must pass, ε-biased
    acceptors and catalogue mutants that must be killed.

    NOTE: the YAML key is ``null_arm``, not ``null``: YAML reads a bare ``null:`` key as None.
    """

    null: bool
    epsilons: tuple[float, ...]
    mutants: tuple[str, ...]
    # contexts (model forward rows) per tooth and cell for the teeth's sizes (spectest.tooth_size;
    # 0: not computed, every size unknown); hashed only when not the default
    size_budget: int = DEFAULT_SIZE_BUDGET


@dataclass(frozen=True)
class LimitsSpec:
    """What the protocol may cost: ``max_tokens``, the most tokens its full plan may hold (None
    = ``plan.DEFAULT_MAX_TOKENS``; ``plan.check_budget``). Not hashed: it changes no sample and
    no decision, only whether the run is allowed to start."""

    max_tokens: int | None = None


@dataclass(frozen=True)
class EngineChoice:
    """The engine of an arm: a registered name (``spectest.engines.registry``) and that engine's
    parsed ``Options`` (a frozen dataclass). The teeth always use ``EngineChoice.builtin()``."""

    name: str
    options: Any = None
    uses_variant: bool = field(default=True, compare=False)  # Engine.uses_variant, cached

    @staticmethod
    def builtin() -> EngineChoice:
        return EngineChoice("builtin", None, True)

    def canonical(self) -> dict[str, Any]:
        """``{"name": ..., OPTION: VALUE...}``: the YAML form and the hashed form."""
        from spectest.engines.base import options_dict

        return {"name": self.name, **options_dict(self.options)}


@dataclass(frozen=True)
class Protocol:
    """A validated protocol. ``hash`` is the sha256 of ``canonical()`` (output dir excluded,
    prompt texts included), so two protocols that would produce different samples never share
    a hash."""

    version: int
    name: str
    description: str
    models: ModelsSpec
    drafter: DrafterSpec
    prompts: PromptsSpec
    configs: tuple[tuple[str, SamplingParams], ...]
    seeds: SeedsSpec
    positions: int
    candidate: str
    tests: TestsSpec
    teeth: TeethSpec
    output: str
    batch_size: int
    source: str  # the protocol file (for messages)
    reference_engine: EngineChoice = field(default_factory=EngineChoice.builtin)
    candidate_engine: EngineChoice = field(default_factory=EngineChoice.builtin)
    limits: LimitsSpec = field(default_factory=LimitsSpec)  # not hashed (like ``output``)

    @property
    def config_map(self) -> dict[str, SamplingParams]:
        return dict(self.configs)

    @property
    def candidate_variant(self) -> str | None:
        """The built-in sampler variant of the candidate arm, or None when its engine has none."""
        return self.candidate if self.candidate_engine.uses_variant else None

    def engines_canonical(self) -> dict[str, Any]:
        return {
            "reference": self.reference_engine.canonical(),
            "candidate": self.candidate_engine.canonical(),
        }

    def _v1_engine(self) -> dict[str, Any]:
        """Version 1's ``engine`` mapping (the acceptor is named by ``candidate`` there)."""
        cand = self.candidate_engine
        return {
            "reference": self.reference_engine.name,
            "candidate": "builtin" if cand.name == "acceptor" else cand.name,
            "assistant_confidence_threshold": float(
                getattr(cand.options, "assistant_confidence_threshold", 0.0)
            ),
        }

    def _engine_fields(self) -> dict[str, Any]:
        if self.version == 1:  # only when not the default: builtin-only hashes never changed
            e = self._v1_engine()
            return {} if e == _V1_DEFAULT_ENGINE else {"engine": e}
        return {"engines": self.engines_canonical()}

    def canonical(self) -> dict[str, Any]:
        """Every field that determines samples or decisions, as plain JSON values."""
        return {
            "version": self.version,
            "name": self.name,
            "models": vars(self.models).copy(),
            "drafter": vars(self.drafter).copy(),
            "prompts": [
                {"id": p.id, "text": p.text, "ids": list(p.ids) if p.ids is not None else None}
                for p in self.prompts.items
            ],
            "configs": [[cid, vars(sp).copy()] for cid, sp in self.configs],
            "seeds": self.seeds.canonical(),
            "positions": self.positions,
            "candidate": self.candidate,
            "tests": {
                **{
                    k: v
                    for k, v in vars(self.tests).items()
                    if k != "trie" and not (k == "sequence" and v)
                },
                "trie": vars(self.tests.trie).copy(),
            },
            "teeth": {
                "null": self.teeth.null,
                "epsilons": list(self.teeth.epsilons),
                "mutants": list(self.teeth.mutants),
                **(
                    {}
                    if self.teeth.size_budget == DEFAULT_SIZE_BUDGET
                    else {"size_budget": self.teeth.size_budget}
                ),
            },
            "batch_size": self.batch_size,
            **self._engine_fields(),
        }

    @property
    def hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def run_id(self) -> str:
        """Default run directory name: deterministic, so a re-run resumes into the same place."""
        return f"{self.name}-{self.hash[:10]}"


_V1_DEFAULT_ENGINE = {
    "reference": "builtin",
    "candidate": "builtin",
    "assistant_confidence_threshold": 0.0,
}


# ----------------------------------------------------------------------------- validation helpers
_MAX_DETAIL = 400  # characters of a message after the field path


class _Ctx:
    """Carries the file name so every message names it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, msg: str) -> ConfigError:
        if len(msg) > _MAX_DETAIL:  # a value's repr can be as long as the file: keep one line
            msg = f"{msg[:_MAX_DETAIL]}... ({len(msg)} characters)"
        return ConfigError(f"{self.source}: {path}: {msg}")

    def mapping(
        self, value: Any, path: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> dict:
        if not isinstance(value, Mapping):
            raise self.fail(path or "<top>", f"expected a mapping, got {value!r}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                shown = str(key) if is_name(key) or key is None else f"[{key!r:.60}]"
                where = f"{path}.{shown}" if path else shown
                raise self.fail(where, f"unknown key {key!r:.60} (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                where = f"{path}.{key}" if path else key
                raise self.fail(where, "required field is missing")
        return dict(value)

    def int_(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise self.fail(path, f"expected an integer {rng}, got {value!r}")
        return value

    def float_(self, value: Any, path: str, check: Callable[[float], bool], what: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(path, f"expected a number{' ' + what if what else ''}, got {value!r}")
        if not check(float(value)):
            raise self.fail(path, f"expected a number {what}, got {value!r}")
        return float(value)

    def number(self, value: Any, path: str) -> float:
        """A finite number (its range is the caller's)."""
        return self.float_(value, path, lambda _: True, "")

    def str_(self, value: Any, path: str, choices: Sequence[str] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(path, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def bool_(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {value!r}")
        return value

    def name(self, value: Any, path: str) -> str:
        s = self.str_(value, path)
        if not is_name(s):
            raise self.fail(path, f"expected {NAME_RULE}, got {value!r}")
        return s


# ----------------------------------------------------------------------------- loading
MAX_PROTOCOL_BYTES = 2**18  # a protocol is a few KB; PyYAML parses ~10⁵ B/s: a few s at most
MAX_BATCH_SIZE = 2**20  # rows per engine batch (an engine may allocate per batch row)


class _ProtocolLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases: a ``*name`` is refused where it stands.

    NOTE: an alias costs nothing to write and is expanded wherever the value is used (copied,
    compared, printed in a message): nine nested levels of ten aliases each are 10⁹ nodes from
    a 1 KB file (measured: 240 s and 6.5 GB, then a traceback). A protocol needs none, so
    refusing them is simpler than capping the expansion; anchors alone (``&name``) are inert."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise _AliasRefused(event.anchor, mark.line + 1, mark.column + 1)
        return super().compose_node(parent, index)


class _AliasRefused(Exception):
    def __init__(self, anchor: str, line: int, column: int) -> None:
        self.anchor, self.line, self.column = anchor, line, column


def _yaml_load(text: str, source: str) -> Any:
    """``text`` as YAML (safe types only, no aliases); one ``ConfigError`` line naming
    ``source`` (the file, or ``--set KEY``) and the line otherwise."""
    try:
        return yaml.load(text, Loader=_ProtocolLoader)  # a SafeLoader subclass
    except _AliasRefused as err:
        raise ConfigError(
            f"{source}: line {err.line}, column {err.column}: YAML alias *{err.anchor:.40} is not "
            "allowed (aliases can expand without bound; write the value out)"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: malformed YAML at {where}: {problem}") from None


def load_protocol(
    path: str | os.PathLike[str],
    *,
    overrides: Mapping[str, Any] | None = None,
    sets: Sequence[str] = (),
) -> Protocol:
    """Read, override and validate a protocol file.

    Parameters
    ----------
    path : the YAML file, or the name of a shipped protocol (``spectest.shipped``).
    overrides : dotted field path → value (e.g. ``{"seeds.per_arm": 64}``), applied before
        validation. ``None`` values are ignored (an unset CLI option).
    sets : ``"dotted.key=value"`` strings (CLI ``--set``); the value is parsed as YAML.
    """
    from spectest.shipped import resolve_protocol_file

    # a local file wins; a bare name (top_p, top_p.yaml) falls back to a shipped protocol, and
    # then ``source`` is the shipped file's full path, so the run records which one it used
    try:
        p, shipped = resolve_protocol_file(path)
    except OSError as err:  # a path component the machine will not let us look at
        raise refused(path, "protocol file", err.strerror or type(err).__name__) from None
    source = str(p) if shipped else str(path)
    data = read_input(p, "protocol file", MAX_PROTOCOL_BYTES)
    if len(data) > MAX_PROTOCOL_BYTES:
        raise ConfigError(
            f"{source}: larger than {MAX_PROTOCOL_BYTES} bytes: not a protocol (prompts live in "
            "the prompts.file)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}: {err.reason})"
        ) from None
    raw = _yaml_load(text, source)
    raw = copy.deepcopy(raw)
    all_overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set: expected key=value, got {item!r}")
        all_overrides[key.strip()] = _yaml_load(text, f"--set {key.strip()}")
    all_overrides.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key, value in all_overrides.items():
        raw = _apply_override(raw, key, value, source)
    return protocol_from_dict(raw, source=source, base_dir=p.resolve().parent)


def _apply_override(raw: Any, key: str, value: Any, source: str) -> Any:
    """Set the dotted ``key`` in ``raw``. Names may themselves hold dots (config ``t0.8-p0.95``):
    at each level the longest existing key that prefixes the rest of the path wins, else the next
    dot-separated segment (created as a mapping when missing)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: cannot apply override {key!r}: the protocol is not a mapping")
    node: dict[str, Any] = raw
    rest, done = key, ""
    while True:
        match = max(
            (k for k in node if isinstance(k, str) and (rest == k or rest.startswith(k + "."))),
            key=len,
            default=None,
        )
        part = match if match is not None else rest.split(".", 1)[0]
        if part == rest:
            node[part] = value
            return raw
        done = f"{done}.{part}" if done else part
        rest = rest[len(part) + 1 :]
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"override {key}: {done} is not a mapping in {source} (it is {nxt!r})"
            )
        node = nxt


def protocol_from_dict(
    raw: Any, *, source: str = "<protocol>", base_dir: Path | None = None
) -> Protocol:
    """Validate a raw mapping (as ``yaml.safe_load`` returns it) into a ``Protocol``."""
    c = _Ctx(source)
    top = c.mapping(
        raw,
        "",
        allowed=(
            "version", "name", "description", "models", "drafter", "prompts", "configs",
            "seeds", "positions", "candidate", "tests", "teeth", "output", "batch_size", "engine",
            "engines", "limits",
        ),
        required=(
            "version", "name", "models", "drafter", "prompts", "configs", "seeds", "positions",
        ),
    )  # fmt: skip
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

    m = c.mapping(
        top["models"], "models", ("target", "draft", "dtype", "device"), ("target", "draft")
    )
    models = ModelsSpec(
        target=_model_spec(c, m["target"], "models.target", base_dir),
        draft=_model_spec(c, m["draft"], "models.draft", base_dir),
        dtype=c.str_(m.get("dtype", "float32"), "models.dtype", DTYPES),
        device=c.str_(m.get("device", "cpu"), "models.device", DEVICES),
    )

    d = c.mapping(top["drafter"], "drafter", ("kind", "k", "q"), ("kind", "k"))
    drafter = DrafterSpec(
        kind=c.str_(d["kind"], "drafter.kind", DRAFTER_KINDS),
        k=c.int_(d["k"], "drafter.k", lo=1, hi=64),
        q=c.str_(d.get("q", "processed"), "drafter.q", Q_MODES),
    )
    if drafter.kind == "onehot" and "q" in d and drafter.q != "processed":
        raise c.fail(
            "drafter.q",
            "only meaningful for a sampled drafter (a one-hot drafter has q = δ(x)), "
            f"got {drafter.q!r}",
        )

    pv = top["prompts"]
    pm = c.mapping(
        {"file": pv} if isinstance(pv, str) else pv, "prompts", ("file", "limit"), ("file",)
    )
    limit = pm.get("limit")
    prompts = load_prompt_set(
        c.str_(pm["file"], "prompts.file"),
        limit=None if limit is None else c.int_(limit, "prompts.limit", lo=1),
        base_dir=base_dir,
        source=c.source,
    )
    configs = _configs(c, top["configs"])

    s = c.mapping(
        top["seeds"],
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
    seeds = SeedsSpec(
        per_arm=per_arm,
        teeth_per_arm=c.int_(s.get("teeth_per_arm", per_arm), "seeds.teeth_per_arm", lo=2),
        start=c.int_(s.get("start", 0), "seeds.start", lo=0, hi=2**53),
        key=c.str_(s.get("key", name), "seeds.key"),
        max_per_arm=max_per_arm,
        spending=spending,
        reference_per_arm=reference_per_arm,
    )
    positions = c.int_(top["positions"], "positions", lo=1, hi=4096)
    candidate_raw = c.str_(top.get("candidate", "exact"), "candidate")
    candidate = (
        candidate_raw
        if candidate_raw.startswith(ACCEPTOR_PREFIX)
        else _variant(c, candidate_raw, "candidate")
    )

    t = c.mapping(
        top.get("tests", {}) or {},
        "tests",
        (
            "alpha", "multiplicity", "min_expected", "trie", "whitebox", "null_permutations",
            "power", "sequence",
        ),
    )  # fmt: skip
    tr = c.mapping(t.get("trie", {}) or {}, "tests.trie", ("depth", "min_count"))
    pw = c.mapping(t.get("power", {}) or {}, "tests.power", ("max_mde_tv",))
    max_mde = pw.get("max_mde_tv")
    # the forms are checked here, the ranges by AnalysisOptions (_check_tests): one copy of each
    raw_tests = {
        "alpha": t.get("alpha", 0.05),
        "multiplicity": t.get("multiplicity", "bh"),
        "min_expected": t.get("min_expected", 5.0),
        "trie_depth": tr.get("depth", 2),
        "trie_min_count": tr.get("min_count", 200),
        "null_permutations": t.get("null_permutations", 200),
    }
    tests = TestsSpec(
        alpha=c.number(raw_tests["alpha"], "tests.alpha"),
        multiplicity=c.str_(raw_tests["multiplicity"], "tests.multiplicity", MULTIPLICITY_METHODS),
        min_expected=c.number(raw_tests["min_expected"], "tests.min_expected"),
        trie=TrieSpec(
            depth=c.int_(raw_tests["trie_depth"], "tests.trie.depth"),
            min_count=c.int_(raw_tests["trie_min_count"], "tests.trie.min_count"),
        ),
        whitebox=c.bool_(t.get("whitebox", True), "tests.whitebox"),
        null_permutations=c.int_(raw_tests["null_permutations"], "tests.null_permutations"),
        max_mde_tv=None
        if max_mde is None
        else c.float_(max_mde, "tests.power.max_mde_tv", lambda x: 0.0 < x <= 1.0, "in (0, 1]"),
        sequence=c.bool_(t.get("sequence", True), "tests.sequence"),
    )
    _check_tests(c, tests, raw_tests)

    th = c.mapping(
        top.get("teeth", {}) or {}, "teeth", ("null_arm", "epsilons", "mutants", "size_budget")
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
    _check_teeth_can_bite(c, mutants, configs, drafter)
    teeth = TeethSpec(
        null=c.bool_(th.get("null_arm", True), "teeth.null_arm"),
        epsilons=epsilons,
        mutants=mutants,
        size_budget=c.int_(th.get("size_budget", DEFAULT_SIZE_BUDGET), "teeth.size_budget", lo=0),
    )

    output = c.str_(top.get("output", "results"), "output")
    batch_size = c.int_(top.get("batch_size", 256), "batch_size", lo=1, hi=MAX_BATCH_SIZE)
    reference_engine, candidate_engine, candidate = _engines(
        c, top, version, candidate, drafter, base_dir
    )
    lm = c.mapping(top.get("limits", {}) or {}, "limits", ("max_tokens",))
    limits = LimitsSpec(
        max_tokens=None
        if lm.get("max_tokens") is None
        else c.int_(lm["max_tokens"], LIMITS_FIELD, lo=1)
    )
    protocol = Protocol(
        version=version, name=name, description=description, models=models, drafter=drafter,
        prompts=prompts, configs=configs, seeds=seeds, positions=positions, candidate=candidate,
        tests=tests, teeth=teeth, output=output, batch_size=batch_size, source=source,
        reference_engine=reference_engine, candidate_engine=candidate_engine, limits=limits,
    )  # fmt: skip
    from spectest.plan import check_budget  # (plan imports this module)

    check_budget(protocol)  # before any work: the plan's size against limits.max_tokens
    return protocol


_TESTS_FIELDS = {  # AnalysisOptions field → the protocol's field path
    "alpha": "tests.alpha",
    "multiplicity": "tests.multiplicity",
    "min_expected": "tests.min_expected",
    "trie_depth": "tests.trie.depth",
    "trie_min_count": "tests.trie.min_count",
    "null_permutations": "tests.null_permutations",
    "whitebox": "tests.whitebox",
    "sequence": "tests.sequence",
}


def _check_tests(c: _Ctx, tests: TestsSpec, raw: Mapping[str, Any]) -> None:
    """Every analysis option of ``tests`` at load, through the one validator the analysis uses
    (``stats.analyze.AnalysisOptions`` via ``judge.analysis_options``), so a value the analysis
    would refuse after generation is refused here, naming the file, the field and the value."""
    from spectest.judge import analysis_options
    from spectest.stats.analyze import OptionError

    try:
        analysis_options(tests)
    except OptionError as err:
        value = raw.get(err.option, err.value)
        raise c.fail(_TESTS_FIELDS.get(err.option, "tests"), f"{err.rule}, got {value!r}") from None


def _engines(
    c: _Ctx,
    top: Mapping[str, Any],
    version: int,
    candidate: str,
    drafter: DrafterSpec,
    base_dir: Path | None,
) -> tuple[EngineChoice, EngineChoice, str]:
    """The reference and candidate engines (and the candidate string as hashed): version 1's
    ``engine`` mapping or version 2's ``engines``; the ``acceptor:`` shorthand; each engine's
    cross-field rules."""
    raw: dict[str, Any] = {"reference": "builtin", "candidate": "builtin"}
    if version == 1:
        if "engines" in top:
            raise c.fail("engines", "needs version: 2 (version 1 names engines under 'engine')")
        e = c.mapping(
            top.get("engine", {}) or {},
            "engine",
            ("reference", "candidate", "assistant_confidence_threshold"),
        )
        raw["reference"] = c.str_(
            e.get("reference", "builtin"), "engine.reference", ENGINES_REFERENCE
        )
        raw["candidate"] = c.str_(
            e.get("candidate", "builtin"), "engine.candidate", ENGINES_CANDIDATE
        )
        thr = c.float_(
            e.get("assistant_confidence_threshold", 0.0), "engine.assistant_confidence_threshold",
            lambda x: 0.0 <= x < 1.0, "in [0, 1)",
        )  # fmt: skip
        if raw["candidate"] == "hf-assisted":
            raw["candidate"] = {"name": "hf-assisted", "assistant_confidence_threshold": thr}
        elif thr != 0.0:
            raise c.fail(
                "engine.assistant_confidence_threshold",
                f"only meaningful with candidate: hf-assisted, got {thr!r}",
            )
        prefix = "engine"
    else:
        if "engine" in top:
            raise c.fail("engine", "is version 1's form: version 2 uses 'engines'")
        raw.update(c.mapping(top.get("engines", {}) or {}, "engines", ("reference", "candidate")))
        prefix = "engines"
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
    else:
        prefix_c = f"{prefix}.candidate"
    reference = _engine_choice(c, raw["reference"], f"{prefix}.reference", base_dir)
    cand = _engine_choice(c, raw["candidate"], prefix_c, base_dir)
    for role, choice in (("reference", reference), ("candidate", cand)):
        from spectest.engines.registry import engine_class

        rule = engine_class(choice.name).check_protocol(
            choice.options,
            role=role,
            variant="exact" if candidate.startswith(ACCEPTOR_PREFIX) else candidate,
            drafter_kind=drafter.kind,
            drafter_q=drafter.q,
        )
        if rule is not None:
            raise c.fail(*rule)
    return reference, cand, candidate


def _engine_choice(c: _Ctx, value: Any, path: str, base_dir: Path | None) -> EngineChoice:
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


def _model_spec(c: _Ctx, value: Any, path: str, base_dir: Path | None) -> str:
    spec = c.str_(value, path)
    if not spec.startswith(_MODEL_PREFIXES):
        raise c.fail(
            path, f"expected a zoo spec starting with {', '.join(_MODEL_PREFIXES)}, got {spec!r}"
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


def _variant(c: _Ctx, value: Any, path: str) -> str:
    spec = c.str_(value, path)
    try:
        from spectest.sampling.mutants import get_variant
    except ImportError:  # NOTE: the catalogue lands separately; form-check only until it does.
        return spec
    try:
        get_variant(spec)
    except Exception as err:  # any rejection of the spec is a config error here
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise c.fail(path, f"unknown sampler variant {spec!r} ({why})") from None
    return spec


def _check_teeth_can_bite(
    c: _Ctx,
    mutants: Sequence[str],
    configs: Sequence[tuple[str, SamplingParams]],
    drafter: DrafterSpec,
) -> None:
    """A tooth that provably coincides with the exact sampler in every config of the protocol
    (``SpecVariant.may_differ``) can never be killed: refuse it rather than report a failure."""
    try:
        from spectest.sampling.mutants import get_variant
    except ImportError:  # NOTE: form-check only until the catalogue lands
        return
    for i, spec in enumerate(mutants):
        v = get_variant(spec)
        if v.exact:
            raise c.fail(
                f"teeth.mutants[{i}]", f"{spec!r} is an exact design (it must pass, not be killed)"
            )
        onehot = drafter.kind == "onehot"
        if not any(
            v.may_differ(sp, onehot=onehot, K=drafter.k, q_mode=drafter.q) for _, sp in configs
        ):
            raise c.fail(
                f"teeth.mutants[{i}]",
                f"{spec!r} coincides with the exact sampler under every config with this drafter "
                f"({drafter.kind}, K={drafter.k}, q={drafter.q}): it cannot be killed",
            )


def _configs(c: _Ctx, value: Any) -> tuple[tuple[str, SamplingParams], ...]:
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


def to_raw(protocol: Protocol, *, prompts_file: str) -> dict[str, Any]:
    """The protocol as a YAML-ready mapping that ``protocol_from_dict`` reads back to the same
    hash, with the prompt set pointing at ``prompts_file`` (the store copies prompts beside it so a
    run directory is self-contained). See ``prompts_jsonl``."""
    p = protocol
    return {
        "version": p.version,
        "name": p.name,
        "description": p.description,
        "models": vars(p.models).copy(),
        "drafter": vars(p.drafter).copy(),
        "prompts": {"file": prompts_file},
        "configs": {cid: vars(sp).copy() for cid, sp in p.configs},
        "seeds": p.seeds.canonical(),
        "positions": p.positions,
        "candidate": p.candidate,
        "tests": {
            "alpha": p.tests.alpha,
            "multiplicity": p.tests.multiplicity,
            "min_expected": p.tests.min_expected,
            "trie": vars(p.tests.trie).copy(),
            "whitebox": p.tests.whitebox,
            "null_permutations": p.tests.null_permutations,
            "power": {"max_mde_tv": p.tests.max_mde_tv},
            **({} if p.tests.sequence else {"sequence": False}),
        },
        "teeth": {
            "null_arm": p.teeth.null,
            "epsilons": list(p.teeth.epsilons),
            "mutants": list(p.teeth.mutants),
            **(
                {}
                if p.teeth.size_budget == DEFAULT_SIZE_BUDGET
                else {"size_budget": p.teeth.size_budget}
            ),
        },
        "output": p.output,
        "batch_size": p.batch_size,
        **({} if p.limits.max_tokens is None else {"limits": vars(p.limits).copy()}),
        **(
            {"engines": p.engines_canonical()}
            if p.version != 1
            else ({"engine": e} if (e := p._v1_engine()) != _V1_DEFAULT_ENGINE else {})
        ),
    }


__all__ = ["Prompt", "PromptsSpec", "prompts_jsonl"]  # re-exported: part of a Protocol
