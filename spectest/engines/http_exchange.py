"""One HTTP exchange under a deadline for the ``http`` engine: connect, send and every byte of
the reply within ``timeout_s``, redirects returned and never followed, a reply longer than
``MAX_REPLY_BYTES`` refused, and the sockets of a job's requests in flight, which one failure
cancels at once (docs/engines.md "The http engine: seeds, loopback, replies, timeouts").
Knows nothing about requests, replies or sampling.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from urllib.parse import urlparse

MAX_REPLY_BYTES = 64 * 2**20  # a reply of T token ids is far shorter: longer = a runaway server


class TooLong(Exception):
    """A reply longer than ``MAX_REPLY_BYTES`` (a contract violation, not retried)."""


class Cancelled(Exception):
    """A request abandoned because another request of the job already failed."""


class Inflight:
    """The sockets of a job's requests in flight, and its cancellation: ``cancel`` shuts every
    socket down (a blocked read returns at once) and stops new attempts and backoff sleeps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait_cancelled(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self._event.is_set():
                raise Cancelled()
            self._socks.add(sock)

    def discard(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def exchange(
    method: str,
    url: str,
    data: bytes | None,
    timeout_s: float,
    inflight: Inflight | None = None,
) -> tuple[int, str | None, bytes]:
    """One HTTP request, the whole exchange (connect, send, every byte of the reply) within
    ``timeout_s``: (status, Location header, body). Redirects are returned, never followed, so
    the loopback allow-list checked on ``url`` is the only host ever contacted. Raises
    ``TimeoutError`` past the deadline, ``OSError`` / ``http.client.HTTPException`` when the
    connection fails (``IncompleteRead`` when it closes before the body its ``Content-Length``
    announced: a server dying mid-reply), ``TooLong`` for a reply longer than
    ``MAX_REPLY_BYTES``."""
    u = urlparse(url)
    deadline = time.monotonic() + timeout_s
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname or "", u.port, timeout=timeout_s)
    sock: socket.socket | None = None
    try:
        conn.connect()
        sock = conn.sock
        assert sock is not None
        if inflight is not None:
            inflight.add(sock)

        def left() -> float:
            rest = deadline - time.monotonic()
            if rest <= 0:
                raise TimeoutError(f"no complete reply within {timeout_s:g} s")
            return rest

        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        sock.settimeout(left())
        conn.request(method, target, body=data, headers=headers)
        sock.settimeout(left())
        resp = conn.getresponse()
        chunks, size = [], 0
        while True:
            sock.settimeout(left())
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise TooLong()
            chunks.append(chunk)
        if resp.length:  # bytes announced and never sent (``read1`` returns b"" at a closed socket)
            raise http.client.IncompleteRead(b"".join(chunks), resp.length)
        return resp.status, resp.getheader("Location"), b"".join(chunks)
    except TimeoutError:  # the deadline, or a socket timeout set to what was left of it
        raise TimeoutError(f"no complete reply within {timeout_s:g} s") from None
    finally:
        if inflight is not None and sock is not None:
            inflight.discard(sock)
        conn.close()
