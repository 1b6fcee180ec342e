"""Protocols: YAML → one frozen, validated, hashed ``Protocol`` (expanded by ``spectest.plan``),
one module per concern. The format: docs/protocols.md "Protocol reference"; the details:
docs/internals.md "spectest/protocol/__init__.py".
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
    is_plain_null,
    mutant_arm_name,
)
from spectest.protocol.budget import (
    DEFAULT_MAX_TOKENS,
    PlanSize,
    check_budget,
    max_tokens,
    plan_size,
)
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
    to_raw,
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
    "is_plain_null",
    "load_protocol",
    "max_tokens",
    "mutant_arm_name",
    "plan_size",
    "prompts_jsonl",
    "protocol_from_dict",
    "to_raw",
    "yaml_load",
]
