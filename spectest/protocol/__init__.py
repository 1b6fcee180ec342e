"""Protocols: YAML → one frozen, validated, hashed ``Protocol`` (expanded by ``spectest.plan``),
one module per concern. The format: docs/protocols.md "Protocol reference"; the details:
docs/internals.md "spectest/protocol/__init__.py". The names other modules import from here;
the rest live in the submodules.
"""

from spectest.models.dtypes import DTYPES
from spectest.protocol.arms import MATCHED, ArmRole, arm_specs, is_plain_null
from spectest.protocol.budget import DEFAULT_MAX_TOKENS, plan_size
from spectest.protocol.load import load_protocol
from spectest.protocol.parse import protocol_from_dict
from spectest.protocol.spec import EngineChoice, Protocol, to_raw
from spectest.schema import Q_MODES

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DTYPES",
    "MATCHED",
    "Q_MODES",
    "ArmRole",
    "EngineChoice",
    "Protocol",
    "arm_specs",
    "is_plain_null",
    "load_protocol",
    "plan_size",
    "protocol_from_dict",
    "to_raw",
]
