"""A mount of a server that answered honestly and then misbehaves (``hostile_http``, one
misbehaviour a mode): each user's read, stat and listing ends within its bound, the
listing and the bytes fetched before stay served, and only bytes never fetched are EIO."""

import json
import os
import subprocess
import sys
import time

import pytest

from ..conftest import evicted
from .conftest import FILE_SIZE, OPTIONS, RETRIES, TIMEOUT, each
from .hostile_http import LISTING_MODES, MODES, STALL_MODES

# What a user's read(2), stat or readdir may take whatever the server does, as docs/remote.md
# promises it: (retries + 1) x timeout and about a second (here with a margin for a loaded
# machine); a read of a chunk that failed a moment ago fails at once, without waiting for
# the server (FAST: less than one attempt's timeout, even on a loaded machine).
BOUND = (RETRIES + 1) * TIMEOUT + 1.5
FAST = TIMEOUT
# Reads through a mount in a child (a hang ends there, not in pytest): the tail of
# "second" (never fetched) twice, a listing, a stat, and "first" (fetched whole while the
# server was honest) with its pages dropped from the page cache, so the daemon serves it.
USER = """
import json, os, sys, time
directory, size = sys.argv[1], int(sys.argv[2])
def timed(step):
    began = time.monotonic()
    try:
        value = step()
    except OSError as exc:
        value = os.strerror(exc.errno)
    return [value, time.monotonic() - began]
def tail():
    fd = os.open(os.path.join(directory, "second"), os.O_RDONLY)
    try:
        return os.pread(fd, 65536, size - 65536).hex()
    finally:
        os.close(fd)
def first():
    fd = os.open(os.path.join(directory, "first"), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, size, 0).hex()
    finally:
        os.close(fd)
print(json.dumps({"tail": timed(tail), "again": timed(tail),
                  "ls": timed(lambda: sorted(os.listdir(directory))),
                  "stat": timed(lambda: os.stat(os.path.join(directory, "second")).st_size),
                  "first": timed(first)}))
"""


def _as_a_user(directory):
    done = subprocess.run([sys.executable, "-c", USER, str(directory), str(FILE_SIZE)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _misbehaving(container, hostile, mount, monkeypatch, where, mode):
    """Mount ``where`` ("http", "s3" an object, "s3-prefix" the bucket holding it) from an
    honest server, list it and read "first" whole; then
    let the server misbehave as ``mode`` in everything it answers (revalidations and
    listings too), and read as a user would, twice: at once, and once the revalidation
    had time to fail. Returns the problems found (none: every bound and outcome held)."""
    data, contents = container
    server = hostile(data, "honest", everything=True)
    options = [OPTIONS, "revalidate=1"]
    source, inside = server.url(), ""
    if where != "http":
        options.append(f"endpoint_url=http://127.0.0.1:{server.port}")
        source = "s3://bucket/" + ("" if where == "s3-prefix" else "object.mf")
        inside = "object.mf" if where == "s3-prefix" else ""
    m = mount(source, options, name=f"{where}-{mode}")
    directory = m.mountpoint / inside
    assert sorted(os.listdir(directory)) == ["first", "second"]
    for _ in range(2):  # (the second time its last chunk comes whole, into the cache)
        assert evicted(directory / "first").read_bytes() == contents["first"]
    server.mode = mode
    os.listdir(m.mountpoint)  # (a revalidation starts, in the background)
    served = {"second"} if mode in LISTING_MODES | {"no-validators"} else {"Input/output error"}
    if mode == "etag-flips":  # (readahead may have fetched it before the switch, or not)
        served = {"second", "Input/output error"}
    problems = []
    for round in ("at once", "after a revalidation"):
        if round != "at once":
            time.sleep(TIMEOUT + 0.5)  # (the revalidation started at the switch has failed)
        seen = _as_a_user(directory)
        tail, seconds = seen["tail"]
        tail = "second" if tail == contents["second"][-65536:].hex() else tail
        if tail not in served or seconds > BOUND:
            problems.append(f"{round}: a read of unfetched bytes: {tail[:40]} in {seconds:.2f} s")
        tail, seconds = seen["again"]
        if tail == "Input/output error" and seconds > FAST:
            problems.append(f"{round}: a failed chunk read again took {seconds:.2f} s")
        for step, want in (("ls", ["first", "second"]), ("stat", FILE_SIZE),
                           ("first", contents["first"].hex())):
            value, seconds = seen[step]
            if value != want or seconds > BOUND:
                problems.append(f"{round}: {step}: {str(value)[:40]} in {seconds:.2f} s")
    log = m.log_text()
    if "Traceback" in log or log.count("(stale if error)") > 1:
        problems.append(f"log: {log[-1500:]}")
    return problems


@pytest.mark.fuse
def test_a_server_stalling_in_any_phase_costs_a_read_its_bound_and_no_more(
        container, hostile, mount, monkeypatch):
    """A server that answers the header well and then stalls, before its status line,
    in its headers, before its first body byte, mid-body, between chunks, on the
    revalidation HEAD and on a listing: each user's read(2), stat and readdir returns
    within (retries + 1) x timeout and about a second; a chunk that just failed fails
    at once when the kernel (or the user) asks again; the listing and the bytes fetched
    before are served throughout. Over HTTP, and over S3 as an object and a prefix."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hostile")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hostile")
    cases = [("http", mode) for mode in sorted(STALL_MODES)] \
        + [("s3", mode) for mode in ("stall-before-status", "stall-after-headers",
                                     "trickled-body")] \
        + [("s3-prefix", mode) for mode in ("slow-headers", "half-body-held",
                                            "stall-between-chunks")]
    assert each(cases, lambda where, mode: _misbehaving(
        container, hostile, mount, monkeypatch, where, mode)) == {}


@pytest.mark.fuse
def test_a_failing_revalidation_keeps_the_listing_and_the_fetched_bytes_served(
        container, hostile, mount, monkeypatch):
    """Every other way the server can fail, in the revalidation (a HEAD, or a prefix's
    listing) as in the GETs: the listing and attributes known, and the bytes fetched,
    stay served (stale if error, said once in the log); only bytes never fetched are
    EIO, each within the read's bound."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hostile")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hostile")
    cases = [("http", mode) for mode in sorted(MODES - STALL_MODES - {"honest"})] \
        + [("s3", mode) for mode in ("wrong-range", "gzip-bomb", "endless-body", "503")] \
        + [("s3-prefix", mode) for mode in ("etag-flips", "reset", "redirect-self")]
    assert each(cases, lambda where, mode: _misbehaving(
        container, hostile, mount, monkeypatch, where, mode)) == {}
