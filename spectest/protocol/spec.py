"""The protocol's sections as frozen dataclasses, each with its canonical (hashed) form, and the
closed lists a protocol's values come from, and ``to_raw`` (its YAML form, as a run directory
stores it in ``protocol.yaml``).

The why and the details: docs/internals.md "spectest/protocol/spec.py".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from spectest.engines.base import DrafterSpec
from spectest.models.dtypes import LOW_PRECISION
from spectest.prompts import PromptsSpec
from spectest.sampling.params import SamplingParams
from spectest.stats.options import AnalysisOptions
from spectest.tooth_size import DEFAULT_BUDGET as DEFAULT_SIZE_BUDGET

PROTOCOL_VERSIONS = (1, 2)
DEVICES = ("cpu", "cuda")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
ENGINES_REFERENCE = ("builtin", "hf-generate")  # version 1's closed lists (engines/hf/)
ENGINES_CANDIDATE = ("builtin", "hf-assisted")
ACCEPTOR_PREFIX = "acceptor:"  # candidate: acceptor:SPEC = engines.candidate {acceptor, kernel}
LIMITS_FIELD = "limits.max_tokens"
MATCHABLE_ENGINES = ("builtin", "fast", "acceptor")  # candidate engines that host the matched arm
# teeth.null_engine: where the null tooth runs (docs/protocols.md "The null tooth"); ``auto``: on
# the reference engine itself when it is foreign (not ``OWN_ENGINES``), else spectest's exact
# sampler on the built-in engine
NULL_ENGINES = ("auto", "reference", "builtin")
OWN_ENGINES = ("builtin", "fast")  # reference engines of spectest's own sampling pipeline


@dataclass(frozen=True)
class ModelsSpec:
    """The model pair: zoo specs (``bundled:target``, ``toy:V=16,...``, ``hf-preset:NAME``,
    ``hf-local:/dir``), the weights' dtype (one of ``models.dtypes.DTYPES``; float32 when the
    file names none, on every device: a protocol's law must not depend on the machine it runs
    on) and the device."""

    target: str
    draft: str
    dtype: str = "float32"
    device: str = "cpu"


@dataclass(frozen=True)
class SeedsSpec:
    """Seeds per arm: disjoint consecutive ranges from ``start`` (``plan``); ``key`` names the
    run key every row key derives from. ``max_per_arm``/``spending``: a sequential run's stages;
    ``reference_per_arm``: the shared reference's seeds (docs/protocols.md "Protocol reference")."""

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
class TeethSpec:
    """The harness's teeth: a null arm (disjoint seeds) that must pass, ε-biased acceptors and
    catalogue mutants that must be killed. ``null_engine`` (``NULL_ENGINES``) says where the
    null runs: ``Protocol.null_on_reference`` resolves it (hashed there, resolved, so that the
    hash follows the arm that runs, not the words).

    NOTE: the YAML key is ``null_arm``, not ``null``: YAML reads a bare ``null:`` key as None.
    """

    null: bool
    epsilons: tuple[float, ...]
    mutants: tuple[str, ...]
    # contexts (model forward rows) per tooth and cell for the teeth's sizes (spectest.tooth_size;
    # 0: not computed, every size unknown); hashed only when not the default
    size_budget: int = DEFAULT_SIZE_BUDGET
    null_engine: str = "auto"  # not hashed here: ``Protocol.canonical`` hashes it resolved

    def canonical(self) -> dict[str, Any]:
        """The hashed form (``size_budget`` only when not the default)."""
        return {
            "null": self.null,
            "epsilons": list(self.epsilons),
            "mutants": list(self.mutants),
            **self._budget(),
        }

    def raw(self) -> dict[str, Any]:
        """The YAML form (``null_arm``: see the class NOTE)."""
        return {
            "null_arm": self.null,
            **({} if self.null_engine == "auto" else {"null_engine": self.null_engine}),
            "epsilons": list(self.epsilons),
            "mutants": list(self.mutants),
            **self._budget(),
        }

    def _budget(self) -> dict[str, int]:
        return {} if self.size_budget == DEFAULT_SIZE_BUDGET else {"size_budget": self.size_budget}


@dataclass(frozen=True)
class LimitsSpec:
    """What the protocol may cost: ``max_tokens``, the most tokens its full plan may hold (None
    = ``protocol.budget.DEFAULT_MAX_TOKENS``; ``protocol.budget.check_budget``). Not hashed: it
    changes no sample and no decision, only whether the run is allowed to start."""

    max_tokens: int | None = None


@dataclass(frozen=True)
class EngineChoice:
    """The engine of an arm: a registered name (``spectest.engines.registry``) and that engine's
    parsed ``Options`` (a frozen dataclass). ε arms and mutants always use
    ``EngineChoice.builtin()``; the null too unless ``Protocol.null_on_reference``."""

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


FLOOR_ORDERS = ("reversed",)  # arms.floor.order: the request orders a floor arm can take
FLOOR_SHAPES = ("batch_size", "concurrency", "order")  # exactly one per floor arm
FLOOR_TEACHER = "teacher_forced"  # arms.floor.teacher_forced: true, in place of a shape


@dataclass(frozen=True)
class FloorSpec:
    """A floor arm (``arms.floor``): the reference's engine (or ``engine``, stated)
    plain-decoding under exactly one other shape — ``batch_size`` (rows per engine call),
    ``concurrency`` (the engine's own option, e.g. the http engine's parallel requests) or
    ``order: reversed`` (rows sent in reverse) — on seeds disjoint from every other arm's.
    Claim (b) is then decided from tokens at ``margin`` (TV per token, ``stats.token_floor``).
    ``engine`` holds the arm's resolved engine (the concurrency applied); ``raw`` the file's
    form, which is what is hashed (only when the section is present). ``teacher``: with
    ``teacher_forced: true`` no arm is laid out; ``engine`` is asked for its plain law at the
    prefixes of the first ``teacher`` sequences per cell (``stats.teacher_forced``), in forwards
    of ``batch_size`` rows when stated."""

    engine: EngineChoice
    batch_size: int | None
    order: str | None
    margin: float
    raw: tuple[tuple[str, Any], ...]
    teacher: int | None = None

    @property
    def kind(self) -> str:
        """The shape in words for the verdict line: ``batch 1``, ``concurrency 1``, ``order
        reversed``, or the teacher-forced floor's."""
        if self.teacher is not None:
            from spectest.stats.teacher_forced import KIND

            return KIND + ("" if self.batch_size is None else f", batch {self.batch_size}")
        shape = next((k, v) for k, v in self.raw if k in FLOOR_SHAPES)
        return f"{shape[0].replace('_size', '')} {shape[1]}"

    def canonical(self) -> dict[str, Any]:
        """The file's form: the engine (``reference`` or its mapping; held as JSON text so the
        spec stays hashable), the shape, the margin when stated."""
        return {k: json.loads(v) if k == "engine" and v != "reference" else v for k, v in self.raw}


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
    tests: AnalysisOptions  # the protocol's ``tests`` (``whitebox_mode``: the default)
    teeth: TeethSpec
    output: str
    batch_size: int
    source: str  # the protocol file (for messages)
    reference_engine: EngineChoice = field(default_factory=EngineChoice.builtin)
    candidate_engine: EngineChoice = field(default_factory=EngineChoice.builtin)
    limits: LimitsSpec = field(default_factory=LimitsSpec)  # not hashed (like ``output``)
    floor: FloorSpec | None = None  # ``arms.floor``, hashed only when present

    @property
    def config_map(self) -> dict[str, SamplingParams]:
        return dict(self.configs)

    @property
    def numerics_mode(self) -> str:
        """``exact`` or ``matched`` (``tests.numerics`` resolved): ``auto`` is ``matched`` for a
        bfloat16 / float16 model pair whose candidate engine can host the matched arm (built-in,
        fast, acceptor: ``MATCHABLE_ENGINES``), ``exact`` otherwise (``numerics.table``)."""
        mode = self.tests.numerics
        if mode != "auto":
            return mode
        if self.models.dtype in LOW_PRECISION and self.candidate_engine.name in MATCHABLE_ENGINES:
            return "matched"
        return "exact"

    @property
    def null_on_reference(self) -> bool:
        """Whether the null tooth is the reference engine itself, plain vs plain on its own
        seeds (``teeth.null_engine`` resolved): ``auto`` is yes for a foreign reference engine
        (any but ``OWN_ENGINES``), whose plain law spectest's exact sampler need not share at
        a tied nucleus edge or in bf16 (docs/protocols.md "The null tooth")."""
        if not self.teeth.null:
            return False
        if self.teeth.null_engine == "auto":
            return self.reference_engine.name not in OWN_ENGINES
        return self.teeth.null_engine == "reference"

    @property
    def candidate_variant(self) -> str | None:
        """The built-in sampler variant of the candidate arm, or None when its engine has none."""
        return self.candidate if self.candidate_engine.uses_variant else None

    def engines_canonical(self) -> dict[str, Any]:
        return {
            "reference": self.reference_engine.canonical(),
            "candidate": self.candidate_engine.canonical(),
        }

    def v1_engine(self) -> dict[str, Any] | None:
        """Version 1's ``engine`` mapping (the acceptor is named by ``candidate`` there), or
        None when it is the default (then a version-1 file names no engine at all)."""
        cand = self.candidate_engine
        e = {
            "reference": self.reference_engine.name,
            "candidate": "builtin" if cand.name == "acceptor" else cand.name,
            "assistant_confidence_threshold": float(
                getattr(cand.options, "assistant_confidence_threshold", 0.0)
            ),
        }
        return None if e == _V1_DEFAULT_ENGINE else e

    def engine_fields(self) -> dict[str, Any]:
        """The engines as the file of this version states them: version 2's ``engines``, or
        version 1's ``engine`` only when not the default (builtin-only hashes never changed)."""
        if self.version == 1:
            e = self.v1_engine()
            return {} if e is None else {"engine": e}
        return {"engines": self.engines_canonical()}

    def canonical(self) -> dict[str, Any]:
        """Every field that determines samples or decisions, as plain JSON values."""
        return {
            "version": self.version,
            "name": self.name,
            "models": vars(self.models).copy(),
            "drafter": self.drafter.canonical(),
            "prompts": [
                {"id": p.id, "text": p.text, "ids": list(p.ids) if p.ids is not None else None}
                for p in self.prompts.items
            ],
            "configs": [[cid, vars(sp).copy()] for cid, sp in self.configs],
            "seeds": self.seeds.canonical(),
            "positions": self.positions,
            "candidate": self.candidate,
            "tests": self.tests.canonical(),
            "teeth": {
                **self.teeth.canonical(),
                # resolved, and only when it is the reference: a builtin null keeps its hash
                **({"null_engine": "reference"} if self.null_on_reference else {}),
            },
            "batch_size": self.batch_size,
            **self.engine_fields(),
            **({"arms": {"floor": self.floor.canonical()}} if self.floor is not None else {}),
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


def to_raw(protocol: Protocol, *, prompts_file: str) -> dict[str, Any]:
    """The protocol as a YAML-ready mapping, prompts at ``prompts_file``."""
    p = protocol
    return {
        "version": p.version,
        "name": p.name,
        "description": p.description,
        "models": vars(p.models).copy(),
        "drafter": p.drafter.canonical(),
        "prompts": {"file": prompts_file},
        "configs": {cid: vars(sp).copy() for cid, sp in p.configs},
        "seeds": p.seeds.canonical(),
        "positions": p.positions,
        "candidate": p.candidate,
        "tests": p.tests.yaml_form(),
        "teeth": p.teeth.raw(),
        "output": p.output,
        "batch_size": p.batch_size,
        **({} if p.limits.max_tokens is None else {"limits": vars(p.limits).copy()}),
        **p.engine_fields(),
        **({"arms": {"floor": p.floor.canonical()}} if p.floor is not None else {}),
    }
