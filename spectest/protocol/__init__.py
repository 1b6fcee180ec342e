"""Protocols: YAML → one frozen, validated, hashed ``Protocol`` (expanded by ``spectest.plan``).

Owns the protocol file format (``version: 1`` and ``version: 2``) and every validation message
about it, in one module per concern:

- ``spec``: the sections as frozen dataclasses (``tests``: the statistics' one test-settings
  type, ``stats.options.AnalysisOptions``), ``EngineChoice``, ``Protocol`` and its hash (a
  version-1 file hashes exactly as it did before version 2 existed);
- ``fields``: reading one field (one ``ConfigError`` line naming file, field path and value);
- ``parse``: one parse function per section and ``check_rules`` across them;
- ``arms`` / ``budget``: the arms a protocol defines, and the size of its plan against
  ``limits.max_tokens``;
- ``load`` / ``overrides``: the file (no YAML aliases) and the CLI's overrides, applied to the
  raw mapping before validation;
- ``dump``: the protocol's YAML form (``to_raw``).

The prompt-set file format lives in ``spectest.prompts``; seed ranges, stages and shards in
``spectest.plan``. Knows nothing about models, files of results or statistics (the ``tests``
section excepted: it is the statistics' ``AnalysisOptions``), nor about what an engine does.
"""

from spectest.engines.base import DrafterSpec
from spectest.models.dtypes import DTYPES
from spectest.prompts import Prompt, PromptsSpec, prompts_jsonl
from spectest.protocol.arms import (
    FLOOR,
    MATCHED,
    ArmRole,
    ArmSpec,
    arm_specs,
    eps_arm_name,
    mutant_arm_name,
)
from spectest.protocol.budget import (
    DEFAULT_MAX_TOKENS,
    PlanSize,
    check_budget,
    max_tokens,
    plan_size,
)
from spectest.protocol.dump import to_raw
from spectest.protocol.load import MAX_PROTOCOL_BYTES, load_protocol, yaml_load
from spectest.protocol.parse import MAX_BATCH_SIZE, protocol_from_dict
from spectest.protocol.spec import (
    ACCEPTOR_PREFIX,
    DEVICES,
    ENGINES_CANDIDATE,
    ENGINES_REFERENCE,
    LIMITS_FIELD,
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    SAMPLING_KEYS,
    EngineChoice,
    FloorSpec,
    LimitsSpec,
    ModelsSpec,
    Protocol,
    SeedsSpec,
    TeethSpec,
)
from spectest.schema import DRAFTER_KINDS, Q_MODES
from spectest.stats.battery import MULTIPLICITY as MULTIPLICITY_METHODS

__all__ = [
    "ACCEPTOR_PREFIX",
    "DEFAULT_MAX_TOKENS",
    "DEVICES",
    "DRAFTER_KINDS",
    "DTYPES",
    "ENGINES_CANDIDATE",
    "ENGINES_REFERENCE",
    "FLOOR",
    "LIMITS_FIELD",
    "MATCHED",
    "MAX_BATCH_SIZE",
    "MAX_PROTOCOL_BYTES",
    "MULTIPLICITY_METHODS",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "Q_MODES",
    "SAMPLING_KEYS",
    "ArmRole",
    "ArmSpec",
    "DrafterSpec",
    "EngineChoice",
    "FloorSpec",
    "LimitsSpec",
    "ModelsSpec",
    "PlanSize",
    "Prompt",
    "PromptsSpec",
    "Protocol",
    "SeedsSpec",
    "TeethSpec",
    "arm_specs",
    "check_budget",
    "eps_arm_name",
    "load_protocol",
    "max_tokens",
    "mutant_arm_name",
    "plan_size",
    "prompts_jsonl",
    "protocol_from_dict",
    "to_raw",
    "yaml_load",
]  # fmt: skip
