"""How a remote store's reads turn into GETs with the default options (a real SeaweedFS):
a read that jumps into a chunk fetches its own bytes, a stream whole chunks with
readahead, a reader dense in one chunk the whole chunk; every GET pinned to the version."""

import os
import time

import pytest

from ctdsfs.remote import store as remote
from ctdsfs.remote.store import RemoteError, RemoteOptions, RemoteStore

from ..conftest import BUCKET

CHUNK = RemoteOptions.chunk_size
READ = 128 << 10  # what the kernel asks for at a time from a mount


@pytest.fixture
def object_and_gets(seaweed, monkeypatch):
    """A 20 MiB object (two chunks and a half) on SeaweedFS, and every GET a store makes."""
    data = os.urandom(2 * CHUNK + (4 << 20))
    seaweed.client.put_object(Bucket=BUCKET, Key="exact.bin", Body=data)
    gets = []
    original = RemoteStore._get
    monkeypatch.setattr(RemoteStore, "_get", lambda self, start, end, version: (
        gets.append((start, end)), original(self, start, end, version))[1])
    return data, gets, lambda: RemoteStore(seaweed.url("exact.bin"),
                                           RemoteOptions(endpoint_url=seaweed.endpoint))


def test_reads_that_jump_fetch_their_own_bytes(object_and_gets):
    """Each read less than 1 MiB from the last (not overlapping it) or in another chunk
    GETs its own bytes; a read's whole chunks come whole."""
    data, gets, fresh = object_and_gets
    store = fresh()
    try:
        places = [(CHUNK + 12345, 6000), (2 * CHUNK + 999, READ), (CHUNK + 4096, 100),
                  (CHUNK - 50, 100)]  # the last: the header chunk's end and the next's start
        for offset, size in places:
            assert store.pread(offset, size) == data[offset:offset + size]
        assert gets[:3] == [(CHUNK + 12345, CHUNK + 18345),
                            (2 * CHUNK + 999, 2 * CHUNK + 999 + READ),
                            (CHUNK + 4096, CHUNK + 4196)]
        assert sorted(gets[3:]) == [(0, CHUNK), (CHUNK, CHUNK + 50)]  # the header's: whole
        assert not store.cached(CHUNK + 12345, 6000)  # kept nowhere: a mount asks a thread
    finally:
        store.close()
    store = fresh()
    try:
        across = CHUNK + CHUNK // 2  # a read over a whole chunk: that chunk whole, once
        gets.clear()
        assert store.pread(across, 2 * CHUNK) == data[across:across + 2 * CHUNK]
        assert sorted(gets) == [(across, 2 * CHUNK), (2 * CHUNK, len(data))]
    finally:
        store.close()


def test_a_stream_gets_whole_chunks_and_readahead(object_and_gets):
    """The kernel's 128 KiB reads through a file from the middle of a chunk: the first
    read is a GET of its own, the rest come from whole chunks fetched ahead."""
    data, gets, store = object_and_gets
    store = store()
    try:
        offset = CHUNK + 3 * READ
        while offset < len(data):
            assert store.pread(offset, READ) == data[offset:offset + READ]
            offset += READ
        assert sorted(gets) == [(CHUNK, 2 * CHUNK), (CHUNK + 3 * READ, CHUNK + 4 * READ),
                                (2 * CHUNK, len(data))]
    finally:
        store.close()


def test_readers_in_parallel_each_get_their_readahead(seaweed, monkeypatch):
    """Readers going through their own parts of an object at once (their reads come to
    the store in turn) each have the chunks past theirs fetched ahead, whichever of
    them is further on."""
    chunk, read = 64 << 10, 16 << 10
    data = os.urandom(32 * chunk)
    seaweed.client.put_object(Bucket=BUCKET, Key="streams.bin", Body=data)
    gets = []
    original = RemoteStore._get
    monkeypatch.setattr(RemoteStore, "_get", lambda self, start, end, version: (
        gets.append((start, end)), original(self, start, end, version))[1])
    store = RemoteStore(seaweed.url("streams.bin"), RemoteOptions(
        endpoint_url=seaweed.endpoint, chunk_size=chunk, readahead=2))
    try:
        starts = [2 * chunk, 12 * chunk, 22 * chunk]
        for step in range(2 * chunk // read):
            for start in starts:
                offset = start + step * read
                assert store.pread(offset, read) == data[offset:offset + read]
        wanted = {(n * chunk, (n + 1) * chunk) for start in starts
                  for n in (start // chunk + 2, start // chunk + 3)}
        deadline = time.monotonic() + 10
        while not wanted <= set(gets):
            assert time.monotonic() < deadline, f"not fetched ahead: {wanted - set(gets)}"
            time.sleep(0.05)
    finally:
        store.close()


def test_a_reader_dense_in_a_chunk_gets_it_whole(object_and_gets):
    """Reads scattered over a chunk get it whole after WHOLE_AFTER GETs of their own;
    one reader's pieces close together (a row range's parts of its tiles) never do."""
    data, gets, store = object_and_gets
    store = store()
    try:
        pieces = [2 * CHUNK + n * 40960 for n in range(4 * remote.WHOLE_AFTER)][::-1]
        for offset in pieces:  # as a tiled column's range: backwards, a tile apart
            assert store.pread(offset, 6144) == data[offset:offset + 6144]
        assert gets == [(offset, offset + 6144) for offset in pieces]
        gets.clear()
        apart = CHUNK // (remote.WHOLE_AFTER + 2)
        assert apart > remote.NEAR
        for offset in [CHUNK + n * apart for n in range(remote.WHOLE_AFTER + 2)]:
            assert store.pread(offset, 4096) == data[offset:offset + 4096]
        assert gets[remote.WHOLE_AFTER] == (CHUNK, 2 * CHUNK)
        assert len(gets) == 1 + remote.WHOLE_AFTER  # then from memory
        assert store.cached(CHUNK + 100, 4096)
    finally:
        store.close()


def test_a_get_of_its_own_bytes_is_pinned_to_the_version(seaweed, object_and_gets):
    data, gets, store = object_and_gets
    store = store()
    try:
        assert store.pread(CHUNK + 100, 100) == data[CHUNK + 100:CHUNK + 200]
        seaweed.client.put_object(Bucket=BUCKET, Key="exact.bin", Body=data[::-1])
        with pytest.raises(RemoteError, match="replaced on the server"):
            store.pread(CHUNK + 100, 100)
        deadline = time.monotonic() + 10
        while not store.replaced():
            assert time.monotonic() < deadline, "the new version was never taken"
            time.sleep(0.05)
        assert store.pread(CHUNK + 100, 100) == data[::-1][CHUNK + 100:CHUNK + 200]
    finally:
        store.close()
