"""A remote container on a misbehaving HTTP server (``remote.hostile_http``, one misbehaviour a
mode): every read ends in the right bytes, EIO or a one-line refusal within the
configured limits, and a listing of the mount answers throughout."""

import dataclasses
import errno
import json
import os
import subprocess
import sys
import time

import pytest

from ctdsfs.formats import open_container
from ctdsfs.remote.store import FAILED_SECONDS, RemoteError, RemoteOptions, open_remote

from ..conftest import DATA
from .conftest import CHUNK, FILE_SIZE, LIMIT, OPTIONS, RETRIES, TIMEOUT, each
from .hostile_http import HUGE

RIGHT, EIO, REFUSED = "right bytes", "EIO", "refused"
OUTCOMES = {
    "honest": RIGHT,
    "wrong-range": EIO, "shifted-range": EIO, "wrong-total": EIO, "gzip-bomb": EIO,
    "longer-body": EIO, "endless-body": EIO, "endless-chunked": EIO, "ignored-range": EIO,
    "503": EIO, "reset": EIO, "etag-flips": EIO, "trickled-body": EIO,
    "half-body-held": EIO, "stall-before-status": EIO, "stall-after-headers": EIO,
    "stall-between-chunks": EIO,
    "slow-headers": REFUSED, "huge-headers": REFUSED, "many-headers": REFUSED,
    "long-headers": REFUSED,
    "no-validators": REFUSED, "redirect-port": REFUSED, "redirect-self": REFUSED,
    "redirect-file": REFUSED, "redirect-unresolvable": REFUSED,
}


# the modes an S3 endpoint is tried with too: where botocore's own handling matters
S3_MODES = {"honest", "wrong-range", "gzip-bomb", "endless-body", "trickled-body",
            "half-body-held", "slow-headers", "no-validators", "redirect-self", "503",
            "long-headers"}


def _answered(data, hostile, scheme, mode):
    """A read of a chunk's tail, the next chunk and the head of the one after from a
    server misbehaving as ``mode``: the problems found (none: the outcome is the one
    OUTCOMES says, said in one line, within LIMIT, and no request asked for an encoding)."""
    server = hostile(data, mode)
    options = RemoteOptions(timeout=TIMEOUT, retries=RETRIES, chunk_size=CHUNK, readahead=2)
    url = server.url()
    if scheme == "s3":
        url = "s3://bucket/object.mf"
        options = dataclasses.replace(options, endpoint_url=f"http://127.0.0.1:{server.port}",
                                      key="hostile", secret="hostile")
    problems = []
    began = time.monotonic()
    try:
        store = open_remote(url, options)
        try:
            # (GETs of a piece's own bytes, chunk 1's tail and chunk 3's head, and of the
            # whole chunk 2 between them)
            outcome = RIGHT if store.pread(CHUNK + 100, 2 * CHUNK) \
                == data[CHUNK + 100:3 * CHUNK + 100] else "wrong bytes"
        except RemoteError as exc:
            outcome = EIO
            problems += [f"not one line: {exc}"] if "\n" in str(exc) else []
        finally:
            store.close()
    except RemoteError as exc:
        outcome = REFUSED
        problems += [f"not one line: {exc}"] if "\n" in str(exc) else []
    seconds = time.monotonic() - began
    if outcome != OUTCOMES[mode] or seconds >= LIMIT:
        problems.append(f"{outcome} in {seconds:.2f} s")
    encodings = {h.get("accept-encoding") for _, h in server.requests} - {"identity"}
    problems += [f"asked for encodings {encodings}"] if encodings else []
    return problems


@pytest.mark.parametrize("scheme,modes", [("http", sorted(OUTCOMES)), ("s3", sorted(S3_MODES))],
                         ids=["http", "s3"])
def test_every_answer_is_checked_and_every_request_ends(container, hostile, scheme, modes):
    """Each misbehaviour as a web server's (urllib3) and as an S3 endpoint's (botocore,
    path-style requests; the server checks no signature), a few at a time (most of them
    wait out a timeout)."""
    data, _ = container
    assert each([(mode,) for mode in modes],
                 lambda mode: _answered(data, hostile, scheme, mode)) == {}


# Requests in a fresh interpreter (its address space capped, so that a client holding a
# server's bytes fails there rather than here): each one's outcome and duration, and how
# much the peak RSS grew over them all.
PROBE = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from ctdsfs.remote.store import RemoteError, RemoteOptions, open_remote, retried, s3_backend
def peak():  # (VmHWM: ru_maxrss would be pytest's, kept across fork and exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))
(timeout, retries, chunk, offset), endpoints = json.loads(sys.argv[1])
cases, results = [], []
for endpoint, what in endpoints:
    options = RemoteOptions(timeout=timeout, retries=retries, chunk_size=chunk, readahead=2,
                            endpoint_url=endpoint, key="hostile", secret="hostile")
    cases.append((what, open_remote("s3://bucket/object.mf", options) if what == "read"
                  else s3_backend("s3://bucket/", options), options))
base = peak()
for what, client, options in cases:
    began = time.monotonic()
    try:
        if what == "read":
            client.pread(offset, 1000)
        else:
            retried("s3://bucket/", options, "LIST", client.list, "", 100_000)
        outcome = "served"
    except RemoteError as exc:
        outcome = str(exc)
    results.append((outcome, time.monotonic() - began))
print(json.dumps([results, peak() - base]))
"""
TOO_LONG = "an answer longer than"
BOUNDED = [("huge-error-body", "read", TOO_LONG), ("endless-error-body", "read", TOO_LONG),
           ("endless-chunk-size", "read", TOO_LONG), ("huge-error-body", "list", TOO_LONG),
           ("huge-listing", "list", TOO_LONG), ("endless-listing", "list", "no new name")]


def test_an_s3_answer_never_makes_the_client_hold_more_than_it_allows(container, hostile):
    """botocore reads an error body or a listing page whole (and urllib3 a chunk-size line
    to its end): an answer of HUGE bytes, or an endless one, is a failed request that never
    grows the client's memory by more than a few MiB; nor does a listing whose pages go
    on for ever."""
    endpoints = [(f"http://127.0.0.1:{hostile(container[0], mode).port}", what)
                 for mode, what, _ in BOUNDED]
    settings = [TIMEOUT, RETRIES, CHUNK, CHUNK + 100]
    probe = subprocess.run([sys.executable, "-c", PROBE, json.dumps([settings, endpoints])],
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    results, growth = json.loads(probe.stdout)
    for (mode, what, reason), (outcome, seconds) in zip(BOUNDED, results):
        assert "failed 2 times (" in outcome and reason in outcome, (mode, what, outcome)
        assert "\n" not in outcome and seconds < LIMIT, (mode, what, seconds)
    assert growth < 32 << 20 < HUGE, f"{growth >> 20} MiB"


@pytest.mark.parametrize("mode", ["slow-headers", "trickled-body"])
def test_mount_returns_within_its_deadline_from_a_trickling_server(container, hostile,
                                                                  tmp_path, mode):
    """Its HEAD's headers, or the header's GET, trickled: one line, in time."""
    server = hostile(container[0], mode)
    (tmp_path / "mnt").mkdir()
    began = time.monotonic()
    result = subprocess.run(["mount.ctdsfs", server.url(), str(tmp_path / "mnt"), "-o", OPTIONS],
                            capture_output=True, text=True, timeout=60, check=False)
    assert time.monotonic() - began < LIMIT + 2  # (+ the command's start)
    assert result.returncode == 1 and "no complete answer within" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.fuse
@pytest.mark.parametrize("mode", ["half-body-held", "trickled-body"])
def test_listing_answers_while_a_read_fails(container, hostile, mount, mode):
    """The header and the files' first bytes (which tell whether they are nested
    containers) are served well, the rest is not: a read of it ends in EIO within the
    limit, never in wrong bytes, while ``ls -l`` and ``stat`` answer at once."""
    server = hostile(container[0], mode, honest_below=3 * CHUNK)  # (the tail of "second": chunk 4)
    m = mount(server.url(), [OPTIONS])
    began = time.monotonic()
    reader = subprocess.Popen(["tail", "-c", "4096", str(m.mountpoint / "second")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(0.3)  # (the read is under way)
        for _ in range(3):
            asked = time.monotonic()
            listing = subprocess.run(["ls", "-l", str(m.mountpoint)], capture_output=True,
                                     text=True, timeout=LIMIT, check=False)
            assert listing.returncode == 0 and "second" in listing.stdout
            assert os.stat(m.mountpoint / "second").st_size == FILE_SIZE
            assert time.monotonic() - asked < 0.5
        out, err = reader.communicate(timeout=LIMIT + 1)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode != 0 and b"Input/output error" in err and out == b""
    assert time.monotonic() - began < LIMIT + 1
    assert m.proc.poll() is None


@pytest.mark.fuse
def test_listing_never_waits_for_a_get(container, hostile, mount):
    """With a cache of one chunk, reading a file pushes the header's chunk out; a
    listing (which checks the header's counter) still answers from memory while the
    server holds every GET."""
    data, contents = container
    server = hostile(data, "honest")
    m = mount(server.url(), [OPTIONS, f"cache_size={CHUNK}"])
    assert sorted(os.listdir(m.mountpoint)) == ["first", "second"]
    for name in ("first", "second"):
        assert (m.mountpoint / name).read_bytes() == contents[name]
    server.mode = "half-body-held"
    for _ in range(3):
        asked = time.monotonic()
        listing = subprocess.run(["ls", "-l", str(m.mountpoint)], capture_output=True,
                                 text=True, timeout=LIMIT, check=False)
        assert listing.returncode == 0 and "second" in listing.stdout
        assert time.monotonic() - asked < 0.5


@pytest.mark.fuse
@pytest.mark.parametrize("where", ["http", "s3-prefix", "s3-prefix-mfh5"])
def test_nested_container_that_failed_on_the_network_is_a_directory_again(hostile, mount,
                                                                         monkeypatch, where):
    """A subtable (or a container object under a prefix) whose first GET failed gives
    EIO, not a plain file for the rest of the mount: once the server answers it is a
    directory again. So does a MultiHDF5 object whose header came but whose check (the
    HDF5 probe child's reads) met a server that did not answer."""
    if where.endswith("mfh5"):
        data = (DATA / "mh5_basic.mfh5").read_bytes()
        server = hostile(data, "stall-after-headers", honest_below=4096)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hostile")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hostile")
        # (a budget of 6.2 s: the probe child's start fits in it on a loaded machine)
        m = mount("s3://bucket/", ["timeout=3,retries=1,chunk_size=4096,readahead=1",
                                   f"endpoint_url=http://127.0.0.1:{server.port}"])
        for _ in range(2):  # (each within the request's bound, the probe child's reads too)
            began = time.monotonic()
            with pytest.raises(OSError) as failed:
                os.listdir(m.mountpoint / "object.mf")
            assert failed.value.errno == errno.EIO and time.monotonic() - began < 6.2 + 1.5
        server.mode = "honest"
        time.sleep(FAILED_SECONDS)
        assert sorted(os.listdir(m.mountpoint / "object.mf")) == \
            sorted(open_container(DATA / "mh5_basic.mfh5").names())
        assert "shown as a file" not in m.log_text()
        return
    data = (DATA / "mf2_nested.mf").read_bytes()
    # (over HTTP the header and table.dat, blocks 0-1, are served well; under a prefix
    # only the listing)
    server = hostile(data, "503", honest_below=8192 if where == "http" else 0)
    options = ["timeout=1,retries=1,chunk_size=4096,readahead=1"]
    source, inside = server.url(), ["SUB"]
    if where == "s3-prefix":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hostile")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hostile")
        options.append(f"endpoint_url=http://127.0.0.1:{server.port}")
        source, inside = "s3://bucket/", ["object.mf", "SUB"]
    m = mount(source, options)
    for _ in range(2):  # (not remembered as a file either)
        with pytest.raises(OSError) as failed:
            os.listdir(m.mountpoint.joinpath(*inside))
        assert failed.value.errno == errno.EIO
    server.mode = "honest"
    time.sleep(FAILED_SECONDS)  # (a chunk that failed this recently fails again at once)
    local = open_container(DATA / "mf2_nested.mf").nested("SUB")
    assert sorted(os.listdir(m.mountpoint.joinpath(*inside))) == sorted(local.names())
    assert m.mountpoint.joinpath(*inside, "x").read_bytes() == local.read("x", 0, 1 << 20)
    assert "Traceback" not in m.log_text()


@pytest.mark.fuse
def test_stat_of_a_directory_never_waits_for_a_get(container, hostile, mount):
    """A directory's link count would need its entries' first bytes (nested or not): a
    stat of a remote mount leaves it unknown until a listing, rather than wait for GETs."""
    server = hostile(container[0], "half-body-held", honest_below=CHUNK)
    m = mount(server.url(), [OPTIONS])
    asked = time.monotonic()
    assert os.stat(m.mountpoint).st_nlink == 1
    assert time.monotonic() - asked < 0.5


# Requests of several users at once, through a mount, in a child (a hang ends there): each
# step starts after its delay and gives its answer (a stat's st_size, a listing, or the
# error's text) and how long it took. Each user holds its path's directory open from
# before the first step, as a user inside it would: the step's own look is then its last
# name's, not its parents' again once the kernel's copy of them expired (the kernel
# sends the lookups within one directory one at a time, behind a stalled one).
CONCURRENT = """
import json, os, sys, threading, time
root, steps = sys.argv[1], json.loads(sys.argv[2])
results = {}
def run(label, delay, kind, where, name):
    time.sleep(delay)
    began = time.monotonic()
    try:
        if kind == "stat":
            value = os.stat(name or ".", dir_fd=where).st_size
        else:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=where)
            try:
                value = sorted(os.listdir(fd))
            finally:
                os.close(fd)
    except OSError as exc:
        value = os.strerror(exc.errno)
    results[label] = [value, time.monotonic() - began]
threads = []
for label, delay, kind, path in steps:
    where = os.open(os.path.join(root, os.path.dirname(path)), os.O_RDONLY | os.O_DIRECTORY)
    threads.append(threading.Thread(target=run, args=(label, delay, kind, where,
                                                      os.path.basename(path))))
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(results))
"""


def concurrent_users(root, steps):
    """``{label: [answer, seconds]}`` of ``steps`` (``(label, delay, "stat" or "list",
    path)``), run at once through the mount at ``root``."""
    done = subprocess.run([sys.executable, "-c", CONCURRENT, str(root), json.dumps(steps)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.fuse
def test_a_first_look_that_stalls_keeps_no_other_request_waiting(container, hostile, mount,
                                                                  monkeypatch):
    """Under a prefix, the first look at an object (the header GET that tells whether it
    is a container) or at a sub-prefix (its LIST) waits for the server in its own request
    only: while one stalls, a stat of the mount and a read of a container looked at
    before answer at once, and a first look elsewhere that stalls too ends within its
    own bound, not after the other's."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hostile")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hostile")
    data, contents = container
    server = hostile(data, "honest", everything=True,
                     keys=("slow.mf", "fast.mf", "deep/slow.mf", "more/inner/x.mf"),
                     misbehaving=("/slow.mf", "prefix=more%2Finner"))
    timeout = 2  # (a budget of 4.2 s: a request waiting for another's is plain to see)
    bound, at_once = 2 * timeout + 0.2 + 1.5, 2.0
    m = mount("s3://bucket/", [f"timeout={timeout},retries=1,chunk_size={CHUNK}",
                               f"endpoint_url=http://127.0.0.1:{server.port}"])
    for name in ("deep", "more"):  # (listed, nothing in them opened; the kernel answers a
        assert os.stat(m.mountpoint / name).st_nlink == 1  # directory's lookups in turn)
    assert (m.mountpoint / "fast.mf" / "first").read_bytes() == contents["first"]
    server.mode = "stall-after-headers"
    seen = concurrent_users(m.mountpoint, [
        ("slow", 0, "stat", "slow.mf"), ("mount", 0.5, "stat", ""),
        ("fast", 0.5, "stat", "fast.mf/second"), ("deep", 0.5, "stat", "deep/slow.mf"),
        ("inner", 0.5, "stat", "more/inner")])
    assert {label: value for label, (value, _) in seen.items()} == {
        "slow": "Input/output error", "mount": 0, "fast": FILE_SIZE,
        "deep": "Input/output error", "inner": "Input/output error"}
    late = {label: seconds for label, (_, seconds) in seen.items()
            if seconds > (at_once if label in ("mount", "fast") else bound)}
    assert late == {}
    assert "Traceback" not in m.log_text()
