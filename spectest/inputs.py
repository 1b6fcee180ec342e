"""Opening the input files a user names (a protocol, a prompt set, a samples file) so that
reading them can neither hang nor be refused without the file being named: ``open_input``,
``read_input`` and their exit-4 line.

The why and the details: docs/internals.md "spectest/inputs.py".
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import BinaryIO

from spectest.errors import InfrastructureError

_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
)


def refused(path: str | os.PathLike[str], what: str, reason: str) -> InfrastructureError:
    """The one line (exit 4) for an input file the machine would not let spectest read."""
    return InfrastructureError(f"{os.fspath(path)}: cannot read the {what}: {reason}")


def not_regular(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read as an input file, or None for a regular one."""
    for check, why in _KINDS:
        if check(mode):
            return why
    return None if stat.S_ISREG(mode) else "is not a regular file"


def open_input(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """Open ``path`` for binary reading; ``what`` names its role in messages ("protocol file").

    Raises ``InfrastructureError`` (exit 4) naming the path when it cannot be opened (permission
    denied, a component not searchable, an I/O error) or is not a regular file.

    Notes
    -----
    ``O_NONBLOCK`` makes the open of a FIFO without a writer return at once (it would block
    otherwise); the descriptor is then refused by ``fstat`` — checked on the open descriptor, so
    a file swapped between a ``stat`` and the ``open`` cannot slip through. A missing file is the
    caller's to report (``FileNotFoundError`` passes through).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise refused(path, what, "is a directory") from None
    except OSError as err:
        raise refused(path, what, err.strerror or type(err).__name__) from None
    try:
        why = not_regular(os.fstat(fd).st_mode)
        if why is not None:
            raise refused(path, what, why)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path`` (so a caller sees that it is longer than
    ``limit`` without reading it all); errors as ``open_input``, and a read error (EIO) names
    the file too."""
    with open_input(path, what) as f:
        try:
            return f.read(limit + 1)
        except OSError as err:
            raise refused(path, what, err.strerror or type(err).__name__) from None
