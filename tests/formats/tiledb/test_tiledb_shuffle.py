"""BYTESHUFFLE then ZSTD or LZ4, undone by python-blosc in one call a tile: the same
bytes as tiledb-py for every value width and both codecs, the chunks Blosc must not be
given (a part as long as its output, chunks of other sizes) undone filter by filter,
and a damaged part a clear error naming its tile."""

import contextlib
import io
import struct

import numpy as np
import pytest
import tiledb
import zstandard

from ctdsfs.errors import BlockError, FormatError
from ctdsfs.formats import open_container
from ctdsfs.formats.tiledb import blosc as tiledb_blosc
from ctdsfs.formats.tiledb import filters as tf
from ctdsfs.io import buffers

CODECS = {"zstd": tiledb.ZstdFilter(level=1), "lz4": tiledb.LZ4Filter()}


def write(uri, dtype, codec, n=60_000):
    """A dense array of n values of ``dtype`` in tiles of 20,000 cells, chunks of 4 KiB."""
    filters = tiledb.FilterList([tiledb.ByteShuffleFilter(), CODECS[codec]], chunksize=4096)
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, n - 1), tile=20_000, dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=dtype, filters=filters)]))
    values = (np.arange(n) * 7919 % 1000).astype(dtype)
    with tiledb.open(uri, "w") as A:
        A[:] = values
    return values


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("dtype", ["u1", "<i2", "<f4", "<f8", "<c16"])
def test_values_equal_tiledb_py(tmp_path, dtype, codec):
    uri = str(tmp_path / "a")
    values = write(uri, dtype, codec)
    array = open_container(uri)
    fragments = array.nested("fragments")
    fragment = fragments.nested(fragments.names()[0])
    with tiledb.open(uri) as A:
        assert A[:]["v"].tobytes() == values.tobytes()
    for folder in (array.nested("dense"), fragment):
        data = bytes(folder.read("v.npy", 0, folder.entry_size("v.npy")))
        got = np.load(io.BytesIO(data))
        assert got.dtype == values.dtype and got.tobytes() == values.tobytes()


def shuffled_tile(values, data_frame, *more):
    """A tile of BYTESHUFFLE then ZSTD chunks, one for each (values, data_frame) pair: the
    shuffle's metadata in its own frame, then ``data_frame`` (the shuffled values,
    compressed)."""
    chunks = [struct.pack("<Q", 1 + len(more) // 2)]
    for values, data_frame in [(values, data_frame)] + list(zip(more[::2], more[1::2])):
        shuffle_meta = struct.pack("<II", 1, values.nbytes)
        meta_frame = zstandard.ZstdCompressor().compress(shuffle_meta)
        zstd_meta = struct.pack("<IIIIII", 1, 1, len(shuffle_meta), len(meta_frame),
                                values.nbytes, len(data_frame))
        body = meta_frame + data_frame
        chunks.append(struct.pack("<III", values.nbytes, len(body), len(zstd_meta)) +
                      zstd_meta + body)
    return b"".join(chunks)


def frame_of(values, **options):
    """``values`` byte-shuffled and compressed as one zstd frame."""
    planes = values.view(np.uint8).reshape(-1, values.itemsize).T.tobytes()
    return zstandard.ZstdCompressor(**options).compress(planes)


PIPELINE = {"max_chunk_size": 65536, "filters": [
    {"type": 9, "name": "BYTESHUFFLE"}, {"type": 2, "name": "ZSTD", "compressor": 2, "level": 1}]}


def test_part_as_long_as_its_values_is_decoded(tmp_path):
    """A ZSTD part exactly as long as the chunk (a frame, then a skippable frame filling
    the rest): Blosc would copy it as stored bytes, so it is decoded filter by filter."""
    values = np.arange(1024, dtype="<f8") * 1.5
    frame = frame_of(values)
    pad = values.nbytes - len(frame) - 8
    assert pad > 0
    part = frame + struct.pack("<II", 0x184D2A50, pad) + bytes(pad)
    assert len(part) == values.nbytes
    out = tf.unfilter_tile(shuffled_tile(values, part), PIPELINE, 3, 8, values.nbytes, "t")
    assert bytes(out) == values.tobytes()


def test_damaged_part_is_a_clear_error():
    """A part that does not decode (its frame cut short) is a FormatError naming the tile
    and the codec; one that decodes to less than the chunk declares too."""
    values = np.arange(1024, dtype="<f8")
    planes = values.view(np.uint8).reshape(-1, 8).T.tobytes()
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(planes)
    with pytest.raises(FormatError, match="tile 3 of v: ZSTD does not decompress"):
        tf.unfilter_tile(shuffled_tile(values, frame[:-9]), PIPELINE, 3, 8, values.nbytes,
                         "tile 3 of v")
    short = zstandard.ZstdCompressor(write_content_size=False).compress(planes[:-8])
    with pytest.raises(FormatError, match="tile 3 of v: ZSTD"):
        tf.unfilter_tile(shuffled_tile(values, short), PIPELINE, 3, 8, values.nbytes,
                         "tile 3 of v")


def test_damaged_tile_of_an_array_is_eio_for_that_tile(tmp_path):
    """A byte of a compressed part changed on disk: reading that tile is a BlockError
    (EIO) naming it; the other tiles still read."""
    uri = str(tmp_path / "a")
    values = write(uri, "<f8", "zstd")
    array = open_container(uri)
    fragments = array.nested("fragments")
    name = fragments.names()[0]
    path = tmp_path / "a" / "__fragments" / name / "a0.tdb"
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 100] ^= 0xFF  # inside the last chunk of the last tile
    path.write_bytes(bytes(raw))
    fragment = open_container(uri).nested("fragments").nested(name)
    size = fragment.entry_size("v.npy")
    with pytest.raises(BlockError, match="tile 2 of v"):
        fragment.read("v.npy", size - 8, 8)
    head = bytes(fragment.read("v.npy", size - values.nbytes, 8))
    assert head == values[:1].tobytes()


def test_tile_is_one_blosc_call(tmp_path, monkeypatch):
    """Every chunk of a tile (4 KiB chunks, the last shorter) is undone by one python-blosc
    call a tile, and gives tiledb-py's values."""
    uri = str(tmp_path / "a")
    values = write(uri, "<f8", "zstd")
    calls = []
    real_decode = tiledb_blosc.decode
    monkeypatch.setattr(tiledb_blosc, "decode",
                        lambda chunk, *rest: calls.append(len(chunk)) or real_decode(chunk, *rest))
    fragments = open_container(uri).nested("fragments")
    fragment = fragments.nested(fragments.names()[0])
    data = bytes(fragment.read("v.npy", 0, fragment.entry_size("v.npy")))
    assert np.load(io.BytesIO(data)).tobytes() == values.tobytes()
    assert len(calls) == 3  # (tiles of 20,000 values: 39 chunks of 4096 bytes and one of 256)


def test_chunks_blosc_cannot_take_as_blocks_are_decoded():
    """Chunks that are not Blosc blocks (a chunk shorter than the next; a part as long as
    its chunk in the middle of a tile) are undone chunk by chunk, to the same values."""
    a, b, c = (np.arange(k, k + 512, dtype="<f8") * 1.25 for k in (0, 512, 1024))
    short = b[:256]
    tile = shuffled_tile(a, frame_of(a), short, frame_of(short), c, frame_of(c))
    expected = np.concatenate((a, short, c)).tobytes()
    assert bytes(tf.unfilter_tile(tile, PIPELINE, 3, 8, len(expected), "t")) == expected
    frame = frame_of(b)
    pad = b.nbytes - len(frame) - 8
    stored_size = frame + struct.pack("<II", 0x184D2A50, pad) + bytes(pad)
    tile = shuffled_tile(a, frame_of(a), b, stored_size, c, frame_of(c))
    expected = np.concatenate((a, b, c)).tobytes()
    assert bytes(tf.unfilter_tile(tile, PIPELINE, 3, 8, len(expected), "t")) == expected


def test_damaged_chunk_inside_a_tile_is_a_clear_error():
    """A chunk in the middle of a tile cut short, or declaring more values than its part
    gives: a FormatError naming the tile, never other bytes."""
    a, b, c = (np.arange(k, k + 512, dtype="<f8") for k in (0, 512, 1024))
    tile = shuffled_tile(a, frame_of(a), b, frame_of(b, write_content_size=False)[:-9],
                         c, frame_of(c))
    with pytest.raises(FormatError, match="tile 7 of v: ZSTD does not decompress"):
        tf.unfilter_tile(tile, PIPELINE, 3, 8, 3 * a.nbytes, "tile 7 of v")
    tile = shuffled_tile(a, frame_of(a), b, frame_of(b[:256], write_content_size=False),
                         c, frame_of(c))  # (its chunk declares 512 values, its part has 256)
    with pytest.raises(FormatError, match="tile 7 of v: ZSTD does not decompress"):
        tf.unfilter_tile(tile, PIPELINE, 3, 8, 3 * a.nbytes, "tile 7 of v")


def test_changed_bytes_give_the_values_or_a_clear_error():
    """Any one byte of a tile of four chunks changed: the tile decodes to its size or is a
    FormatError, nothing else (Blosc is handed sizes and starts it checks), from a copy
    and in place."""
    chunks = [np.arange(k, k + 512, dtype="<f8") for k in range(0, 2048, 512)]
    tile = shuffled_tile(*[x for v in chunks for x in (v, frame_of(v))])
    expected = np.concatenate(chunks).tobytes()
    assert bytes(tf.unfilter_tile(tile, PIPELINE, 3, 8, len(expected), "t")) == expected
    rng = np.random.default_rng(24)
    for place in rng.integers(0, len(tile), 300):
        changed = bytearray(tile)
        changed[place] ^= int(rng.integers(1, 256))
        room = tiledb_blosc.ROOM
        for data, before in ((bytes(changed), 0), (memoryview(bytearray(room) + changed), room)):
            try:
                out = tf.unfilter_tile(data, PIPELINE, 3, 8, len(expected), "t", room=before)
            except FormatError:
                continue
            assert len(out) == len(expected)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_tile_in_a_writable_buffer_is_decoded_in_place(tmp_path, codec):
    """A tile read into a buffer with room before it is decoded where it lies (Blosc's
    header and sizes written into the room and the bytes its chunks no longer need),
    to the same values as from a copy; a damaged zstd part there is still a clear error."""
    uri = str(tmp_path / "a")
    values = write(uri, "<f8", codec)
    fragments = open_container(uri).nested("fragments")
    fragment = fragments.nested(fragments.names()[0])
    fragment.names()
    meta = fragment.meta
    field = meta.fields[0]
    offsets = meta.u64_list("tile_offsets", 0).tolist() + [meta.file_sizes[0]]
    raw = (tmp_path / "a" / "__fragments" / fragments.names()[0] / "a0.tdb").read_bytes()
    tile = raw[offsets[1]:offsets[2]]
    size = 20_000 * 8
    copied = tf.unfilter_tile(tile, field.filters, field.type, 8, size, "t")
    buffer = bytearray(tiledb_blosc.ROOM) + bytearray(tile)
    in_place = tf.unfilter_tile(memoryview(buffer), field.filters, field.type, 8, size, "t",
                                room=tiledb_blosc.ROOM)
    assert bytes(in_place) == bytes(copied) == values[20_000:40_000].tobytes()
    assert buffer[tiledb_blosc.ROOM:] != tile  # (written where it lay)
    damaged = bytearray(tiledb_blosc.ROOM) + bytearray(tile)
    damaged[-100] ^= 0xFF  # (zstd finds that; an LZ4 block has nothing to check it by)
    with pytest.raises(FormatError, match="t: ZSTD") if codec == "zstd" else \
            contextlib.nullcontext():
        tf.unfilter_tile(memoryview(damaged), field.filters, field.type, 8, size, "t",
                         room=tiledb_blosc.ROOM)


def test_spare_buffers_are_never_shared_and_few_are_kept(monkeypatch):
    """Buffers for tiles' bytes: two users at once never get the same one (even when
    their contents are equal), a kept one is reused, and no more than a few (none
    larger than the limit) stay kept."""
    monkeypatch.setattr(buffers, "_SPARES", [])  # (none kept by the tests before)
    with buffers.spare_buffer(1000) as first, buffers.spare_buffer(1000) as second:
        assert first is not second
    with buffers.spare_buffer(1000) as again:
        assert any(again is kept for kept in (first, second))
    with contextlib.ExitStack() as uses:
        held = [uses.enter_context(buffers.spare_buffer(n << 20)) for n in range(1, 7)]
        held.append(uses.enter_context(buffers.spare_buffer(buffers.SPARE_MAX + 1)))
    kept = buffers._SPARES
    assert len(kept) == buffers.SPARES_KEPT
    assert sorted(map(len, kept)) == [n << 20 for n in (4, 5, 6)]


def test_large_tile_starts_on_a_huge_page():
    """A tile of 4 MiB or more is decoded into a buffer that starts on a 2 MiB border
    (no small pages at its start), with the right values."""
    chunks = [np.arange(k, k + 8192, dtype="<f8") for k in range(0, 8192 * 64, 8192)]
    tile = shuffled_tile(*[x for v in chunks for x in (v, frame_of(v))])
    out = tf.unfilter_tile(tile, PIPELINE, 3, 8, 4 << 20, "t")
    values = np.frombuffer(out, np.uint8)
    assert values.ctypes.data % (2 << 20) == 0
    assert values.tobytes() == np.concatenate(chunks).tobytes()
