"""A bomb in every TileDB filter and string encoding ctdsfs undoes: a tile whose declared
sizes lie low (a part, a string encoding or a window declaring far more than its chunk)
or high (a part declaring its whole chunk, a cell count past the tile's), alone and
behind other filters (a checksum that matches, a compressor). Each is refused before
its output is allocated: that read is EIO, ``formats.check`` names the tile, and the memory of
the process that reads (a child of the test, or the mount daemon) grows by far less
than the bomb."""

import bz2
import errno
import functools
import hashlib
import io
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import tiledb
import zstandard

from ctdsfs.formats import open_container

from .test_tiledb_hostile import (
    ZSTD,
    compressor,
    generic_tile,
    gzip_bomb,
    measure,
    one_chunk,
    pipeline_bytes,
    write_sparse,
)

GROWTH_LIMIT = 64 << 20  # every bomb below would take 128 MiB to 4 GiB
FIXED_CELLS = 60_000  # one tile of int64 (or float64) values: 480,000 bytes
TILE = FIXED_CELLS * 8
STRING_CELLS = 500_000  # one var tile of strings of 1 to 3 bytes
WORD = b"w" * 2048  # 500,000 copies of it: 1,024,000,000 bytes
HUGE = 0xFFFFFFF0  # a u32 size as large as it goes


def chunk_tile(original, meta, body, size):
    """A tile of one chunk, padded inside the chunk's bytes to ``size`` (the file's size the
    footer declares: every filter reads only the parts its metadata declares)."""
    room = size - struct.calcsize("<QIII") - len(meta) - len(body)
    assert room >= 0, room
    body += bytes(room)
    return struct.pack("<QIII", 1, original, len(body), len(meta)) + meta + body


def parts(metas=(), datas=()):
    """A compressor's (or delta's) chunk: (metadata, bytes) of its (size, packed) parts."""
    meta = struct.pack("<II", len(metas), len(datas))
    for size, packed in list(metas) + list(datas):
        meta += struct.pack("<II", size, len(packed))
    return meta, b"".join(packed for _, packed in list(metas) + list(datas))


def checksummed(algorithm, meta, body):
    """A checksum filter's chunk around (meta, body) of the next filter, digests matching."""
    digest = {"md5": hashlib.md5, "sha256": hashlib.sha256}[algorithm]
    return struct.pack("<II", 1, 1) + struct.pack("<Q", len(meta)) + digest(meta).digest() + \
        struct.pack("<Q", len(body)) + digest(body).digest() + meta, body


@functools.lru_cache(maxsize=None)
def zstd_bomb():
    """128 MiB of zeros in a frame that does not say its size."""
    return zstandard.ZstdCompressor(write_content_size=False).compress(bytes(128 << 20))


@functools.lru_cache(maxsize=None)
def bzip2_bomb():
    return bz2.compress(bytes(128 << 20), 1)


def zstd_frame(data):
    return zstandard.ZstdCompressor().compress(data)


def stacked():
    """SHA-256 (matching) over ZSTD over BITSHUFFLE over a DOUBLE_DELTA part declaring
    2**40 values."""
    dd = b"\x00" + struct.pack("<Q", 1 << 40) + bytes(8)
    inner_meta = struct.pack("<II", 1, len(dd)) + parts(datas=[(TILE, dd)])[0]
    zm, zd = zstd_frame(inner_meta), zstd_frame(dd)
    meta, body = parts(metas=[(len(inner_meta), zm)], datas=[(len(dd), zd)])
    return checksummed("sha256", meta, body)


def windows(base_bytes, *widths):
    """BIT_WIDTH_REDUCTION (a total first) or POSITIVE_DELTA metadata of one window of
    int64 declaring HUGE bytes."""
    return struct.pack("<I", 1) + base_bytes + b"".join(widths) + struct.pack("<I", HUGE)


# attribute -> (dtype, filters, (chunk metadata, chunk bytes) of its hostile tile)
FIXED_BOMBS = {
    "gzip_low": (np.int64, [tiledb.GzipFilter()], lambda: parts(datas=[(1024, gzip_bomb())])),
    "gzip_high": (np.int64, [tiledb.GzipFilter()], lambda: parts(datas=[(TILE, gzip_bomb())])),
    "zstd_low": (np.int64, [tiledb.ZstdFilter()], lambda: parts(datas=[(1024, zstd_bomb())])),
    "zstd_declaring": (np.int64, [tiledb.ZstdFilter()], lambda: parts(
        datas=[(TILE, zstandard.ZstdCompressor().compress(bytes(128 << 20)))])),
    "lz4_high": (np.int64, [tiledb.LZ4Filter()], lambda: parts(datas=[(TILE, bytes(16))])),
    "lz4_huge": (np.int64, [tiledb.LZ4Filter()], lambda: parts(datas=[(1 << 30, bytes(16))])),
    "bzip2_low": (np.int64, [tiledb.Bzip2Filter()],
                  lambda: parts(datas=[(1024, bzip2_bomb())])),
    "rle_runs": (np.int64, [tiledb.RleFilter()], lambda: parts(
        datas=[(TILE, (bytes(8) + b"\xff\xff") * 40_000)])),
    "rle_huge": (np.int64, [tiledb.RleFilter()], lambda: parts(datas=[(HUGE, bytes(10))])),
    "double_delta": (np.int64, [tiledb.DoubleDeltaFilter()], lambda: parts(
        datas=[(TILE, b"\x00" + struct.pack("<Q", 1 << 40) + bytes(16))])),
    "delta": (np.int64, [tiledb.DeltaFilter()], lambda: parts(
        datas=[(TILE, struct.pack("<Q", 1 << 40) + bytes(16))])),
    "bit_width": (np.int64, [tiledb.BitWidthReductionFilter()], lambda: (
        struct.pack("<I", TILE) + windows(bytes(8), b"\x08"), bytes(1024))),
    "positive_delta": (np.int64, [tiledb.PositiveDeltaFilter()], lambda: (
        windows(bytes(8)), bytes(1024))),
    "byteshuffle": (np.int64, [tiledb.ByteShuffleFilter()], lambda: (
        struct.pack("<II", 1, HUGE), bytes(1024))),
    "bitshuffle": (np.int64, [tiledb.BitShuffleFilter()], lambda: (
        struct.pack("<II", 1, HUGE), bytes(1024))),
    "xor": (np.int64, [tiledb.XORFilter()], lambda: (struct.pack("<II", 1, HUGE), bytes(1024))),
    "scale_float": (np.float64, [tiledb.FloatScaleFilter(1.0, 0.0, 1)], lambda: (
        struct.pack("<II", 1, 1 << 28), bytes(1024))),
    "md5": (np.int64, [tiledb.ChecksumMD5Filter()], lambda: (
        struct.pack("<IIQ", 0, 1, 1 << 40) + bytes(16), bytes(1024))),
    "byteshuffle_zstd": (np.float64, [tiledb.ByteShuffleFilter(), tiledb.ZstdFilter()],
                         lambda: parts(metas=[(8, zstd_frame(struct.pack("<II", 1, TILE)))],
                                       datas=[(TILE, zstd_bomb())])),
    "stacked": (np.int64, [tiledb.DoubleDeltaFilter(), tiledb.BitShuffleFilter(),
                           tiledb.ZstdFilter(), tiledb.ChecksumSHA256Filter()], stacked),
}


def rle_strings(size, cells, runs):
    """RLE string metadata (4-byte runs, 2-byte lengths) and its runs."""
    return struct.pack("<IIIIIBB", 0, 1, size, len(runs), cells * 8, 4, 2), runs


def dictionary_strings(size, cells, ids):
    """DICTIONARY string metadata (one word: WORD; 1-byte ids, 2-byte lengths) and ids."""
    words = struct.pack(">H", len(WORD)) + WORD
    return struct.pack("<IIIIIBBI", 0, 1, size, len(ids), cells * 8, 1, 2, len(words)) + \
        words, ids


def zstd_around(meta, body):
    """A ZSTD chunk holding (meta, body) of the filter before it."""
    return parts(metas=[(len(meta), zstd_frame(meta))], datas=[(len(body), zstd_frame(body))])


ONE_RUN = struct.pack(">IH", STRING_CELLS, len(WORD)) + WORD
BOMB_SIZE = STRING_CELLS * len(WORD)
STRING_BOMBS = {  # attribute -> (filters, its hostile (chunk metadata, chunk bytes))
    "rle_size": ([tiledb.RleFilter()], lambda: rle_strings(BOMB_SIZE, STRING_CELLS, ONE_RUN)),
    "rle_cells": ([tiledb.RleFilter()], lambda: rle_strings(
        0, 1 << 27, struct.pack(">IH", 1 << 27, 0))),
    "rle_md5": ([tiledb.RleFilter(), tiledb.ChecksumMD5Filter()], lambda: checksummed(
        "md5", *rle_strings(BOMB_SIZE, STRING_CELLS, ONE_RUN))),
    "dict_size": ([tiledb.DictionaryFilter()], lambda: dictionary_strings(
        BOMB_SIZE, STRING_CELLS, bytes(STRING_CELLS))),
    "dict_cells": ([tiledb.DictionaryFilter()], lambda: dictionary_strings(
        0, 1 << 28, bytes(STRING_CELLS))),
    "dict_zstd": ([tiledb.DictionaryFilter(), tiledb.ZstdFilter()], lambda: zstd_around(
        *dictionary_strings(BOMB_SIZE, STRING_CELLS, bytes(STRING_CELLS)))),
}


def data_file(uri, attr_index, suffix=""):
    frag = next((uri / "__fragments").iterdir())
    return frag / f"a{attr_index}{suffix}.tdb"


def plant(path, original, meta_body):
    meta, body = meta_body
    path.write_bytes(chunk_tile(original, meta, body, path.stat().st_size))


def write_fixed(uri):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, FIXED_CELLS - 1), tile=FIXED_CELLS,
                                   dtype=np.int64))
    tiledb.Array.create(str(uri), tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=FIXED_CELLS,
        attrs=[tiledb.Attr(name, dtype=dtype, filters=tiledb.FilterList(filters))
               for name, (dtype, filters, _) in FIXED_BOMBS.items()]))
    rng = np.random.default_rng(5)
    with tiledb.open(str(uri), "w") as A:
        A[np.arange(FIXED_CELLS)] = {
            name: np.cumsum(rng.integers(0, 1 << 30, FIXED_CELLS))
            if dtype == np.int64 else rng.random(FIXED_CELLS) * 100
            for name, (dtype, _, _) in FIXED_BOMBS.items()}
    for index, (_, _, hostile) in enumerate(FIXED_BOMBS.values()):
        plant(data_file(uri, index), TILE, hostile())


def write_strings(uri):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, STRING_CELLS - 1), tile=STRING_CELLS,
                                   dtype=np.int64))
    tiledb.Array.create(str(uri), tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=STRING_CELLS,
        attrs=[tiledb.Attr(name, dtype=str, var=True, filters=tiledb.FilterList(filters))
               for name, (filters, _) in STRING_BOMBS.items()]))
    words = np.array([f"w{i % 7}" if i % 3 else "w" for i in range(STRING_CELLS)], dtype=object)
    with tiledb.open(str(uri), "w") as A:
        A[np.arange(STRING_CELLS)] = {name: words for name in STRING_BOMBS}
    var_size = sum(map(len, words))
    for index, (_, hostile) in enumerate(STRING_BOMBS.values()):
        plant(data_file(uri, index, "_var"), var_size, hostile())


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """The two arrays, every attribute's tile a bomb: {array path: [its bomb files]}."""
    tree = tmp_path_factory.mktemp("bombs")
    write_fixed(tree / "fixed")
    write_strings(tree / "strings")
    return tree, {tree / "fixed": [f"{name}.npy" for name in FIXED_BOMBS],
                  tree / "strings": [f"{name}.data" for name in STRING_BOMBS]}


READ_EVERY_BOMB = """
import json, sys
from ctdsfs.errors import BlockError
from ctdsfs.formats import open_container

def peak():  # (VmHWM: ru_maxrss would be pytest's, kept across fork and exec)
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:')) * 1024

before = peak()
for path, names in json.loads(sys.argv[1]).items():
    array = open_container(path)
    frag = array.nested('fragments')
    frag = frag.nested(frag.names()[0])
    for name in names:
        try:
            frag.read(name, 0, frag.entry_size(name))
            said = None
        except BlockError as exc:
            said = str(exc)
        print(json.dumps([name, peak() - before, said]), flush=True)
    problems, _ = array.check()
    print(json.dumps(['check', peak() - before, problems]), flush=True)
"""


def test_every_bomb_is_refused_before_it_is_allocated(bombs):
    """Read every bomb through the container API, then check both arrays, in a child
    process: each read fails naming its tile, check names every tile, and the child's
    peak memory grows by less than GROWTH_LIMIT."""
    _, files = bombs
    done = subprocess.run([sys.executable, "-c", READ_EVERY_BOMB,
                           json.dumps({str(k): v for k, v in files.items()})],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    reads = [json.loads(line) for line in done.stdout.splitlines()]
    for name, grew, said in reads:
        assert grew < GROWTH_LIMIT, (name, grew)
        if name != "check":
            assert said and f"tile 0 of {name.split('.')[0]} " in said, (name, said)
    checked = [p for name, _, problems in reads if name == "check" for p in problems]
    for name in FIXED_BOMBS:
        assert any(f"tile 0 of {name} (" in p for p in checked), name
    for name in STRING_BOMBS:
        assert any(f"tile 0 of {name} (a" in p and "_var.tdb" in p for p in checked), name


def test_ctdsfs_check_of_a_bomb_stays_small(bombs):
    """``ctdsfs check`` of the string bombs (a run of 500,000 copies of a 2,048-byte
    string: 1 GB) names each tile and never grows past a modest bound."""
    tree, _ = bombs
    script = ("import resource, subprocess, sys\n"
              "done = subprocess.run(['ctdsfs', 'check', sys.argv[1]], capture_output=True,"
              " text=True)\n"
              "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
              "print(done.stdout + done.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tree / "strings")],
                          capture_output=True, text=True, timeout=600)
    status, maxrss = map(int, done.stdout.splitlines()[0].split())
    said = done.stdout.split("\n", 1)[1]
    assert status == 1 and "Traceback" not in said, said
    assert maxrss * 1024 < 200 << 20, maxrss
    for name in STRING_BOMBS:
        assert f"tile 0 of {name} (" in said, name


def daemon_peak(pid):
    """The peak memory of the daemon and of its worker processes (each one's, summed)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        workers = [int(child) for child in f.read().split()]
    peak = 0
    for one in [pid, *workers]:
        with open(f"/proc/{one}/status") as f:
            peak += next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return peak * 1024


@pytest.mark.parametrize("workers", [1, 2])
def test_bombs_through_a_mount_are_eio_in_bounded_memory(bombs, mount, workers):
    """Every bomb read through a mount is EIO, and the daemon's peak memory (with its
    workers') grows by less than GROWTH_LIMIT; the rest of the array still reads."""
    tree, files = bombs
    m = mount(tree, [f"workers={workers}"])
    for array, names in files.items():
        os.listdir(m.mountpoint / array.name)
    before = daemon_peak(m.proc.pid)
    for array, names in files.items():
        top = m.mountpoint / array.name / "fragments"
        frag = top / os.listdir(top)[0]
        for name in names:
            with pytest.raises(OSError) as err:
                (frag / name).read_bytes()
            assert err.value.errno == errno.EIO, name
        cells = FIXED_CELLS if array.name == "fixed" else STRING_CELLS
        assert np.array_equal(np.load(frag / "x.npy"), np.arange(cells))
    grew = daemon_peak(m.proc.pid) - before
    assert grew < GROWTH_LIMIT, grew
    log = m.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def test_filters_that_grow_a_chunk_still_read(tmp_path):
    """The bounds are what each filter can have been given: RLE of values that never repeat
    (a third larger, then ZSTD) and SCALE_FLOAT to wider integers (then ZSTD) read as
    tiledb-py reads them, in chunks of the default 64 KiB."""
    n = 200_000
    rng = np.random.default_rng(9)
    values = {"rle_zstd": rng.integers(0, 256, n).astype(np.uint8),
              "wide_scale": (rng.integers(0, 1000, n) * 0.5).astype(np.float32)}
    filters = {"rle_zstd": [tiledb.RleFilter(), tiledb.ZstdFilter()],
               "wide_scale": [tiledb.FloatScaleFilter(0.5, 0.0, 8), tiledb.ZstdFilter()]}
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, n - 1), tile=n, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=n,
        attrs=[tiledb.Attr(k, dtype=v.dtype, filters=tiledb.FilterList(filters[k]))
               for k, v in values.items()]))
    with tiledb.open(uri, "w") as A:
        A[np.arange(n)] = values
    with tiledb.open(uri) as A:
        ref = A[:]
    frag = open_container(uri).nested("fragments")
    frag = frag.nested(frag.names()[0])
    for name in values:
        got = np.load(io.BytesIO(bytes(frag.read(f"{name}.npy", 0, 1 << 30))))
        assert np.array_equal(got, ref[name]), name


METADATA_BOMB = 200 << 20  # a tile of tile offsets that really holds 25 million of them


def test_fragment_metadata_tile_bomb_is_refused_in_bounded_memory(tmp_path):
    """A fragment's tile offsets in a ZSTD generic tile of 200 MiB that says so (a frame
    of a few KiB): more than a fragment of a few hundred bytes can index, refused before
    it is decompressed; fragment.json and the reads say so, memory stays bounded."""
    uri = tmp_path / "a"
    write_sparse(str(uri), 7, "key")
    frag = next((uri / "__fragments").iterdir())
    meta = frag / "__fragment_metadata.tdb"
    data = meta.read_bytes()
    footer_at = len(data) - 8 - struct.unpack("<Q", data[-8:])[0]
    count = (METADATA_BOMB - 8) // 8
    frame = zstandard.ZstdCompressor().compress(struct.pack("<Q", count) + bytes(8 * count))
    bomb = generic_tile(22, pipeline_bytes(compressor(ZSTD)),
                        one_chunk(METADATA_BOMB, frame, METADATA_BOMB), METADATA_BOMB)
    footer = bytearray(data[footer_at:])
    fields = 3  # a, the legacy coordinates slot, x
    at = 4 + 8 + struct.unpack_from("<Q", footer, 4)[0] + 2 + 16 + 16 + 2 + 8 * (3 * fields + 1)
    footer[at:at + 8] = struct.pack("<Q", footer_at)  # (tile offsets of a: the bomb)
    meta.write_bytes(data[:footer_at] + bomb + bytes(footer))
    grew, printed = measure(
        "import json\nfrom ctdsfs.errors import BlockError\n"
        "frag = open_container(path).nested('fragments')\n"
        "frag = frag.nested(frag.names()[0])\n"
        "print(json.loads(frag.read('fragment.json', 0, 1 << 20))['fields']['a']['problem'])\n"
        "try:\n    frag.read('a.npy', 0, 1 << 20)\nexcept BlockError as exc:\n    print(exc)\n",
        uri)
    assert grew < GROWTH_LIMIT, grew
    assert len(printed) == 2 and all("tile_offsets" in p and "larger than ctdsfs reads here"
                                     in p for p in printed), printed
