"""Hostile TileDB arrays: links inside the array, decompression bombs, hostile filter
pipelines, encryption. Each gives a one-line refusal, a problem, or EIO for one tile:
never a byte from outside the array, a traceback or unbounded memory."""

import bz2
import errno
import functools
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tiledb
import zstandard

from ctdsfs.errors import BlockError, CtdsfsError
from ctdsfs.formats import open_container
from ctdsfs.formats.tiledb.array import read_generic_tile

OUTSIDE_VALUE = 424242  # every cell of the outside array; never seen through the inside one
INSIDE_VALUE = 7


def write_sparse(uri, value, key):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 99), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    with tiledb.open(uri, "w") as A:
        A[np.arange(5)] = {"a": np.full(5, value, np.int64)}
        A.meta[key] = value


def write_dense(uri, value, key):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 19), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=False, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    with tiledb.open(uri, "w") as A:
        A[0:20] = np.full(20, value, np.int64)
        A.meta[key] = value


def ctdsfs(*args):
    return subprocess.run(["ctdsfs", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def fragment_names(uri):
    return sorted(os.listdir(uri / "__fragments"))


def relink(inside, outside, folder):
    """Replace ``inside/folder`` by a link to ``outside/folder``."""
    shutil.rmtree(inside / folder)
    (inside / folder).symlink_to(outside / folder)


def linked_fragments_folder(tree, outside):
    """``__fragments`` a link to another array's, with its commits copied in."""
    inside = tree / "fragments_folder"
    write_sparse(str(inside), INSIDE_VALUE, "inside_key")
    relink(inside, outside, "__fragments")
    for commit in os.listdir(outside / "__commits"):
        shutil.copy(outside / "__commits" / commit, inside / "__commits" / commit)
    return inside, []


def linked_dense_fragments_folder(tree, outside_dense):
    inside = tree / "dense_fragments_folder"
    write_dense(str(inside), INSIDE_VALUE, "inside_key")
    relink(inside, outside_dense, "__fragments")
    for commit in os.listdir(outside_dense / "__commits"):
        shutil.copy(outside_dense / "__commits" / commit, inside / "__commits" / commit)
    return inside, []


def linked_fragment(tree, outside):
    """One fragment folder a link to the other array's, with its commit copied in."""
    inside = tree / "fragment"
    write_sparse(str(inside), INSIDE_VALUE, "inside_key")
    own = fragment_names(inside)
    name = fragment_names(outside)[0]
    (inside / "__fragments" / name).symlink_to(outside / "__fragments" / name)
    shutil.copy(outside / "__commits" / f"{name}.wrt", inside / "__commits")
    return inside, own


def linked_meta_and_commits(tree, outside):
    """``__meta`` and ``__commits`` links to the other array's (its fragments copied in:
    only the outside commits would make them part of the array)."""
    inside = tree / "meta_and_commits"
    write_sparse(str(inside), INSIDE_VALUE, "inside_key")
    shutil.rmtree(inside / "__fragments")
    shutil.copytree(outside / "__fragments", inside / "__fragments")
    relink(inside, outside, "__meta")
    relink(inside, outside, "__commits")
    return inside, []


def test_linked_folders_are_never_followed(tmp_path, mount):
    """Folders of an array that are links to another array's (with the commits that would
    make its fragments part of this one): ``ctdsfs info`` lists no outside fragment and
    says why, the library view and a mount serve no cell or metadata byte of it."""
    outside, outside_dense = tmp_path / "outside", tmp_path / "outside_dense"
    write_sparse(str(outside), OUTSIDE_VALUE, "outside_key")
    write_dense(str(outside_dense), OUTSIDE_VALUE, "outside_key")
    outside_names = set(fragment_names(outside)) | set(fragment_names(outside_dense))
    tree = tmp_path / "tree"
    tree.mkdir()
    cases = [linked_fragments_folder(tree, outside),
             linked_dense_fragments_folder(tree, outside_dense),
             linked_fragment(tree, outside), linked_meta_and_commits(tree, outside)]
    for inside, own in cases:
        assert not set(open_container(str(inside)).nested("fragments").names()) & outside_names
        done = ctdsfs("info", "--json", inside)
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert [f["name"] for f in info["fragments"]] == own, inside.name
        assert "outside_key" not in info["metadata"]
        assert any("link" in p for p in info["problems"]), info["problems"]
    m = mount(tree)
    for case in os.listdir(m.mountpoint):
        assert "fragments" in os.listdir(m.mountpoint / case)  # (each shown as an array)
    for root, _, files in os.walk(m.mountpoint):
        for name in files:
            data = (m.mountpoint / root / name).read_bytes()
            assert b"outside_key" not in data, name
            if name.endswith(".npy"):
                assert OUTSIDE_VALUE not in np.load(m.mountpoint / root / name).ravel(), name


# ---------------------------------------------------------------- decompression bombs

BOMB_BYTES = 128 << 20  # what a hostile part inflates to; memory must not grow by it
GROWTH_LIMIT = 40 << 20  # (a legitimate read of these small arrays grows far less)
GZIP, ZSTD = 1, 2


def pipeline_bytes(*filters):
    """A filter pipeline: (filter type, option bytes) each."""
    out = struct.pack("<II", 0, len(filters))
    for ftype, options in filters:
        out += struct.pack("<BI", ftype, len(options)) + options
    return out


def compressor(ftype):
    return ftype, struct.pack("<Bi", ftype, 1)


def one_chunk(original, payload, declared_part):
    """A tile of one chunk whose one compressed data part declares ``declared_part`` bytes."""
    meta = struct.pack("<IIII", 0, 1, declared_part, len(payload))
    return struct.pack("<QIII", 1, original, len(payload), len(meta)) + meta + payload


def generic_tile(version, pipeline, body, declared):
    head = struct.pack("<IQQBQBI", version, len(body), declared, 6, 1, 0, len(pipeline))
    return head + pipeline + body


@functools.lru_cache(maxsize=None)
def gzip_bomb():
    z = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join([z.compress(chunk) for _ in range(BOMB_BYTES >> 20)] + [z.flush()])


def zstd_bomb():
    return zstandard.ZstdCompressor(write_content_size=True).compress(bytes(BOMB_BYTES))


def measure(script, path):
    """Run ``script`` (with ``path`` and ``open_container`` at hand) in a fresh process:
    (peak memory growth in bytes, what it printed)."""
    code = ("import sys\nfrom ctdsfs.formats import open_container\n"
            "path = sys.argv[1]\n"
            "def peak():  # (VmHWM: ru_maxrss would be pytest's, kept across fork and exec)\n"
            "    with open('/proc/self/status') as f:\n"
            "        return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))\n"
            "before = peak()\n"
            f"{script}\n"
            "after = peak()\n"
            "print((after - before) * 1024)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    return int(lines[-1]), lines[:-1]


def test_metadata_bomb_declaring_nothing_is_refused_in_bounded_memory(tmp_path):
    """A GZIP generic tile in __meta whose header declares 0 bytes and that inflates to
    128 MiB: a problem naming the file, memory as before."""
    uri = tmp_path / "a"
    write_sparse(str(uri), INSIDE_VALUE, "key")
    meta = next((uri / "__meta").iterdir())
    version = struct.unpack("<I", meta.read_bytes()[:4])[0]
    meta.write_bytes(generic_tile(version, pipeline_bytes(compressor(GZIP)),
                                  one_chunk(0, gzip_bomb(), 0), 0))
    grew, printed = measure("a = open_container(path)\nprint(a.metadata())\n"
                            "print('\\n'.join(a.problems))", uri)
    assert grew < GROWTH_LIMIT, grew
    assert printed[0] == "{}" and any(meta.name in p and "GZIP" in p for p in printed[1:])
    done = ctdsfs("check", uri)
    assert "Traceback" not in done.stderr and meta.name in done.stdout + done.stderr


def data_tile_file(uri, attr_index=0):
    frag = uri / "__fragments" / fragment_names(uri)[0]
    return frag / f"a{attr_index}.tdb"


def write_one_tile(uri, filters, n=30_000):
    """A sparse array of one tile of n float64 (hard to compress: the file is large
    enough to hold a bomb)."""
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, n - 1), tile=n, dtype=np.int64))
    tiledb.Array.create(str(uri), tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=n,
        attrs=[tiledb.Attr("a", dtype=np.float64, filters=tiledb.FilterList(filters))]))
    with tiledb.open(str(uri), "w") as A:
        A[np.arange(n)] = {"a": np.random.default_rng(1).random(n)}
    return n * 8


@pytest.mark.parametrize("kind", ["gzip declaring nothing", "zstd frame declaring more"])
def test_data_tile_bomb_is_eio_in_bounded_memory(tmp_path, mount, kind):
    """A data tile whose compressed part inflates far past what it declares: EIO for that
    tile (the mount), a problem (check), memory as before."""
    uri = tmp_path / "a"
    gzip = kind.startswith("gzip")
    expected = write_one_tile(uri, [tiledb.GzipFilter() if gzip else tiledb.ZstdFilter()])
    path = data_tile_file(uri)
    bomb = gzip_bomb() if gzip else zstd_bomb()
    original = 0 if gzip else expected
    room = path.stat().st_size - len(one_chunk(original, b"", 0))
    assert len(bomb) <= room
    path.write_bytes(one_chunk(original, bomb + bytes(room - len(bomb)), original))
    grew, printed = measure("problems, _ = open_container(path).check()\n"
                            "print('\\n'.join(problems))", uri)
    assert grew < GROWTH_LIMIT, grew
    assert printed and all("Traceback" not in p for p in printed)
    assert any("tile 0 of a" in p for p in printed), printed
    if not gzip:
        return  # (one mount shows it is EIO there too)
    m = mount(uri)
    frag = next((m.mountpoint / "fragments").iterdir())
    with pytest.raises(OSError) as err:
        (frag / "a.npy").read_bytes()
    assert err.value.errno == errno.EIO


def test_double_delta_over_many_blocks_equals_libtiledb(tmp_path):
    """DOUBLE_DELTA is undone a block of values at a time (bounded memory): a tile of
    many blocks still equals what libtiledb reads."""
    n = 200_003
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, n - 1), tile=n, dtype=np.int64))
    rng = np.random.default_rng(3)
    values = {"i64": np.cumsum(rng.integers(-1000, 1000, n)).astype(np.int64),
              "u16": rng.integers(0, 1 << 16, n).astype(np.uint16)}
    attrs = [tiledb.Attr(k, dtype=v.dtype, filters=tiledb.FilterList(
        [tiledb.DoubleDeltaFilter()], chunksize=1 << 22)) for k, v in values.items()]
    tiledb.Array.create(str(tmp_path / "a"), tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=n, attrs=attrs))
    with tiledb.open(str(tmp_path / "a"), "w") as A:
        A[np.arange(n)] = values
    frag = open_container(str(tmp_path / "a")).nested("fragments")
    frag = frag.nested(frag.names()[0])
    for name, want in values.items():
        got = np.load(io.BytesIO(bytes(frag.read(f"{name}.npy", 0, 1 << 30))))
        assert np.array_equal(got, want), name


# ---------------------------------------------------------------- hostile filter pipelines

def rewrite_schema(uri, edit):
    """Decode the schema tile, ``edit`` its bytes, write it back unfiltered (so no codec
    or checksum stands in the way of the hostile value)."""
    path = next(p for p in (uri / "__schema").iterdir() if p.is_file())
    body, _ = read_generic_tile(path.read_bytes(), 0, "schema")
    body = edit(bytes(body))
    chunks = struct.pack("<QIII", 1, len(body), len(body), 0) + body
    pipeline = pipeline_bytes()
    path.write_bytes(struct.pack("<IQQBQBI", 22, len(chunks), len(body), 6, 1, 0,
                                 len(pipeline)) + pipeline + chunks)


MARKED_LEVEL = 17  # the validity pipeline's ZSTD level: finds it in the schema


def write_nullable(uri):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 99), tile=100, dtype=np.int64))
    tiledb.Array.create(str(uri), tiledb.ArraySchema(
        domain=dom, sparse=True, attrs=[tiledb.Attr("m", dtype=np.int32, nullable=True)],
        validity_filters=tiledb.FilterList([tiledb.ZstdFilter(level=MARKED_LEVEL)])))
    with tiledb.open(str(uri), "w") as A:
        A[np.arange(50)] = {"m": np.ma.masked_array(np.arange(50, dtype=np.int32),
                                                    mask=np.arange(50) % 3 == 0)}


def validity_pipeline(*filters):
    def edit(body):
        marked = struct.pack("<BIBi", ZSTD, 5, ZSTD, MARKED_LEVEL)
        at = body.index(marked) - 8  # (the pipeline's max chunk size and filter count)
        assert body.count(marked) == 1
        return body[:at] + pipeline_bytes(*filters) + body[at + 8 + len(marked):]
    return edit


HOSTILE_PIPELINES = {
    "scale_float of width 3 on validity": (15, struct.pack("<ddQ", 1.0, 0.0, 3)),
    "scale_float options cut short": (15, struct.pack("<dd", 1.0, 0.0)),
}


@pytest.mark.parametrize("hostile", HOSTILE_PIPELINES)
def test_hostile_validity_pipeline_is_eio_never_a_traceback(tmp_path, mount, hostile):
    uri = tmp_path / "a"
    write_nullable(uri)
    rewrite_schema(uri, validity_pipeline(HOSTILE_PIPELINES[hostile]))
    array = open_container(str(uri))
    problems, _ = array.check()
    assert any("m.validity" in p or "_validity" in p for p in problems), problems
    done = ctdsfs("check", uri)
    assert "Traceback" not in done.stderr and "_validity" in done.stdout + done.stderr
    frag = open_container(str(uri)).nested("fragments")
    frag = frag.nested(frag.names()[0])
    assert np.array_equal(np.load(io.BytesIO(bytes(frag.read("m.npy", 0, 1 << 20))))[1:],
                          np.arange(1, 50))
    with pytest.raises(BlockError):
        frag.read("m.validity.npy", 0, 1 << 20)
    if hostile != next(iter(HOSTILE_PIPELINES)):
        return  # (one mount shows it is EIO there too)
    m = mount(uri)
    frag = next((m.mountpoint / "fragments").iterdir())
    with pytest.raises(OSError) as err:
        (frag / "m.validity.npy").read_bytes()
    assert err.value.errno == errno.EIO


# ---------------------------------------------------------------- encryption

def test_encrypted_array_is_refused_naming_the_file(tmp_path):
    """tiledb-py's AES-256-GCM array: open_file raises one line naming the array's schema
    file and the encryption (a mount of it then exits 1 with that line)."""
    uri = str(tmp_path / "secret")
    ctx = tiledb.Ctx(tiledb.Config({"sm.encryption_type": "AES_256_GCM",
                                    "sm.encryption_key": "0123456789abcdeF" * 2}))
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=10, dtype=np.int64), ctx=ctx)
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, attrs=[tiledb.Attr("a", dtype=np.int64, ctx=ctx)], ctx=ctx), ctx=ctx)
    with tiledb.open(uri, "w", ctx=ctx) as A:
        A[:] = np.arange(10)
    from ctdsfs.formats.tiledb.array import open_file
    with pytest.raises(CtdsfsError) as err:
        open_file(uri)
    message = str(err.value)
    assert uri in message and "__schema" in message and "encrypt" in message
    assert "AES-256-GCM" in message and "\n" not in message


@pytest.mark.parametrize("codec", ["gzip", "bzip2", "zstd"])
def test_part_inflating_past_its_size_is_eio(tmp_path, codec):
    """A compressed part holding more than it declares is a damaged tile (EIO), never
    cut silently to the declared size."""
    filters = {"gzip": tiledb.GzipFilter(), "bzip2": tiledb.Bzip2Filter(),
               "zstd": tiledb.ZstdFilter()}
    uri = tmp_path / "a"
    expected = write_one_tile(uri, [filters[codec]], n=2_000)
    payload = bytes(range(256)) * (expected // 256 + 8)
    compress = {"gzip": zlib.compress, "bzip2": bz2.compress,
                "zstd": zstandard.ZstdCompressor(write_content_size=False).compress}[codec]
    path = data_tile_file(uri)
    room = path.stat().st_size - len(one_chunk(expected, b"", expected))
    packed = compress(payload)
    assert len(packed) <= room
    path.write_bytes(one_chunk(expected, packed + bytes(room - len(packed)), expected))
    frag = open_container(str(uri)).nested("fragments")
    frag = frag.nested(frag.names()[0])
    with pytest.raises(BlockError, match="tile 0 of a"):
        frag.read("a.npy", 0, 1 << 20)
