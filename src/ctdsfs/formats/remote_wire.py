"""What a remote source believes of a server's answer, and how long it waits for one.

Shared by the S3 and HTTP clients of ``formats.remote``: the failures a request
can end in, the exact check of a ranged answer (status, ``Content-Range``,
length, encoding), and the total deadline of every request (``Deadlines``),
which the per-read ``timeout`` alone cannot give: a server trickling one byte a
second never lets a read time out.
"""

import contextlib
import dataclasses
import heapq
import itertools
import os
import re
import socket
import threading
import time

from ..errors import BlockError, CtdsfsError

DATE_PIN = "Last-Modified: "  # a version pinned by its date and size (a server without ETags)
FLOOR_BYTES = 1 << 20  # a request may take `timeout` seconds, and as much again per MiB asked
CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+)")


class RemoteError(BlockError):
    """A remote read failed after its retries (or found the object replaced)."""


class _Transient(Exception):
    """A failure worth another attempt (5xx, 429, reset, timeout, a wrong answer)."""


class _Replaced(Exception):
    """The server holds another version than the one pinned (412, or another ETag)."""


class _Missing(Exception):
    """No such object (404)."""


@dataclasses.dataclass(frozen=True)
class _Version:
    size: int
    etag: str  # what pins this version: its ETag, or DATE_PIN + its Last-Modified date
    mtime: float


def _length(text, url):
    try:
        size = int(text)
    except (TypeError, ValueError):
        raise CtdsfsError(f"{url}: the server gives no valid size ({text!r})") from None
    if size < 0:
        raise CtdsfsError(f"{url}: the server gives a negative size")
    return size


def deadline(options, length):
    """Seconds a request for ``length`` bytes may take from its connect to its last byte:
    ``timeout``, and ``timeout`` again for every MiB (a floor on the transfer rate)."""
    return options.timeout * (1 + length / FLOOR_BYTES)


def check_range(status, header, start, end, size):
    """Raise _Transient unless an answer (``status``, ``header(name)``) is exactly bytes
    ``start`` to ``end`` of an object of ``size`` bytes, unencoded: any other range, total,
    length or a compressed body would be served as the bytes asked for."""
    asked = f"bytes {start}-{end - 1}/{size}"
    encoding = (header("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise _Transient(f"a {encoding}-encoded answer for {asked}")
    if status == 206:
        given = (header("Content-Range") or "").strip()
        match = CONTENT_RANGE.fullmatch(given)
        if not match or tuple(map(int, match.groups())) != (start, end - 1, size):
            raise _Transient(f"Content-Range {given[:80]!r} for {asked}")
    elif (start, end) != (0, size):
        raise _Transient(f"HTTP {status} instead of the range asked for")
    length = header("Content-Length")
    if length is not None and length.strip() != str(end - start):
        raise _Transient(f"Content-Length {length[:40]!r} for {asked}")


def check_body(body, start, end):
    """The body read (at most one byte more than asked for) must be exactly as long."""
    if len(body) != end - start:
        more = "more" if len(body) > end - start else f"{len(body)}"
        raise _Transient(f"{more} bytes where {end - start} were asked for")
    return body


class _Watch:
    """One request under a deadline: the connection it runs on, once it has one."""

    def __init__(self):
        self.connection = None  # set by the connection at each request
        self.expired = False
        self.done = False

    def cut(self):
        """Shut the connection's socket down: whatever waits on it returns at once."""
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # (under TLS too: the raw fd)


class Deadlines:
    """One thread that cuts the connection of every request still running at its deadline.

    A client's connection class calls ``attach(self)`` when it sends a request; the
    request's thread runs it inside ``watching(seconds)``. A cut request fails (a reset
    connection) and ``watching`` raises _Transient for it."""

    def __init__(self):
        self._local = threading.local()
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self):
        """(A forked child starts its own thread, at its first request.)"""
        self._starting = threading.Lock()
        self._started = False

    def _start(self):
        self._started = True
        self._cond = threading.Condition()
        self._heap = []  # (when, sequence number, _Watch)
        self._numbers = itertools.count()
        threading.Thread(target=self._run, name="ctdsfs-deadlines", daemon=True).start()

    def attach(self, connection):
        watch = getattr(self._local, "watch", None)
        if watch is not None:
            watch.connection = connection

    @contextlib.contextmanager
    def watching(self, seconds):
        with self._starting:
            if not self._started:
                self._start()
        watch = _Watch()
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._numbers), watch))
            self._cond.notify()
        self._local.watch = watch
        failure = None
        try:
            yield watch
        except Exception as exc:  # a cut request fails in whatever way its client says
            failure = exc
        finally:
            self._local.watch = None
            with self._cond:  # (no cut after this: the connection goes back to its pool)
                watch.done = True
        if watch.expired:
            raise _Transient(f"no complete answer within {seconds:.3g} s")
        if failure is not None:
            raise failure

    def _run(self):
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                watch = heapq.heappop(self._heap)[2]
                watch.expired = True
                watch.cut()


DEADLINES = Deadlines()
