"""The one exception family of spectest and the documented process exit codes.

Owns: ``SpectestError`` and its subclasses, and the mapping from outcome to exit code.
Knows nothing about the CLI framework; the CLI catches ``SpectestError`` at the boundary and
prints ``str(err)`` as one line, then exits with ``err.exit_code``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes (documented in README.md and ``spectest --help``)."""

    OK = 0  # no difference detected and the teeth are sound
    DIFFERENT = 1  # the distributions differ (failing cells listed)
    BAD_INPUT = 2  # bad input or usage
    INCONCLUSIVE = 3  # the harness is unsound for this run (teeth failed, or power too low)


class SpectestError(Exception):
    """Base of every error spectest raises on purpose. The message is one complete line."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class ConfigError(SpectestError):
    """A protocol / YAML / option problem: names the file, the field and the bad value."""


class InputError(SpectestError):
    """Bad data: a samples file, a Parquet file, a model directory, a tensor argument."""


class ModelError(SpectestError):
    """A model cannot be built or loaded, or target and draft are incompatible (vocab mismatch)."""


class EngineError(SpectestError):
    """An engine under test cannot be loaded or broke its contract (a malformed return): names
    the engine or plug-in. Bad input, never a statistical verdict."""


class NumericsError(SpectestError):
    """NaN / inf logits or probabilities that do not form a distribution."""
