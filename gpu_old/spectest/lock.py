"""One writer per run directory: an exclusive ``flock`` on ``<run>/.lock``.

Owns: taking, naming and releasing the lock, and the rule that a killed holder never leaves a
stale lock behind. Knows nothing about what a run directory holds (``spectest.store``).
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path

from spectest.errors import ConfigError

LOCK_FILE = ".lock"


class DirLock:
    """An exclusive ``flock`` on ``<run>/.lock``, held by an open descriptor.

    NOTE: flock, not a pid file: the kernel releases it when the descriptor is closed, and so when
    the holder dies in any way (SIGKILL, OOM), so a lock is never stale. The file is left in
    place (unlinking a locked file races a second opener) and holds the holder's pid for the
    message. The descriptor is not inherited by subprocesses (``os.open`` is non-inheritable).

    NOTE: the lock keeps other processes out. Within one process a new ``RunDir`` on a directory
    takes over the lock of an earlier one that was never released — a run that raised, whose
    frames a caller still holds (spectest never writes one directory from two threads).
    """

    def __init__(self, fd: int, key: str) -> None:
        self.fd: int | None = fd
        self.key = key
        _HELD[key] = self

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            if _HELD.get(self.key) is self:
                del _HELD[self.key]
            os.close(fd)  # closing the descriptor drops the flock

    def __del__(self) -> None:  # a RunDir dropped without release (an exception) unlocks too
        self.release()


# this process's live locks, by real path of the run directory; weak, so a RunDir that is
# dropped without release (a run that raised) still unlocks when it is collected
_HELD: weakref.WeakValueDictionary[str, DirLock] = weakref.WeakValueDictionary()


def lock_dir(run: Path) -> DirLock:
    """Take the lock of the existing directory ``run`` without waiting: a live holder in another
    process is a ``ConfigError`` naming its pid (exit 2); an ``OSError`` (permissions, read-only)
    is left to the caller, which knows the role of the path."""
    key = os.path.realpath(run)
    held = _HELD.get(key)
    if held is not None:
        held.release()  # abandoned by an earlier RunDir of this process (see DirLock)
    fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)  # umask applies
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise ConfigError(
            f"{run}: another spectest process{who} is writing to this run directory; "
            "wait for it to finish or choose another --out"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirLock(fd, key)
