"""bcolz carray/ctable rootdirs (written by bcolz-zipline) and bloscpack files as NumPy files."""

import ctypes
import fcntl
import hashlib
import io
import json
import mmap
import os
import pathlib
import random
import shutil
import struct
import subprocess
import tempfile
import time
import zlib

import bcolz  # the ground truth writer and reader (PyPI bcolz-zipline)
import blosc
import numpy as np
import pytest

from ctdsfs.errors import BlockError, CtdsfsError, FormatError, NotPermitted
from ctdsfs.formats import open_container
from ctdsfs.formats.bcolz.rootdir import CHUNK_BYTES_MAX
from ctdsfs.io.store import DIRECT_ALIGN, read_direct

from ...conftest import evicted

LIBC = ctypes.CDLL(None, use_errno=True)


def cparams(cname="lz4", clevel=5, shuffle=1):
    return bcolz.cparams(clevel=clevel, cname=cname, shuffle=shuffle)


# name -> (values, carray options): the matrix of what bcolz stores
CARRAYS = {
    "int64_blosclz": (np.arange(-500, 4500, dtype=np.int64), dict(cparams=cparams("blosclz"))),
    "int8_zlib": (np.arange(3000, dtype=np.int8), dict(cparams=cparams("zlib"))),
    "uint16_zstd": (np.arange(3000, dtype=np.uint16) * 7, dict(cparams=cparams("zstd"))),
    "float32_lz4hc": (np.linspace(0, 1, 7001, dtype=np.float32),
                      dict(cparams=cparams("lz4hc"), chunklen=1000)),
    "float64_noshuffle": (np.sin(np.arange(5000.0)), dict(cparams=cparams(shuffle=0))),
    "float64_bitshuffle": (np.arange(5000.0) / 3, dict(cparams=cparams(shuffle=2))),
    "float64_clevel0": (np.arange(2500.0), dict(cparams=cparams(clevel=0), chunklen=1024)),
    "bool": (np.arange(999) % 3 == 0, {}),
    "bytes": (np.array([b"a", b"bcd", b"", b"xyz\x00"] * 50, dtype="S4"), dict(chunklen=7)),
    "unicode": (np.array(["é", "日本語", "abc"] * 40, dtype="U3"), dict(chunklen=16)),
    "bigendian": (np.arange(100, dtype=">i4"), dict(chunklen=9)),
    "matrix_2d": (np.arange(600, dtype=np.int32).reshape(200, 3), dict(chunklen=16)),
    "tiny_chunklen": (np.arange(37, dtype=np.int16), dict(chunklen=1)),
    "huge_chunklen": (np.arange(300000, dtype=np.float64), dict(chunklen=1 << 20)),
    "empty": (np.zeros(0, np.float64), {}),
    "partial_last": (np.arange(1000003 // 100, dtype=np.float64), dict(chunklen=1000)),
}
CTABLE_COLUMNS = 12


def write_carray(path, values, options):
    arr = bcolz.carray(values, rootdir=str(path), mode="w", **options)
    arr.attrs["origin"] = "test"
    arr.flush()
    return path


def write_complex(path, values, half):
    """bcolz-zipline cannot persist complex arrays (its JSON meta cannot hold a complex
    default): write the real and imaginary parts as floats, then say complex in meta/,
    halving chunklen and keeping the length (bcolz itself reads the result)."""
    write_carray(path, values.view(half), dict(chunklen=32))
    storage = json.loads((path / "meta" / "storage").read_text())
    storage.update(dtype=str(values.dtype), chunklen=16)
    (path / "meta" / "storage").write_text(json.dumps(storage))
    sizes = json.loads((path / "meta" / "sizes").read_text())
    sizes["shape"] = [len(values)]
    (path / "meta" / "sizes").write_text(json.dumps(sizes))
    assert np.array_equal(bcolz.open(str(path))[:], values)


@pytest.fixture(scope="session")
def rootdirs(tmp_path_factory):
    """One directory of rootdirs bcolz wrote: the carray matrix, appended and trimmed
    carrays, a ctable of many columns, and a superchunk copied out as a .blp file."""
    base = tmp_path_factory.mktemp("bcolz")
    for name, (values, options) in CARRAYS.items():
        write_carray(base / name, values, options)
    for name, dtype, half in (("complex128", "c16", "f8"), ("complex64", "c8", "f4")):
        write_complex(base / name, (np.arange(333) + 1j * np.arange(333)[::-1]).astype(dtype),
                      half)
    appended = bcolz.carray(np.arange(10.0), rootdir=str(base / "appended"), mode="w",
                            chunklen=4)
    appended.append(np.arange(10.0, 23.0))
    appended.flush()
    trimmed = bcolz.carray(np.arange(40, dtype=np.int32), rootdir=str(base / "trimmed"),
                           mode="w", chunklen=8)
    trimmed.trim(13)
    trimmed.flush()
    columns = [np.arange(300, dtype=np.int64) * i for i in range(CTABLE_COLUMNS - 3)]
    columns += [np.arange(300) / 7.0, np.array([b"s%d" % i for i in range(300)]),
                np.arange(300) % 2 == 0]
    names = [f"c{i}" for i in range(CTABLE_COLUMNS - 3)] + ["price", "symbol", "flag"]
    table = bcolz.ctable(columns, names=names, rootdir=str(base / "table"), mode="w",
                         chunklen=64)
    table.attrs["calendar"] = "NYSE"
    table.flush()
    shutil.copy(base / "partial_last" / "data" / "__3.blp", base / "one.blp")
    (base / "fake.blp").write_bytes(b"not a bloscpack file")
    return base


def whole(container, name):
    return container.read(name, 0, container.entry_size(name))


def npy(container, name):
    return np.load(io.BytesIO(whole(container, name)))


OTHERS = ["appended", "trimmed", "complex128", "complex64"]


@pytest.mark.parametrize("name", sorted(CARRAYS) + OTHERS)
def test_carray_views_equal_bcolz(rootdirs, name):
    c = open_container(rootdirs / name)
    expected = bcolz.open(str(rootdirs / name))[:]
    array = npy(c, "array.npy")
    assert array.dtype == expected.dtype and array.shape == expected.shape
    assert np.array_equal(array, expected)
    attrs = {} if name in ("appended", "trimmed") else {"origin": "test"}
    assert json.loads(whole(c, "attrs.json")) == attrs
    chunks = c.nested("chunks")
    joined = b"".join(whole(chunks, n) for n in chunks.names())
    assert joined[:expected.nbytes] == expected.tobytes()
    meta = json.loads(whole(c, "meta.json"))
    assert meta["sizes"]["shape"] == list(expected.shape)
    assert len(meta["chunks"]) == len(chunks.names())
    assert all("problem" not in h and h["nbytes"] == chunks.entry_size(str(i))
               for i, h in enumerate(meta["chunks"]))
    raw = c.nested("raw")
    assert sorted(raw.names()) == sorted(os.listdir(rootdirs / name))
    # a read inside one chunk, at an odd offset, is the same bytes
    header = c.entry_size("array.npy") - expected.nbytes
    if expected.nbytes > 10:
        assert c.read("array.npy", header + 3, 7) == expected.tobytes()[3:10]


def test_ctable_columns_and_table(rootdirs):
    c = open_container(rootdirs / "table")
    t = bcolz.open(str(rootdirs / "table"))
    assert c.names()[:len(t.names)] == [f"{n}.npy" for n in t.names]
    for name in t.names:
        assert np.array_equal(npy(c, f"{name}.npy"), t[name][:])
        assert np.array_equal(npy(c.nested(name), "array.npy"), t[name][:])
    table = npy(c, "table.npy")
    assert table.dtype.names == tuple(t.names)
    assert np.array_equal(table, t[:])
    assert json.loads(whole(c, "attrs.json")) == {"calendar": "NYSE"}


def test_chunk_cache_is_bounded_and_reused(rootdirs):
    c = open_container(rootdirs / "partial_last")
    carray = c
    carray.cache.limit = 2 * carray.chunk_bytes
    for _ in range(2):
        whole(c, "array.npy")
    assert carray.cache._bytes <= carray.cache.limit
    first = carray.chunk_data(9)
    assert carray.chunk_data(9) is first  # (a repeated read does not decompress again)


def _in_page_cache(path):
    """Whether the last page of ``path`` is in the page cache: mincore(2) of a map of it,
    which reads nothing (a read with RWF_NOWAIT starts the kernel's readahead)."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        start = ctypes.c_char.from_buffer(m)
        resident = (ctypes.c_ubyte * pages)()
        status = LIBC.mincore(ctypes.c_void_p(ctypes.addressof(start)),
                              ctypes.c_size_t(size), resident)
        del start
    assert status == 0, os.strerror(ctypes.get_errno())
    return bool(resident[-1] & 1)


@pytest.fixture
def on_disk():
    """A folder on a disk (/var/tmp), where the page cache is a cache (in tmpfs, which
    /tmp may be, it is the file)."""
    folder = tempfile.mkdtemp(prefix="ctdsfs-test-", dir="/var/tmp")
    yield pathlib.Path(folder)
    shutil.rmtree(folder)


def test_chunks_decoded_ahead_are_read_past_the_page_cache(on_disk):
    """A sequential reader's next chunks are decoded ahead from superchunks read with
    O_DIRECT (no page-cache pages made and filled for them, nor a copy); the chunk a
    reader waits for is read through the page cache, headers first."""
    values = np.random.default_rng(24).normal(size=20 << 17)  # (barely compressible)
    write_carray(on_disk / "c", values, dict(chunklen=1 << 17))  # 20 chunks of 1 MiB
    superchunks = [on_disk / "c" / "data" / f"__{n}.blp" for n in range(20)]
    assert not any(_in_page_cache(evicted(path)) for path in superchunks)
    carray = open_container(on_disk / "c")
    header = carray.entry_size("array.npy") - values.nbytes
    piece = 256 << 10
    got = [bytes(carray.read("array.npy", header + at, piece)) for at in (0, piece)]
    held = time.monotonic() + 10  # (the second piece asked for chunks 1-8 ahead)
    while not all(map(carray._held_chunk, range(1, 9))) and time.monotonic() < held:
        time.sleep(0.01)
    assert all(map(carray._held_chunk, range(1, 9)))
    assert b"".join(got) == values.tobytes()[:2 * piece]
    assert np.array_equal(npy(carray, "array.npy"), values)
    assert _in_page_cache(superchunks[0])
    assert not any(map(_in_page_cache, superchunks[1:9]))


def test_a_direct_read_gives_the_file_or_says_it_cannot(on_disk):
    """``read_direct`` reads a file past the page cache (a length not a multiple of the
    alignment ends it); where the file system refuses O_DIRECT (here /proc) it says so
    (None), and the descriptor's flags are as they were either way."""
    buffer = mmap.mmap(-1, 4 * DIRECT_ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = os.urandom(3 * DIRECT_ALIGN + 100)
    (on_disk / "f").write_bytes(data)
    for path, want in ((on_disk / "f", len(data)), ("/proc/self/status", None)):
        fd = os.open(path, os.O_RDONLY)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        assert read_direct(fd, buffer) == want
        assert fcntl.fcntl(fd, fcntl.F_GETFL) == flags
        os.close(fd)
    assert buffer[:len(data)] == data


def test_changes_by_bcolz_are_seen(damaged):
    """A carray bcolz changes after ctdsfs opened it: replaced superchunks are read anew
    (the cache holds one identity per chunk), a grown meta/sizes reloads the view."""
    root = damaged("float64_clevel0")
    c = open_container(root)
    whole(c, "array.npy")
    carr = bcolz.open(str(root), mode="a")
    for k in range(20):  # (same sizes each time: clevel 0; inodes get reused)
        carr[5:10] = float(k)
        carr.flush()
        assert c.chunk_data(0)[40:48] == struct.pack("<d", k)
    carr.append(np.arange(3000.0))
    carr.flush()
    assert c.reload_if_changed() and not c.reload_if_changed()
    assert np.array_equal(npy(c, "array.npy"), bcolz.open(str(root))[:])
    assert len(c.nested("chunks").names()) == c.chunk_count() == 6


def test_reads_reuse_the_layout_until_the_array_changes(damaged, monkeypatch):
    """A read of a cached chunk builds no .npy header and opens no superchunk (one lstat
    tells the file is unchanged); an append, or bcolz replacing a superchunk, is seen."""
    import ctdsfs.formats.bcolz.carray as carray_module
    import ctdsfs.formats.bcolz.ctable as ctable_module

    calls = {"npy_header": 0, "open_regular_beneath": 0}

    def counted(name):
        for module in (carray_module, ctable_module):
            real = getattr(module, name, None)
            if real is None:
                continue

            def call(*args, real=real, **kwargs):
                calls[name] += 1
                return real(*args, **kwargs)
            monkeypatch.setattr(module, name, call)

    monkeypatch.setattr(carray_module, "CHUNKS_AHEAD", 0)  # (reads here, no decoding ahead)
    counted("npy_header")
    counted("open_regular_beneath")
    root = damaged("trimmed")  # 27 int32 items, chunklen 8
    c = open_container(root, writable=True)
    table = open_container(damaged("table"))
    for view, name in ((c, "array.npy"), (table, "table.npy"), (table, "price.npy")):
        whole(view, name)
        before = dict(calls)
        for offset in range(0, view.entry_size(name), 7):
            view.read(name, offset, 13)
        assert calls == before, name
    size = c.entry_size("array.npy")
    c.write("array.npy", size, struct.pack("<i", 27))
    assert npy(c, "array.npy").tolist() == list(range(28))
    carr = bcolz.open(str(root), mode="a")
    carr[0] = 99
    carr.flush()
    assert c.read("array.npy", size - 27 * 4, 4) == struct.pack("<i", 99)


def test_mount_directory_of_rootdirs(rootdirs, mount):
    m = mount(rootdirs)
    top = m.mountpoint
    for name in sorted(CARRAYS) + OTHERS:
        loaded = np.load(top / name / "array.npy", mmap_mode="r")
        assert np.array_equal(loaded, bcolz.open(str(rootdirs / name))[:]), name
    t = bcolz.open(str(rootdirs / "table"))
    for name in t.names:
        assert np.array_equal(np.load(top / "table" / f"{name}.npy", mmap_mode="r"),
                              t[name][:])
    assert np.array_equal(np.load(top / "table" / "table.npy"), t[:])
    assert json.loads((top / "table" / "attrs.json").read_text()) == {"calendar": "NYSE"}
    assert sorted(os.listdir(top / "table" / "price")) == sorted(
        ["array.npy", "attrs.json", "meta.json", "chunks", "raw"])
    assert (top / "table" / "price" / "raw" / "meta" / "sizes").read_bytes() == \
        (rootdirs / "table" / "price" / "meta" / "sizes").read_bytes()
    # a superchunk copied out is a .blp file recognised by content: a directory
    expected = bcolz.open(str(rootdirs / "partial_last"))[3000:4000]
    assert sorted(os.listdir(top / "one.blp")) == ["chunks", "data", "header.json"]
    assert (top / "one.blp" / "data").read_bytes() == expected.tobytes()
    assert (top / "fake.blp").read_bytes() == b"not a bloscpack file"  # (by content)


def _readahead_kb(mountpoint, want, seconds=10):
    """The readahead of the file system at ``mountpoint`` (its bdi's, in KiB), once it is
    ``want`` (the daemon sets it just after the mount is live) or ``seconds`` passed."""
    device = os.stat(mountpoint).st_dev
    deadline = time.monotonic() + seconds
    while True:
        with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb") as f:
            kb = int(f.read())
        if kb == want or time.monotonic() > deadline:
            return kb
        time.sleep(0.02)


def test_mount_readahead_follows_the_chunks(tmp_path, mount):
    """A mapped reader's page fault makes the kernel read the mount's readahead around it:
    rootdirs of 1 MiB chunks get 512 KiB (a fault then needs one chunk half the time, at
    1 MiB always two), of 512 KiB chunks 256 KiB, a ctable as its largest chunks need;
    chunks of 2 MiB and more, and a directory of rootdirs, keep every other mount's 1 MiB."""
    from ctdsfs.container import READAHEAD_KB

    items = np.arange(300_000.0)
    (tmp_path / "tree").mkdir()
    for name, chunklen in (("c05", 1 << 16), ("c1", 1 << 17), ("c2", 1 << 18),
                           ("c4", 1 << 19)):
        bcolz.carray(items, rootdir=str(tmp_path / "tree" / name), mode="w",
                     chunklen=chunklen).flush()
    bcolz.ctable([items.astype(np.int32), items], names=["i", "x"], chunklen=1 << 17,
                 rootdir=str(tmp_path / "tree" / "t1"), mode="w").flush()
    for name, kb in (("c05", 256), ("c1", 512), ("c2", READAHEAD_KB), ("c4", READAHEAD_KB),
                     ("t1", 512)):
        m = mount(tmp_path / "tree" / name)
        assert _readahead_kb(m.mountpoint, kb) == kb, name
        loaded = np.load(m.mountpoint / ("x.npy" if name == "t1" else "array.npy"),
                         mmap_mode="r")
        assert np.array_equal(loaded[::997], items[::997]), name
        del loaded
    assert _readahead_kb(mount(tmp_path / "tree").mountpoint, READAHEAD_KB) == READAHEAD_KB


# ---------------------------------------------------------------- standalone bloscpack files

def bloscpack_file(path, data, *, chunk_size, checksum=0, offsets=True, metadata=None,
                   spare=0):
    """A bloscpack file (format 3) built from its documented layout: header, metadata
    section, offsets, then each Blosc chunk followed by its checksum."""
    names = ("None", "adler32", "crc32", "md5", "sha1", "sha224", "sha256", "sha384",
             "sha512")

    def digest(raw):
        name = names[checksum]
        if name == "None":
            return b""
        if name in ("adler32", "crc32"):
            return struct.pack("<I", getattr(zlib, name)(raw) & 0xFFFFFFFF)
        return hashlib.new(name, raw).digest()

    pieces = [data[i:i + chunk_size] for i in range(0, len(data), chunk_size)]
    chunks = [blosc.compress(p, typesize=8, cname="lz4") for p in pieces]
    chunks = [c + digest(c) for c in chunks]
    options = (1 if offsets else 0) | (2 if metadata is not None else 0)
    out = bytearray(struct.pack("<4sBBBBiiqq", b"blpk", 3, options, checksum, 8, chunk_size,
                                len(pieces[-1]), len(pieces), spare))
    if metadata is not None:
        text = json.dumps(metadata).encode()
        packed = zlib.compress(text)
        out += struct.pack("<8sBBBBIII8s", b"JSON", 0, 1, 1, 6, len(text), len(packed) + 10,
                           len(packed), b"")  # (adler32 of the stored bytes, zlib)
        out += packed + bytes(10) + struct.pack("<I", zlib.adler32(packed))
    table_at = len(out)
    if offsets:
        out += bytes(8 * (len(chunks) + spare))
    positions = []
    for chunk in chunks:
        positions.append(len(out))
        out += chunk
    if offsets:
        out[table_at:table_at + 8 * len(chunks)] = struct.pack(f"<{len(chunks)}q", *positions)
    path.write_bytes(bytes(out))
    return path


@pytest.mark.parametrize("checksum,offsets,metadata", [
    (0, True, None), (1, True, {"dtype": "<f8"}), (2, False, None), (6, True, {"a": [1]}),
    (8, False, {"x": "y"})])
def test_standalone_bloscpack(tmp_path, checksum, offsets, metadata):
    data = np.arange(10007.0).tobytes()
    path = bloscpack_file(tmp_path / "x.blp", data, chunk_size=16384, checksum=checksum,
                          offsets=offsets, metadata=metadata,
                          spare=50 if offsets else 0)  # (bloscpack's default: 10 x nchunks)
    c = open_container(path)
    assert whole(c, "data") == data
    assert c.read("data", 16380, 10) == data[16380:16390]
    assert c.read("data", 100, 40000) == data[100:40100]  # (three chunks)
    assert c.read("data", len(data) - 5, 100) == data[-5:]
    assert c.read("data", len(data), 100) == b""
    header = json.loads(whole(c, "header.json"))
    assert header["header"]["nchunks"] == 5 and header["header"]["chunk_size"] == 16384
    assert (header["metadata"] or {}).get("value") == metadata
    chunks = c.nested("chunks")
    assert [whole(chunks, n) for n in chunks.names()] == [
        data[i:i + 16384] for i in range(0, len(data), 16384)]
    assert c.check() == ([], [f"{path}: 5 chunks"])
    if metadata is not None:  # a damaged metadata section is a problem, not a refusal
        raw = bytearray(path.read_bytes())
        raw[64 + 3] ^= 1
        path.write_bytes(bytes(raw))
        c = open_container(path)
        assert whole(c, "data") == data
        assert c.check()[0] == [f"{path}: metadata adler32 checksum mismatch"]


def test_bloscpack_checksum_mismatch_is_eio_for_that_chunk(tmp_path):
    data = np.arange(10007.0).tobytes()
    path = bloscpack_file(tmp_path / "x.blp", data, chunk_size=16384, checksum=6)
    raw = bytearray(path.read_bytes())
    second = struct.unpack("<q", raw[40:48])[0]
    raw[second + 30] ^= 0x10
    path.write_bytes(bytes(raw))
    c = open_container(path)
    assert c.read("data", 0, 100) == data[:100]
    with pytest.raises(BlockError, match=r"x\.blp: chunk 1: sha256 checksum mismatch"):
        c.read("data", 16384, 8)
    problems, _ = c.check()
    assert problems == [f"{path}: chunk 1: sha256 checksum mismatch"]


@pytest.mark.parametrize("patch,message", [
    (lambda h: h[:4] + b"\x02" + h[5:], "format version 2"),
    (lambda h: h[:16] + struct.pack("<q", 1 << 60) + h[24:], "cannot fit"),
    (lambda h: h[:8] + struct.pack("<i", 1 << 30) + h[12:], "at most"),
    (lambda h: h[:5] + b"\x40" + h[6:], "unknown options"),
])
def test_bloscpack_lying_header_is_refused(tmp_path, patch, message):
    path = bloscpack_file(tmp_path / "x.blp", bytes(50000), chunk_size=16384)
    raw = path.read_bytes()
    path.write_bytes(patch(raw[:32]) + raw[32:])
    with pytest.raises(FormatError, match=message):
        open_container(path)


# ---------------------------------------------------------------- bad input

@pytest.fixture
def damaged(rootdirs, tmp_path):
    """A fresh copy of a rootdir bcolz wrote, to damage."""
    def copy(name):
        return shutil.copytree(rootdirs / name, tmp_path / name)
    return copy


def patch_file(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("field,value,message", [
    (4, 0x7FFFFFF0, "Blosc header says 2147483632 bytes, its place holds 8000"),  # nbytes
    (12, 0x7FFFFFF0, "Blosc header says 2147483632 compressed bytes"),  # cbytes
    (12, 3, "Blosc header says 3 compressed bytes"),
])
def test_lying_blosc_header_is_eio_for_that_chunk(damaged, field, value, message):
    root = damaged("partial_last")
    patch_file(root / "data" / "__2.blp", 16 + field, struct.pack("<I", value))
    c = open_container(root)
    header = c.entry_size("array.npy") - 10000 * 8
    assert len(c.read("array.npy", header, 16000)) == 16000  # chunks 0 and 1 are fine
    with pytest.raises(BlockError) as info:
        c.read("array.npy", header + 16000, 8)
    assert str(info.value).startswith(f"{root}/data/__2.blp: chunk 2: {message}")
    problems, _ = c.check()
    assert len(problems) == 1 and "__2.blp: chunk 2" in problems[0]


def test_truncated_superchunk_and_bad_magic_are_eio(damaged):
    root = damaged("partial_last")
    path = root / "data" / "__4.blp"
    path.write_bytes(path.read_bytes()[:100])
    patch_file(root / "data" / "__5.blp", 0, b"XXXX")
    c = open_container(root)
    for number, why in ((4, "compressed bytes"), (5, "not a bcolz superchunk")):
        with pytest.raises(BlockError, match=f"__{number}.blp: chunk {number}: .*{why}"):
            c.nested("chunks").read(str(number), 0, 8)


def test_missing_superchunk_and_lying_sizes_are_refused(damaged):
    root = damaged("partial_last")
    os.unlink(root / "data" / "__4.blp")
    with pytest.raises(FormatError, match=r"1 of data/__0.blp .. __9.blp are missing"):
        open_container(root)
    root = damaged("trimmed")
    (root / "meta" / "sizes").write_text(json.dumps({"shape": [10 ** 18], "nbytes": 0}))
    with pytest.raises(FormatError, match="missing"):
        open_container(root)  # (at once: nothing loops over the claimed chunks)


@pytest.mark.parametrize("file,content,message", [
    ("meta/storage", "{", "not JSON"),
    ("meta/storage", json.dumps({"dtype": "object", "chunklen": 5}), "dtype 'object'"),
    ("meta/storage", json.dumps({"dtype": "f8", "chunklen": 0}), "chunklen 0"),
    ("meta/storage", json.dumps({"dtype": "f8", "chunklen": CHUNK_BYTES_MAX}),
     "ctdsfs reads chunks of"),
    ("meta/sizes", json.dumps({"shape": [-1]}), "not a list of counts"),
    ("meta/sizes", "[" * 100000 + "]" * 100000, "not JSON"),
    ("meta/sizes", " " * (2 << 20), "more than the"),
])
def test_hostile_meta_is_refused_in_one_line(damaged, file, content, message):
    root = damaged("trimmed")
    (root / file).write_text(content)
    with pytest.raises(FormatError, match=message) as info:
        open_container(root)
    assert "\n" not in str(info.value) and str(root) in str(info.value)


def test_superchunk_link_is_not_followed(damaged, tmp_path):
    root = damaged("trimmed")
    secret = tmp_path / "secret"
    shutil.copy(root / "data" / "__0.blp", secret)
    os.unlink(root / "data" / "__0.blp")
    os.symlink(secret, root / "data" / "__0.blp")
    c = open_container(root)
    with pytest.raises(BlockError, match="__0.blp: a symbolic link"):
        c.read("array.npy", c.entry_size("array.npy") - c.data_bytes(), 4)


def test_damaged_column_through_mount_is_eio_and_one_log_line(damaged, mount):
    root = damaged("table")
    price = root / "price" / "data" / "__1.blp"
    patch_file(price, 16 + 4, struct.pack("<I", 1 << 30))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    m = mount(root)
    good = np.load(m.mountpoint / "c3.npy")
    assert np.array_equal(good, bcolz.open(str(root))["c3"][:])
    with open(m.mountpoint / "price.npy", "rb") as f:
        f.seek(128 + 64 * 8)
        for _ in range(3):  # (the kernel retries: still one line)
            with pytest.raises(OSError) as info:
                f.read(8)
            assert info.value.errno == 5
    # (a read of good bytes sharing a kernel request with the bad chunk fails too)
    assert (m.mountpoint / "price" / "chunks" / "0").read_bytes() == \
        bcolz.open(str(root))["price"][:64].tobytes()
    lines = [line for line in m.log_text().splitlines() if "__1.blp" in line]
    assert len(lines) == 1 and "price/data/__1.blp: chunk 1:" in lines[0] and \
        "Blosc header says 1073741824 bytes" in lines[0]
    m.close()
    assert before == {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_fuzz_flipped_bytes_never_crash(damaged, tmp_path):
    """Random bytes flipped in real superchunks, meta files and a bloscpack file (with
    metadata and checksums): reads give bytes or a BlockError, opening may give a
    FormatError, never anything else (no crash, no hang, no huge allocation)."""
    rng = random.Random(13)
    root = damaged("float32_lz4hc")
    bloscpack_file(root / "extra.blp", np.arange(5000.0).tobytes(), chunk_size=8192,
                   checksum=2, metadata={"dtype": "<f8"})
    files = sorted(p for p in root.rglob("*") if p.is_file())
    originals = {p: p.read_bytes() for p in files}
    for _ in range(300):
        victim = rng.choice(files)
        raw = bytearray(originals[victim])
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(min(len(raw), 64)) if rng.random() < 0.7 \
                else rng.randrange(len(raw))
            raw[where] ^= 1 << rng.randrange(8)
        victim.write_bytes(bytes(raw))
        for path, names in ((root, ("array.npy", "meta.json", "attrs.json")),
                            (root / "extra.blp", ("data", "header.json"))):
            try:
                c = open_container(path)
                for name in names:
                    try:
                        whole(c, name)
                    except BlockError:
                        pass
                c.check()
                c.close()
            except FormatError:
                pass
        victim.write_bytes(originals[victim])


# ---------------------------------------------------------------- commands

def ctdsfs(*args):
    return subprocess.run(["ctdsfs", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def test_info_and_check_commands(rootdirs, damaged):
    done = ctdsfs("info", "--json", rootdirs / "table")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["format"] == "bcolz ctable" and len(info["columns"]) == CTABLE_COLUMNS
    done = ctdsfs("info", rootdirs / "partial_last")
    assert done.returncode == 0 and "bcolz carray" in done.stdout and "10000" in done.stdout
    done = ctdsfs("info", rootdirs / "one.blp")
    assert done.returncode == 0 and "bloscpack" in done.stdout
    for name in ("table", "trimmed", "one.blp"):  # (a trim leaves superchunks behind)
        done = ctdsfs("check", "--json", rootdirs / name)
        assert done.returncode == 0 and json.loads(done.stdout)["clean"] is True, done.stdout
    root = damaged("table")
    patch_file(root / "flag" / "data" / "__2.blp", 16 + 12, b"\xff\xff\xff")
    done = ctdsfs("check", "--json", root)
    assert done.returncode == 1, done.stdout
    problems = json.loads(done.stdout)["problems"]
    assert len(problems) == 1 and "flag/data/__2.blp: chunk 2:" in problems[0]
    os.unlink(root / "price" / "meta" / "storage")
    done = ctdsfs("check", root)
    assert done.returncode == 1 and "price" in done.stdout and "Traceback" not in done.stderr


# ---------------------------------------------------------------- writing (-o rw)

def blosc_fields(path):
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = struct.unpack(
        "<BBBBIII", path.read_bytes()[16:32])
    return flags, typesize


def test_writes_through_mount_are_read_back_by_bcolz(damaged, mount):
    root = damaged("float64_bitshuffle")
    other = damaged("table")
    flags_before = blosc_fields(root / "data" / "__0.blp")
    expected = bcolz.open(str(root))[:]
    m = mount(root.parent, options=["rw"])
    top = m.mountpoint
    array = np.load(top / root.name / "array.npy", mmap_mode="r+")
    array[10:20] = -1.0  # inside chunk 0
    span = slice(bcolz.open(str(root)).chunklen - 3, bcolz.open(str(root)).chunklen + 3)
    array[span] = 42.0  # across chunks 0 and 1
    array.flush()
    del array
    expected[10:20] = -1.0
    expected[span] = 42.0
    assert np.array_equal(bcolz.open(str(root))[:], expected)
    assert blosc_fields(root / "data" / "__0.blp") == flags_before  # its own cparams
    with open(top / root.name / "array.npy", "ab") as f:  # appending items, in pieces
        extra = np.arange(3001.0) + 0.25
        f.write(extra.tobytes()[:8001])
        f.write(extra.tobytes()[8001:])
    expected = np.concatenate([expected, extra])
    assert np.array_equal(bcolz.open(str(root))[:], expected)
    assert np.array_equal(np.load(top / root.name / "array.npy"), expected)
    meta = json.loads((top / root.name / "meta.json").read_text())
    assert meta["sizes"]["shape"] == [len(expected)] == [json.loads(
        (root / "meta" / "sizes").read_text())["shape"][0]]
    assert len(meta["chunks"]) == len(os.listdir(top / root.name / "chunks"))
    # a ctable column takes overwrites
    price = np.load(top / "table" / "price.npy", mmap_mode="r+")
    price[100:110] = np.arange(10) * 1000.0
    price.flush()
    del price
    assert np.array_equal(bcolz.open(str(other))["price"][100:110], np.arange(10) * 1000.0)
    # refused with EPERM and a log line: derived files, the header, shrinking, a column append
    for path, offset, data in [(top / root.name / "chunks" / "0", 0, b"x"),
                               (top / root.name / "meta.json", 0, b"x"),
                               (top / root.name / "array.npy", 3, b"x"),
                               (top / "table" / "price.npy", 10 ** 6, bytes(8))]:
        fd = os.open(path, os.O_WRONLY)
        try:
            with pytest.raises(OSError) as info:
                os.pwrite(fd, data, offset if offset < 10 ** 6 else os.fstat(fd).st_size)
            assert info.value.errno == 1, path
        finally:
            os.close(fd)
    for size in (200, 10 ** 12):  # shrinking, and growing other than by writing items
        with pytest.raises(OSError) as info:
            os.truncate(top / root.name / "array.npy", size)
        assert info.value.errno == 1
    assert m.log_text().count("refused") >= 5
    with open(top / root.name / "array.npy", "ab") as f:
        f.write(b"abc")  # not a whole item: refused at close
        with pytest.raises(OSError) as info:
            f.close()
    assert np.array_equal(bcolz.open(str(root))[:], expected)


def test_read_only_mount_refuses_writes(damaged, mount):
    root = damaged("trimmed")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    m = mount(root)
    with pytest.raises(OSError) as info:
        with open(m.mountpoint / "array.npy", "r+b") as f:
            f.seek(200)
            f.write(b"12345678")
    assert info.value.errno in (30, 13)
    m.close()
    assert before == {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_derived_views_answer_alike(rootdirs, tmp_path):
    """bcolz and TileDB views share one base (container.DerivedView): a subdirectory is
    no file to read, a read-only view refuses changes naming itself, every nested view
    describes its files and problems."""
    from ..tiledb.tiledb_arrays import write_dense

    write_dense(str(tmp_path / "dense"))
    carray = open_container(rootdirs / "trimmed")
    array = open_container(tmp_path / "dense")
    for view, subdirectory, label in ((carray, "chunks", rootdirs / "trimmed"),
                                      (array, "fragments", tmp_path / "dense")):
        assert view.contains(subdirectory) and not view.contains("nothing")
        assert view.entry_size(subdirectory) == 0
        with pytest.raises(IsADirectoryError):
            view.read(subdirectory, 0, 10)
        with pytest.raises(CtdsfsError, match=f"^{label} is read-only"):
            view.write(view.names()[0], 0, b"x")
        nested = view.nested(subdirectory)
        info = nested.describe()
        assert info["problems"] == [] and [f["name"] for f in info["files"]] == nested.names()
        assert view.usage().block_size == 4096 and not view.dirty
    carray.close()
    array.close()


def test_kill_9_during_writes_leaves_old_or_new(damaged, tmp_path):
    """Generation k overwrites every item with k, then appends 500 items of k; a daemon
    killed at any moment leaves bcolz reading values k or k + 1 only (each superchunk old
    or new), and a length from before the append in flight up to after it (meta/sizes is
    never ahead of the data: items past the data would read as garbage or fail)."""
    from ...conftest import Mount, require_fuse
    require_fuse()
    root = damaged("float64_clevel0")  # chunklen 1024, 2500 items
    initial = bcolz.open(str(root))
    initial[:] = 0.0
    initial.flush()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(9)
    done, length = 0, 2500  # generations completed, and the length they left
    outcomes = set()
    for _ in range(8):
        m = Mount(root, mnt, options=["rw"], log=tmp_path / "kill.log")
        m.kill_after(rng.uniform(0.0, 0.4))
        try:
            while True:
                k = done + 1
                fd = os.open(mnt / "array.npy", os.O_WRONLY)
                try:
                    header = os.fstat(fd).st_size - length * 8
                    for count, at in ((length, header), (500, header + length * 8)):
                        if os.pwrite(fd, np.full(count, float(k)).tobytes(), at) < count * 8:
                            raise OSError("short write: the daemon is gone")
                finally:
                    os.close(fd)
                done, length = k, length + 500
        except OSError:
            pass
        m.reap_killed()
        values = bcolz.open(str(root))[:]
        assert length <= len(values) <= length + 500  # (whole items of the append in flight)
        assert set(np.unique(values)) <= {float(done), float(done + 1)}, (done, values)
        outcomes.add((len(values) - length, bool(np.any(values == done + 1))))
        done, length = int(values.min()), len(values)  # (the next round redoes done + 1)
    assert any(mixed for _, mixed in outcomes)  # (some kill landed inside a generation)


def test_ctable_hostile_column_list(damaged):
    root = damaged("table")
    rootdirs = json.loads((root / "__rootdirs__").read_text())
    names = rootdirs["names"]
    rootdirs["names"] = names[:3] + [names[0], "../table", "", "missing"]
    (root / "__rootdirs__").write_text(json.dumps(rootdirs))
    c = open_container(root)
    assert c.names() == [f"{n}.npy" for n in names[:3]] + ["table.npy", "attrs.json", "ctable.json"] \
        + names[:3]
    assert len(c.problems) == 4
    table = npy(c, "table.npy")  # (bcolz itself does not open this ctable)
    for name in names[:3]:
        assert np.array_equal(table[name], bcolz.open(str(root / name))[:])


def test_ctable_grown_by_bcolz_is_reloaded(damaged):
    root = damaged("table")
    c = open_container(root)
    assert not c.reload_if_changed()
    t = bcolz.open(str(root), mode="a")
    t.append([np.arange(5)] * 9 + [np.arange(5.0), np.array([b"x"] * 5), np.ones(5, bool)])
    t.flush()
    assert c.reload_if_changed()
    assert np.array_equal(npy(c, "table.npy"), bcolz.open(str(root))[:])
    assert np.array_equal(npy(c, "price.npy"), bcolz.open(str(root))["price"][:])


def test_bloscpack_spare_offsets_need_no_chunk_room(tmp_path):
    """bloscpack reserves offsets for 10 x nchunks appended chunks by default: a small,
    well-compressed file has fewer bytes than 16 per reserved chunk, and is valid."""
    path = bloscpack_file(tmp_path / "z.blp", bytes(5 * 16384), chunk_size=16384, spare=200)
    assert path.stat().st_size < 205 * 16
    assert whole(open_container(path), "data") == bytes(5 * 16384)


@pytest.mark.parametrize("name", ["trimmed", "table"])
def test_second_writer_is_refused(damaged, name):
    root = damaged(name)
    first = open_container(root, writable=True)
    with pytest.raises(CtdsfsError, match="another writer holds"):
        open_container(root, writable=True)
    open_container(root).close()  # (readers are welcome)
    first.close()
    open_container(root, writable=True).close()


def test_write_edges_through_the_api(damaged):
    """A short write ending inside an item is refused; a page-long one is held, its
    pending bytes read back; refused writes change nothing at all."""
    root = damaged("trimmed")  # 27 int32 items, chunklen 8
    c = open_container(root, writable=True)
    end = c.entry_size("array.npy")
    with pytest.raises(NotPermitted, match="ends inside an item"):
        c.write("array.npy", end, b"\x05\x00")  # half an item, in a short write
    assert c.entry_size("array.npy") == end and len(bcolz.open(str(root))) == 27
    page = np.arange(27, 27 + 1024, dtype="<i4").tobytes()
    c.write("array.npy", end, page + b"\x05\x00")  # a page and half an item: held
    assert c.read("array.npy", end + 4092, 6) == struct.pack("<i", 1050) + b"\x05\x00"
    with pytest.raises(NotPermitted, match="appends continue at the end"):
        c.write("array.npy", end + 4096 + 8, bytes(4))  # (a gap)
    c.write("array.npy", end + 4096 + 2, b"\x00\x00" + struct.pack("<i", 6))
    assert list(bcolz.open(str(root))[:]) == list(range(1051)) + [5, 6]
    c.close()
    table = damaged("table")
    before = (table / "price" / "data" / "__4.blp").read_bytes()
    c = open_container(table, writable=True)
    size = c.entry_size("price.npy")
    with pytest.raises(NotPermitted, match="columns grow together"):
        c.write("price.npy", size - 8, bytes(16))  # the last item, and one more
    assert (table / "price" / "data" / "__4.blp").read_bytes() == before


def test_parallel_reads_of_a_chunk_decompress_it_once():
    """The kernel's readahead sends several reads of one chunk at once: the first
    decompresses, the others wait for it (they used to decompress it each)."""
    import threading

    from ctdsfs.io.decoded_cache import DecodedCache

    cache = DecodedCache()
    release = threading.Event()
    loads = []

    def load():
        loads.append(1)
        release.wait(10)
        return b"chunk"

    first = threading.Thread(target=cache.get_or_load, args=("k", 1, load))
    first.start()
    while "k" not in cache._loading:  # (the first reader is decompressing)
        first.join(0.001)
    others = [threading.Thread(target=cache.get_or_load, args=("k", 1, load))
              for _ in range(3)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(0.05)  # (a reader that does not wait would be done by now)
    release.set()
    for thread in [first] + others:
        thread.join(10)
    assert len(loads) == 1 and cache.get("k", 1) == b"chunk"
