"""How a carray's decoded chunks are kept for readers: chunks a reader in order has
decoded ahead lie side by side, so a read across two of them is one view of their
bytes, answered at once (no thread) once they are decoded; a chunk decoded again
never writes over bytes a reader still holds."""

import io
import time

import bcolz  # the ground truth writer and reader (PyPI bcolz-zipline)
import numpy as np

from ctdsfs.formats import open_container

CHUNKLEN = 4096  # 32 KiB chunks of float64


def _carray(path):
    values = np.cumsum(np.random.default_rng(5).normal(size=6 * CHUNKLEN)).round(2)
    carr = bcolz.carray(values, rootdir=str(path), mode="w", chunklen=CHUNKLEN,
                        cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=1))
    carr.flush()
    return values


def test_reads_across_chunks_decoded_ahead_are_views_answered_at_once(tmp_path):
    values = _carray(tmp_path / "a")
    c = open_container(tmp_path / "a")
    size = c.entry_size("array.npy")
    header = size - values.nbytes
    piece = 64 << 10  # (the kernel reads a sequential reader's pieces of up to 1 MiB)
    assert not c.cached("array.npy", header, piece)
    c.read("array.npy", header, 8)
    c.read("array.npy", header + CHUNKLEN * 8, 8)  # in order: chunks 2.. decoded ahead
    across = 3 * CHUNKLEN * 8 - 100 + header  # 100 bytes of chunk 2, then chunk 3
    deadline = time.monotonic() + 10
    while not c.cached("array.npy", across, piece):
        assert time.monotonic() < deadline, "chunks 2 and 3 were not decoded ahead"
        time.sleep(0.01)
    data = c.read("array.npy", across, piece)
    assert isinstance(data, memoryview) and data.readonly
    assert bytes(data) == values.tobytes()[across - header:across - header + piece]
    whole = np.load(io.BytesIO(bytes(c.read("array.npy", 0, size))))
    assert np.array_equal(whole, bcolz.open(str(tmp_path / "a"))[:])


def test_a_chunk_decoded_again_leaves_bytes_handed_out_alone(tmp_path):
    """Its window's place is not used twice: a reader's view keeps its bytes."""
    values = _carray(tmp_path / "a")
    c = open_container(tmp_path / "a")
    header = c.entry_size("array.npy") - values.nbytes
    c.read("array.npy", header, 8)
    c.read("array.npy", header + CHUNKLEN * 8, 8)  # chunks 2.. decoded ahead, in a window
    at = header + 2 * CHUNKLEN * 8
    deadline = time.monotonic() + 10
    while not c.cached("array.npy", at, 800):
        assert time.monotonic() < deadline, "chunk 2 was not decoded ahead"
        time.sleep(0.01)
    held = c.read("array.npy", at, 800)
    carr = bcolz.open(str(tmp_path / "a"), mode="a")
    carr[2 * CHUNKLEN:2 * CHUNKLEN + 100] = -1.0  # bcolz replaces superchunk 2
    carr.flush()
    assert bytes(c.read("array.npy", at, 800)) == np.full(100, -1.0).tobytes()
    assert bytes(held) == values[2 * CHUNKLEN:2 * CHUNKLEN + 100].tobytes()
