"""How long a remote source keeps trying: retries with backoff, one time budget for
everything a user's request waits for, and background checks for a newer state.

A FUSE request (a read, a lookup, a listing) may need several chunks, each GET
may be retried, and the kernel retries a failed read itself: without one budget
for the whole request those add up (a read of 128 KiB once took more than 30 s
from a stalling server). ``user_request()`` marks where a request starts; every
remote read it makes, however many chunks, GETs and attempts, ends by that start
plus ``budget(options)``, and a chunk that failed a moment ago fails at once
again (``RemoteStore``'s failed chunks) rather than being asked for anew at each
of the kernel's retries.
"""

import contextlib
import contextvars
import logging
import threading
import time

from ..errors import CtdsfsError
from .wire import DEADLINES, ObjectMissing, RemoteError, TransientFailure

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 2.0  # seconds between attempts, doubling
UNREACHABLE_RECHECK = 10.0  # seconds between checks while the server does not answer
_REQUEST_START = contextvars.ContextVar("ctdsfs_request_start", default=None)


def backoffs(retries):
    """The pauses between ``retries + 1`` attempts."""
    return [min(BACKOFF_FIRST * 2 ** i, BACKOFF_MAX) for i in range(retries)]


def budget(options):
    """Seconds a user's request may wait for a remote object in all: ``timeout`` for each
    attempt, and the pauses between them. A GET's own deadline may be longer (``timeout``
    per MiB too): it is cut at the request's, so a whole chunk read by a stream must come
    in within this time."""
    return (options.retries + 1) * options.timeout + sum(backoffs(options.retries))


@contextlib.contextmanager
def user_request():
    """One request of a user (a FUSE read, lookup or listing): the remote reads made
    inside share one budget, counted from here (an inner call keeps the outer start)."""
    if _REQUEST_START.get() is not None:
        yield
        return
    token = _REQUEST_START.set(time.monotonic())
    try:
        yield
    finally:
        _REQUEST_START.reset(token)


def request_deadline(options):
    """When (monotonic) the current user's request must be answered by: its start plus
    ``budget(options)``, or now plus that outside one (a library call)."""
    start = _REQUEST_START.get()
    return (time.monotonic() if start is None else start) + budget(options)


class OutOfTime(RemoteError):
    """A request's time was spent before this GET could be asked for: the server was not
    asked, so nothing is known of the bytes (not remembered as failed)."""


def retried(label, options, what, request, *args, until=None):
    """``request(*args)`` with bounded retries and backoff; RemoteError once they are
    spent, or once no attempt can start before ``until`` (monotonic), by when every
    attempt is cut."""
    pauses = backoffs(options.retries) + [None]
    reason, attempts = "no time left", 0
    for pause in pauses:
        if until is not None and time.monotonic() >= until:
            break
        attempts += 1
        try:
            with DEADLINES.until(until):
                return request(*args)
        except TransientFailure as exc:
            reason = str(exc)
        except ObjectMissing:
            raise RemoteError(f"{label}: no such object", f"{what}: no such object") from None
        if pause is None or (until is not None and time.monotonic() + pause >= until):
            break
        time.sleep(pause)
    if not attempts:
        detail = f"{what}: the request's time was spent before it could be asked for"
        raise OutOfTime(f"{label}: {detail}", detail)
    detail = f"{what} failed {attempts} times ({reason[:200]})"
    raise RemoteError(f"{label}: {detail}", detail)


class Revalidation:
    """Background checks for a newer state of remote things (an object's version, a
    prefix's listing), shared by RemoteStore and the directory sources: at most every
    ``interval`` seconds, at once when ``take(urgent=True)`` (a read found another
    version), one attempt each, so a lookup never waits for the network. A check that
    fails, in whatever way, changes nothing shown: what is known is served (stale if
    error, as HTTP caches do), said once in the log until a check succeeds again, and
    the server is asked only every UNREACHABLE_RECHECK seconds meanwhile."""

    def __init__(self, label, interval, check, what, start=None):
        self.label, self.interval, self.what = label, interval, what
        self._check = check  # one attempt: what it found (None: nothing new), or raises
        self._start = start or self._in_thread  # runs a function in the background
        self._lock = threading.Lock()
        self._checked = time.monotonic()  # when the last check ended
        self._running = False  # a check in flight
        self._found = None  # what a finished check found, until taken
        self.unreachable = False  # the last check failed

    @staticmethod
    def _in_thread(function):
        threading.Thread(target=function, name="ctdsfs-check", daemon=True).start()

    def take(self, urgent=False):
        """What the last finished check found (None if nothing, or taken already);
        the next check starts here when it is due."""
        interval = max(self.interval, UNREACHABLE_RECHECK) if self.unreachable \
            else self.interval
        with self._lock:
            start = not self._running and (urgent
                                           or time.monotonic() - self._checked >= interval)
            self._running = self._running or start
            found, self._found = self._found, None
        if start:
            self._start(self._run)
        return found

    def _run(self):
        found = None
        try:
            found = self._check()
        except (TransientFailure, ObjectMissing, CtdsfsError) as exc:
            self._failed(str(exc) or "no such object")
        except Exception as exc:  # (an answer no client foresaw: still only a failed check)
            self._failed(f"{type(exc).__name__}: {str(exc)[:200]}")
        else:
            if self.unreachable:
                log.info("%s: reachable again", self.label)
            self.unreachable = False
        finally:  # whatever happened, the next check may start
            with self._lock:
                self._found, self._running = found, False
                self._checked = time.monotonic()

    def _failed(self, reason):
        if not self.unreachable:
            log.warning("%s: cannot %s (%s): serving what is known until it answers "
                        "(stale if error)", self.label, self.what, reason)
        self.unreachable = True
