"""The FUSE adapter's own decisions, with its handlers called directly (no kernel)."""

import os
import shutil

import trio

from ctdsfs import fuse_adapter
from ctdsfs.formats import open_container
from ctdsfs.formats.store import FileStore
from ctdsfs.vfs import ROOT_INO, ContainerFS

from .conftest import DATA, pattern


def test_heap_is_trimmed_after_reads_in_threads_only(monkeypatch):
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


def _evicted(path):
    """``path`` with its pages dropped from the page cache (written back first)."""
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return path


def test_file_store_reads_now_only_what_would_not_wait_for_the_disk(tmp_path):
    path = tmp_path / "f"
    data = os.urandom(1 << 20)
    path.write_bytes(data)
    store = FileStore(_evicted(path))
    assert store.view_now(65536, 4096) is None
    assert store.pread(65536, 4096) == data[65536:69632]
    assert store.view_now(65536, 4096) == data[65536:69632]
    assert path.read_bytes() == data  # (all cached: the readahead may still be under way)
    assert store.view_now((1 << 20) - 100, 4096) == data[-100:]  # up to the end, cached
    assert store.view_now(2 << 20, 4096) == b""  # past the end: nothing to wait for


def test_a_warm_small_read_reads_the_container_once(tmp_path, monkeypatch):
    """The read that finds the bytes cached is the answer: the probe and then the read
    doubled the daemon's CPU for a small read of a warm mount (issue 28)."""
    path = tmp_path / "nested.mf"
    shutil.copy(DATA / "mf2_nested.mf", path)
    path.read_bytes()  # in the page cache
    fs = ContainerFS(open_container(path), path)
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
    fh = fs.open(fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino, os.O_RDONLY)
    calls = []
    for name in ("pread", "preadv"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, real=real, name=name: (
            calls.append(name), real(*a))[1])
    assert trio.run(ops.read, fh, 100, 4096) == pattern(5000, 17, 1)[100:4196]
    assert calls == ["preadv"]
    assert not ops._reads_in_threads
    trio.run(ops.release, fh)


def test_a_small_cold_read_runs_in_a_thread_a_warm_one_on_the_loop(tmp_path):
    """Four readers of a cold mount overlapped nothing while a small read waited for the
    disk on the loop (issue 28)."""
    path = tmp_path / "nested.mf"
    shutil.copy(DATA / "mf2_nested.mf", path)
    fs = ContainerFS(open_container(path), path)
    ops = fuse_adapter.FuseOperations(fs, threaded_reads=False)
    x = fs.lookup(fs.lookup(ROOT_INO, "SUB").ino, "x").ino

    fh = fs.open(x, os.O_RDONLY)  # (checks the header: the kernel reads the small file ahead)
    _evicted(path)
    assert trio.run(ops.read, fh, 0, 4096) == pattern(5000, 17, 1)[:4096]
    assert ops._reads_in_threads  # the cold read went to a worker thread
    ops._reads_in_threads = False
    assert trio.run(ops.read, fh, 0, 4096) == pattern(5000, 17, 1)[:4096]
    assert not ops._reads_in_threads  # now in the page cache: served on the loop
    trio.run(ops.release, fh)
