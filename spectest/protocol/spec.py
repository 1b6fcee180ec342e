"""The protocol's sections as frozen dataclasses, each with its canonical (hashed) form.

Owns: ``ModelsSpec``, ``SeedsSpec``, ``TrieSpec``, ``TestsSpec``, ``TeethSpec``,
``LimitsSpec``, ``EngineChoice`` and ``Protocol`` with its hash; the closed lists a protocol's
values come from (``DTYPES``, ``DEVICES`` ...; the drafter is ``engines.base.DrafterSpec``).
Reading a file into these is
``spectest.protocol.parse``'s; writing one back is ``spectest.protocol.dump``'s.

``TestsSpec`` is the one shape of the test settings: its defaults are the statistics' own
(``stats.analyze.AnalysisOptions``, read here, written nowhere else), it is validated once on
construction by the statistics' own rules, and ``TestsSpec.analysis_options`` is the one way to
the statistics' options. Why not embed ``AnalysisOptions`` in the protocol: it holds what is not
the protocol's (the white-box mode is a property of the run's engines, the tolerances and
quantiles are the statistics' constants) and lacks what is (the power requirement is the
verdict's), and its flat fields are not the file's nested ones, which the hash must keep.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from spectest.engines.base import DrafterSpec
from spectest.prompts import PromptsSpec
from spectest.sampling.params import SamplingParams
from spectest.stats.analyze import AnalysisOptions, OptionError
from spectest.tooth_size import DEFAULT_BUDGET as DEFAULT_SIZE_BUDGET

PROTOCOL_VERSION = 2  # the newest version this spectest reads (and writes for new files)
PROTOCOL_VERSIONS = (1, 2)
DTYPES = ("float32", "float64", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
ENGINES_REFERENCE = ("builtin", "hf-generate")  # version 1's closed lists (engines/hf/)
ENGINES_CANDIDATE = ("builtin", "hf-assisted")
ACCEPTOR_PREFIX = "acceptor:"  # candidate: acceptor:SPEC = engines.candidate {acceptor, kernel}
LIMITS_FIELD = "limits.max_tokens"
MAX_MDE_RULE = "expected a number in (0, 1]"  # tests.power.max_mde_tv, --max-mde-tv
# issue 21: the numerics modes (``tests.numerics``), the floors (``tests.numerics_floor``) and
# the default margin in TV per token (``spectest.numerics`` says why 0.002)
NUMERICS_MODES = ("auto", "exact", "matched")
NUMERICS_FLOORS = ("auto", "batch", "prefill", "dtype")  # auto: spectest.numerics_floors
DEFAULT_NUMERICS_MARGIN = 0.002
MATCHED_DTYPES = ("bfloat16", "float16")  # auto → matched for these model dtypes
MATCHABLE_ENGINES = ("builtin", "fast", "acceptor")  # candidate engines that host the matched arm
_STATS = AnalysisOptions()  # the statistics' defaults: the one copy of the tests' defaults


@dataclass(frozen=True)
class ModelsSpec:
    """The model pair: zoo specs (``bundled:target``, ``toy:V=16,...``, ``hf-preset:NAME``,
    ``hf-local:/dir``), the weights' dtype and the device."""

    target: str
    draft: str
    dtype: str = "float32"
    device: str = "cpu"


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

    depth: int = _STATS.trie_depth
    min_count: int = _STATS.trie_min_count


@dataclass(frozen=True)
class TestsSpec:
    """Which tests run and how they are judged: the protocol's ``tests`` section, and
    ``spectest compare``'s settings. Validated on construction by the statistics' own rules
    (``stats.analyze.AnalysisOptions``; an ``OptionError`` names the option, so the caller can
    name its own field or flag); ``max_mde_tv`` (the verdict's power requirement: the run's MDE
    in TV must not exceed it; None = the verdict's default) is checked here."""

    alpha: float = _STATS.alpha
    multiplicity: str = _STATS.multiplicity
    min_expected: float = _STATS.min_expected
    trie: TrieSpec = field(default_factory=TrieSpec)
    whitebox: bool = _STATS.whitebox
    null_permutations: int = _STATS.null_permutations
    max_mde_tv: float | None = None
    sequence: bool = _STATS.sequence  # the sequence-level family; hashed only when off
    # issue 21 (``spectest.numerics``): exact | matched | auto; the floor; the margin (TV per
    # token). Hashed only when set (not the default), so no shipped protocol changes its hash.
    numerics: str = "auto"
    numerics_floor: str = "auto"
    numerics_margin: float = DEFAULT_NUMERICS_MARGIN

    def __post_init__(self) -> None:
        self.analysis_options()
        if self.numerics not in NUMERICS_MODES:
            rule = f"expected one of {', '.join(NUMERICS_MODES)}"
            raise OptionError("numerics", rule, self.numerics)
        if self.numerics_floor not in NUMERICS_FLOORS:
            raise OptionError(
                "numerics_floor", f"expected one of {', '.join(NUMERICS_FLOORS)}",
                self.numerics_floor,
            )  # fmt: skip
        mg = self.numerics_margin
        if not (
            isinstance(mg, (int, float)) and not isinstance(mg, bool) and math.isfinite(mg)
            and 0.0 <= mg < 1.0
        ):  # fmt: skip
            raise OptionError("numerics_margin", "expected a number in [0, 1)", mg)
        m = self.max_mde_tv
        if m is not None and not (
            isinstance(m, (int, float))
            and not isinstance(m, bool)
            and math.isfinite(m)
            and 0.0 < m <= 1.0
        ):
            raise OptionError("max_mde_tv", MAX_MDE_RULE, m)

    def analysis_options(self, whitebox_mode: str = "exact") -> AnalysisOptions:
        """The statistics' options for these settings (``whitebox_mode``: 'exact' or 'teacher',
        a property of the run's engines: ``spectest.generation.whitebox_mode``)."""
        return AnalysisOptions(
            whitebox_mode=whitebox_mode,
            alpha=self.alpha,
            multiplicity=self.multiplicity,
            min_expected=self.min_expected,
            trie_depth=self.trie.depth,
            trie_min_count=self.trie.min_count,
            whitebox=self.whitebox,
            null_permutations=self.null_permutations,
            sequence=self.sequence,
        )

    def canonical(self) -> dict[str, Any]:
        """The hashed form, also the summary's ``analysis``: every field as a plain value,
        ``sequence`` only when off (a protocol without it keeps its hash)."""
        out: dict[str, Any] = {
            "alpha": self.alpha,
            "multiplicity": self.multiplicity,
            "min_expected": self.min_expected,
            "trie": vars(self.trie).copy(),
            "whitebox": self.whitebox,
            "null_permutations": self.null_permutations,
            "max_mde_tv": self.max_mde_tv,
        }
        if not self.sequence:
            out["sequence"] = False
        if self.numerics != "auto":
            out["numerics"] = self.numerics
        if self.numerics_floor != "auto":
            out["numerics_floor"] = self.numerics_floor
        if self.numerics_margin != DEFAULT_NUMERICS_MARGIN:
            out["numerics_margin"] = self.numerics_margin
        return out

    @classmethod
    def from_canonical(cls, d: dict[str, Any]) -> TestsSpec:
        """The inverse of ``canonical`` (a stored summary's ``analysis``)."""
        return cls(
            alpha=d["alpha"],
            multiplicity=d["multiplicity"],
            min_expected=d["min_expected"],
            trie=TrieSpec(**d["trie"]),
            whitebox=d["whitebox"],
            null_permutations=d["null_permutations"],
            max_mde_tv=d.get("max_mde_tv"),
            sequence=d.get("sequence", True),
            numerics=d.get("numerics", "auto"),
            numerics_floor=d.get("numerics_floor", "auto"),
            numerics_margin=d.get("numerics_margin", DEFAULT_NUMERICS_MARGIN),
        )


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
    def numerics_mode(self) -> str:
        """``exact`` or ``matched`` (``tests.numerics`` resolved): ``auto`` is ``matched`` for a
        bfloat16 / float16 model pair whose candidate engine can host the matched arm (built-in,
        fast, acceptor: ``MATCHABLE_ENGINES``), ``exact`` otherwise (``spectest.numerics``)."""
        mode = self.tests.numerics
        if mode != "auto":
            return mode
        if self.models.dtype in MATCHED_DTYPES and self.candidate_engine.name in MATCHABLE_ENGINES:
            return "matched"
        return "exact"

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
            "teeth": self.teeth.canonical(),
            "batch_size": self.batch_size,
            **self.engine_fields(),
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
