"""The one exception family of spectest and the documented process exit codes.

Owns ``SpectestError`` and its subclasses, the mapping from outcome to exit code, and the one-line
wording of a fault of the machine (``infrastructure_error``); not the CLI's boundary
(``cli.common.boundary``). Why 4 is its own code: docs/verdict.md "Why infrastructure is exit 4".
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes (documented in README.md and ``spectest --help``)."""

    OK = 0  # no difference detected and the teeth are sound
    DIFFERENT = 1  # the distributions differ (failing cells listed)
    BAD_INPUT = 2  # bad input or usage
    INCONCLUSIVE = 3  # the harness is unsound for this run (teeth failed, or power too low)
    INFRASTRUCTURE = 4  # no verdict: filesystem, permissions, disk full, missing package,
    # killed subprocess, internal error (a run directory locked by another writer is 2: usage)


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


class InfrastructureError(SpectestError):
    """The machine refused: a file or directory could not be created, read or written
    (permissions, read-only, disk full, a path component that is a file), an optional package
    is missing, or a subprocess died. Says nothing about the sampler or the user's input."""

    exit_code = ExitCode.INFRASTRUCTURE


def os_error_line(err: OSError, what: str = "") -> str:
    """One line for an ``OSError``: ``<what>: <path>: <reason>`` (``what`` names the role of the
    path, e.g. ``--out``), the reason as the OS words it (``Permission denied``, ``No space left
    on device``, ``Not a directory``)."""
    reason = err.strerror or type(err).__name__
    path = err.filename if err.filename is not None else ""
    parts = [p for p in (what, str(path) if path != "" else "", reason) if p]
    if err.filename2 is not None:
        parts.insert(-1, f"-> {err.filename2}")
    return ": ".join(parts)
