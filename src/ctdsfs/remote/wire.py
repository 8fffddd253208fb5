"""What a remote source believes of a server's answer, and how long it waits for one.

Shared by the S3 and HTTP clients of ``remote.store``: the failures a request
can end in, the exact check of a ranged answer (status, ``Content-Range``,
length, encoding), the total deadline of every request (``Deadlines``),
which the per-read ``timeout`` alone cannot give: a server trickling one byte a
second never lets a read time out, and the bytes an answer may bring at all
(``CappedReader``): botocore reads an error body or a listing page whole before
parsing it, and urllib3 reads a chunk-size line to its end, so without a cap a
server could make the daemon hold gigabytes within the deadline.
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
ANSWER_BYTES = 256 << 10  # an answer's status line, headers and error body, beyond its data
LIST_PAGE_MOST = 8 << 20  # bytes of a page of an S3 listing (1000 keys of up to 1 KiB, escaped)
CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+)")


class RemoteError(BlockError):
    """A remote read failed after its retries (or found the object replaced)."""


class TransientFailure(Exception):
    """A failure worth another attempt (5xx, 429, reset, timeout, a wrong answer)."""


class AnswerTooLong(TransientFailure):
    """An answer brought more bytes than its request allows (``answer_bytes``)."""


class ObjectReplaced(Exception):
    """The server holds another version than the one pinned (412, or another ETag)."""


class ObjectMissing(Exception):
    """No such object (404)."""


@dataclasses.dataclass(frozen=True)
class ObjectVersion:
    size: int
    etag: str  # what pins this version: its ETag, or DATE_PIN + its Last-Modified date
    mtime: float


def parsed_size(text, url):
    """A size header or listing field, checked: a one-line error naming ``url`` if it is
    not a non-negative integer."""
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


def answer_bytes(length):
    """Bytes an answer to a request for ``length`` bytes of data may bring in all (its
    status line and headers, or an error body, and one byte more than asked for)."""
    return ANSWER_BYTES + length + 1


class CappedReader:
    """A response's socket file that yields at most ``most`` bytes (status line, headers
    and body together), then raises AnswerTooLong; no read asks it for more than one
    byte beyond that (so neither a huge read size nor an endless line is ever held)."""

    def __init__(self, raw, most):
        self._raw, self._left, self._most = raw, most, most

    def _room(self, size):
        room = self._left + 1
        return room if size is None or size < 0 or size > room else size

    def _took(self, count):
        self._left -= count
        if self._left < 0:
            raise AnswerTooLong(f"an answer longer than {self._most} bytes")

    def read(self, size=-1):
        data = self._raw.read(self._room(size))
        self._took(len(data))
        return data

    def read1(self, size=-1):
        data = self._raw.read1(self._room(size))
        self._took(len(data))
        return data

    def readline(self, size=-1):
        data = self._raw.readline(self._room(size))
        self._took(len(data))
        return data

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        count = self._raw.readinto(view[:self._room(len(view))])
        self._took(count or 0)
        return count

    def __getattr__(self, name):  # close, closed, fileno, peek ... as the socket file's
        return getattr(self._raw, name)


def capped_response_class(response_class, most):
    """``response_class`` (http.client's), its socket file capped at ``most`` bytes."""
    def make(*args, **kwargs):
        response = response_class(*args, **kwargs)
        response.fp = CappedReader(response.fp, most)
        return response
    return make


def check_range(status, header, start, end, size):
    """Raise TransientFailure unless an answer (``status``, ``header(name)``) is exactly bytes
    ``start`` to ``end`` of an object of ``size`` bytes, unencoded: any other range, total,
    length or a compressed body would be served as the bytes asked for."""
    asked = f"bytes {start}-{end - 1}/{size}"
    encoding = (header("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise TransientFailure(f"a {encoding}-encoded answer for {asked}")
    if status == 206:
        given = (header("Content-Range") or "").strip()
        match = CONTENT_RANGE.fullmatch(given)
        if not match or tuple(map(int, match.groups())) != (start, end - 1, size):
            raise TransientFailure(f"Content-Range {given[:80]!r} for {asked}")
    elif (start, end) != (0, size):
        raise TransientFailure(f"HTTP {status} instead of the range asked for")
    length = header("Content-Length")
    if length is not None and length.strip() != str(end - start):
        raise TransientFailure(f"Content-Length {length[:40]!r} for {asked}")


def check_head(status, header):
    """Raise TransientFailure unless a HEAD's answer (``status``, ``header(name)``) describes
    the whole object, unencoded: its size would be believed, and a new size or ETag makes
    the object replaced."""
    encoding = (header("Content-Encoding") or "identity").strip().lower()
    ranged = header("Content-Range") is not None
    if status != 200 or ranged or encoding != "identity":
        raise TransientFailure(f"a HEAD answered with HTTP {status}, "
                               f"{'a range' if ranged else 'no range'}, {encoding[:40]}")


def check_body(body, start, end):
    """The body read (at most one byte more than asked for) must be exactly as long."""
    if len(body) != end - start:
        more = "more" if len(body) > end - start else f"{len(body)}"
        raise TransientFailure(f"{more} bytes where {end - start} were asked for")
    return body


class _Watch:
    """One request under a deadline: the connection it runs on, once it has one."""

    def __init__(self, most):
        self.connection = None  # set by the connection at each request
        self.most = most  # bytes one answer may bring (CappedReader)
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

    A client's connection class calls ``attach(self)`` when it sends a request, and
    caps the answer's bytes at ``most_bytes()``; the request's thread runs it inside
    ``watching(seconds, most)``. A cut request fails (a reset connection) and
    ``watching`` raises TransientFailure for it."""

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
    def until(self, when):
        """Requests this thread makes meanwhile end by ``when`` (monotonic; None: no
        limit) at the latest, whatever their own deadlines: a user's request waits for
        them no longer (``remote_retry.user_request``)."""
        before = getattr(self._local, "until", None)
        self._local.until = when
        try:
            yield
        finally:
            self._local.until = before

    def most_bytes(self):
        """Bytes an answer to this thread's request may bring (ANSWER_BYTES outside one)."""
        watch = getattr(self._local, "watch", None)
        return ANSWER_BYTES if watch is None else watch.most

    @contextlib.contextmanager
    def watching(self, seconds, most):
        """Run a request that must end within ``seconds``, each answer within ``most``
        bytes."""
        until = getattr(self._local, "until", None)
        if until is not None:
            seconds = min(seconds, until - time.monotonic())
            if seconds <= 0:
                raise TransientFailure("no time left for another attempt")
        with self._starting:
            if not self._started:
                self._start()
        watch = _Watch(most)
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
            raise TransientFailure(f"no complete answer within {seconds:.3g} s")
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
