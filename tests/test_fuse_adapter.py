"""The FUSE adapter's own decisions, with its handlers called directly (no kernel)."""

import errno
import os
import shutil
import threading
import time

import pyfuse3
import pytest
import trio

from ctdsfs import fuse_adapter
from ctdsfs.formats import open_container
from ctdsfs.vfs import ROOT_INO, ContainerFS

from .conftest import DATA, evicted, pattern


def test_heap_is_trimmed_after_heavy_reads_only(monkeypatch):
    monkeypatch.setattr(fuse_adapter, "TRIM_SECONDS", 3600)  # one trim in this test's life
    path = DATA / "mf2_nested.mf"
    path.read_bytes()  # in the page cache: a small read then stays on the loop
    fs = ContainerFS(open_container(path), path)
    trims = []
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False,
                                      trim_heap=lambda: trims.append(1))
    x = fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino

    async def read_and_close(size):
        fh = fs.open(x, os.O_RDONLY)
        data = await ops.read(fh, 0, size)
        await ops.release(fh)
        return data

    assert trio.run(read_and_close, 4096) == pattern(5000, 17, 1)[:4096]
    assert trims == []  # a small read ran on the loop: nothing to give back
    large = fuse_adapter.THREADED_READ_MIN
    assert trio.run(read_and_close, large) == pattern(5000, 17, 1)
    assert trims == [1]
    assert trio.run(read_and_close, large) == pattern(5000, 17, 1)
    assert trims == [1]  # at most once per TRIM_SECONDS


def test_a_small_cold_read_stays_on_the_loop(tmp_path):
    """Sending small reads whose bytes are not in the page cache to worker threads was
    measured slower with one and with four cold random readers (issue 28): they stay on
    the loop, as warm ones do."""
    path = tmp_path / "nested.mf"
    shutil.copy(DATA / "mf2_nested.mf", path)
    fs = ContainerFS(open_container(path), path)
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
    x = fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino
    fh = fs.open(x, os.O_RDONLY)  # (checks the header: the kernel reads the small file ahead)
    evicted(path)
    assert trio.run(ops.read, fh, 0, 4096) == pattern(5000, 17, 1)[:4096]
    assert not ops._heavy_reads
    trio.run(ops.release, fh)


def test_a_lone_reader_reads_on_the_loop_until_a_second_one_shows(tmp_path, monkeypatch):
    """A read that would go to a worker thread runs on the loop while no other request
    waits (a pipe stands for /dev/fuse here: a byte in it is a request waiting); a
    request found waiting when such a read ends sends reads to threads for
    SHARED_SECONDS; a mount not told it may (a remote or network source) never does,
    and a local mount of a format decoded from chunks or tiles (``reads_on_loop``) does
    beside other readers too."""
    monkeypatch.setattr(fuse_adapter, "SHARED_SECONDS", 1.0)
    path = tmp_path / "nested.mf"
    shutil.copy(DATA / "mf2_nested.mf", path)
    fs = ContainerFS(open_container(path), path)
    x = fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino
    fh = fs.open(x, os.O_RDONLY)
    device, request = os.pipe()
    threads, arrivals = [], []
    real_read = fs.read

    def read(*args):
        threads.append(threading.get_ident())
        if arrivals:
            os.write(request, arrivals.pop())  # another reader's request comes meanwhile
        return real_read(*args)
    fs.read = read

    def read_in(ops):
        assert trio.run(ops.read, fh, 0, 4096) == pattern(5000, 17, 1)[:4096]
        return "loop" if threads.pop() == threading.get_ident() else "thread"

    ops = fuse_adapter.FuseOperations(fs, threaded_reads=True, lone_reads_on_loop=True)
    assert read_in(ops) == "thread"  # (no /dev/fuse to poll yet: never alone)
    ops.watch_device(device)
    assert read_in(ops) == "loop"
    os.write(request, b"r")
    assert read_in(ops) == "thread"  # a request waits
    os.read(device, 1)
    assert read_in(ops) == "loop"
    arrivals.append(b"r")
    assert read_in(ops) == "loop"  # alone when it began; a request came meanwhile
    os.read(device, 1)
    assert read_in(ops) == "thread"  # a second reader was seen: reads are shared
    time.sleep(1.05)
    assert read_in(ops) == "loop"  # and no more once SHARED_SECONDS passed without one

    remote = fuse_adapter.FuseOperations(fs, threaded_reads=True)
    remote.watch_device(device)
    assert read_in(remote) == "thread"

    # a local mount of a format decoded from chunks: on the loop beside other readers too
    decoded = fuse_adapter.FuseOperations(fs, threaded_reads=True, lone_reads_on_loop=True,
                                          reads_on_loop=True)
    assert read_in(decoded) == "loop"  # (no /dev/fuse to poll: all the same)
    decoded.watch_device(device)
    os.write(request, b"r")
    assert read_in(decoded) == "loop"  # a request waits
    arrivals.append(b"r")
    assert read_in(decoded) == "loop"
    assert read_in(decoded) == "loop"  # a second reader was seen
    os.read(device, 2)
    os.close(device)
    os.close(request)
    trio.run(ops.release, fh)


def test_a_read_only_close_asks_the_kernel_for_no_flush(tmp_path):
    """A read-only mount has nothing to do at a close: FLUSH is ENOSYS, which tells the
    kernel to send no more (a request fewer for each file a walk reads); a read-write
    mount's close still commits."""
    path = tmp_path / "nested.mf"
    shutil.copy(DATA / "mf2_nested.mf", path)
    for writable in (False, True):
        fs = ContainerFS(open_container(path, writable=writable), path, writable=writable)
        ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
        x = fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino
        fh = fs.open(x, os.O_RDWR if writable else os.O_RDONLY)
        if writable:
            fs.write(fh, 0, b"changed")
            trio.run(ops.flush, fh)
            assert not fs.root.dirty
        else:
            with pytest.raises(pyfuse3.FUSEError) as refused:
                trio.run(ops.flush, fh)
            assert refused.value.errno == errno.ENOSYS
        trio.run(ops.release, fh)
        fs.close()


def test_a_worker_keeps_the_read_claim_through_a_close_only():
    """A worker of several lets another read the next request as soon as its own is read,
    except through a close (RELEASE, RELEASEDIR) that does not trim the heap: the kernel
    sends it beside a walker's next request, which the worker then takes itself
    (fuse_workers.Gate)."""
    class Gate:
        released = 0

        def read_done(self):
            self.released += 1
    path = DATA / "mf2_nested.mf"
    fs = ContainerFS(open_container(path), path)
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
    ops.gate = gate = Gate()
    sub = trio.run(ops.lookup, ROOT_INO, b"SUB").st_ino
    x = trio.run(ops.lookup, sub, b"x").st_ino
    assert gate.released == 2
    fh = trio.run(ops.opendir, sub, None)
    trio.run(ops.releasedir, fh)
    assert gate.released == 3
    fh = trio.run(ops.open, x, os.O_RDONLY, None).fh
    assert trio.run(ops.read, fh, 0, 100) == pattern(5000, 17, 1)[:100]
    trio.run(ops.release, fh)
    assert gate.released == 5
    ops.trim_heap, ops._heavy_reads = (lambda: None), True  # (a close that trims the heap
    fh = trio.run(ops.open, x, os.O_RDONLY, None).fh  # is not quick: it lets go)
    trio.run(ops.release, fh)
    assert gate.released == 7
    fs.close()


def test_an_invalidation_a_listing_cannot_wait_for_starts_at_once(monkeypatch):
    """A listing that finds the container reloaded cannot wait for the kernel to forget
    what it cached (the kernel holds the directory's lock until the answer): that starts
    in a thread at once, not as a task of the loop, which a worker of several runs only
    at its next pass through trio's scheduler (it waits for requests with its loop
    blocked)."""
    import threading

    path = DATA / "mf2_nested.mf"
    fs = ContainerFS(open_container(path), path)
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
    forgotten = threading.Event()
    monkeypatch.setattr(fuse_adapter, "_forget_in_kernel", lambda stale: forgotten.set())
    monkeypatch.setattr(fs, "take_stale", lambda: [(5, ROOT_INO, "SUB")])

    async def listing_then_a_blocked_loop():
        ops.serving = True
        await ops._invalidate_stale(wait=False)
        assert forgotten.wait(10), "nothing started while the loop was blocked"
    trio.run(listing_then_a_blocked_loop)
