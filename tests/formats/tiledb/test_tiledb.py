"""TileDB arrays as directories, checked against libtiledb (tiledb-py writes every fixture).

Every decoded field of every fragment must equal what tiledb reads when opened at that
fragment's timestamps; dense/ATTR.npy must equal ``A[:]``. Damaged arrays give one-line
errors, EIO for the one bad tile, hidden entries: never a traceback.
"""

import errno
import io
import json
import os
import random
import shutil
import struct
import subprocess

import numpy as np
import pytest
import tiledb

from ctdsfs.errors import BlockError, CtdsfsError
from ctdsfs.formats import open_container
from ctdsfs.formats.tiledb.array import read_generic_tile

from .tiledb_arrays import (
    FILTERED_ATTRIBUTES,
    fragment_read,
    write_dense,
    write_filtered_sparse,
    write_var_strings,
)


@pytest.fixture(scope="session")
def arrays(tmp_path_factory):
    """The arrays every test reads (written once); tests that damage one copy it first."""
    root = tmp_path_factory.mktemp("tiledb")
    write_filtered_sparse(str(root / "sparse"))
    write_dense(str(root / "dense_row"))
    write_dense(str(root / "dense_col"), "col-major", "col-major")
    write_string_dimension_array(str(root / "strings"))
    write_var_strings(str(root / "var_strings"))
    return root


def write_string_dimension_array(uri):
    """Sparse, a string and an int dimension, var-sized nullable attribute, three overlapping
    fragments, a delete, then consolidation with timestamps and delete metadata."""
    dom = tiledb.Domain(tiledb.Dim("name", dtype="ascii"),
                        tiledb.Dim("y", domain=(0, 100), tile=10, dtype=np.int32))
    schema = tiledb.ArraySchema(domain=dom, sparse=True, capacity=4, attrs=[
        tiledb.Attr("val", dtype=np.float32),
        tiledb.Attr("note", dtype=str, var=True, nullable=True)])
    tiledb.Array.create(uri, schema)
    for t in (1, 2, 3):
        names = np.array([f"k{(i * 7 + t) % 13:02d}" for i in range(9)], dtype=object)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[names, np.arange(9, dtype=np.int32) * t] = {
                "val": np.arange(9, dtype=np.float32) + t,
                "note": np.array([f"n{t}{i}" if i % 2 else None for i in range(9)], dtype=object)}
    with tiledb.open(uri, "d", timestamp=4) as A:
        A.query(cond="val < 3.5").submit()
    tiledb.consolidate(uri, timestamp=(1, 5), config=tiledb.Config(
        {"sm.consolidation.with_timestamps": "true", "sm.consolidation.mode": "fragments"}))


def load(container, name):
    return np.load(io.BytesIO(container.read(name, 0, container.entry_size(name))))


def fragments(uri):
    """(name, fragment container, fragment.json) of every fragment ctdsfs shows."""
    folder = open_container(uri).nested("fragments")
    for name in folder.names():
        frag = folder.nested(name)
        yield name, frag, json.loads(frag.read("fragment.json", 0, 1 << 30))


def var_cells(frag, field):
    """A var-sized field's cells (bytes) from FIELD.offsets.npy and FIELD.data."""
    offsets = load(frag, f"{field}.offsets.npy")
    data = bytes(frag.read(f"{field}.data", 0, frag.entry_size(f"{field}.data")))
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def open_everything(uri):
    """Open the array at ``uri``, read every file, describe and check it: only a one-line
    CtdsfsError may come out (the fuzz tests' rule)."""
    try:
        array = open_container(str(uri))
        walk(array)
        array.describe()
        array.check()
    except CtdsfsError as exc:
        assert "\n" not in str(exc)


def walk(container, depth=0):
    """Read every file under ``container`` whole; the number of EIO tiles met."""
    bad = 0
    for name in container.names():
        child = container.nested(name)
        if child is not None:
            bad += walk(child, depth + 1) if depth < 4 else 0
            continue
        if container.symlink_target(name) is not None:
            continue  # (raw/ shows a link as a link: the VFS never reads through it)
        try:
            container.read(name, 0, container.entry_size(name))
        except BlockError:
            bad += 1
    return bad


# ---------------------------------------------------------------- equal to libtiledb

def test_sparse_fields_equal_libtiledb_for_every_filter(arrays):
    """Each filter alone and stacked, the coordinates (DOUBLE_DELTA + ZSTD), var-sized
    and nullable attributes: every fragment's .npy equals tiledb reading that fragment."""
    uri = str(arrays / "sparse")
    seen = 0
    for name, frag, meta in fragments(uri):
        ref = fragment_read(uri, name, meta["non_empty_domain"])
        names = frag.names()
        for field in list(FILTERED_ATTRIBUTES) + ["x", "maybe"]:
            got = load(frag, f"{field}.npy")
            assert got.tobytes() == np.ascontiguousarray(ref[field]).tobytes(), field
        assert load(frag, "pair.npy").dtype == np.complex64  # (FLOAT32 x 2, as tiledb-py)
        assert np.array_equal(load(frag, "pair.npy"), ref["pair"])
        assert [c.decode() for c in var_cells(frag, "text")] == list(ref["text"])
        assert load(frag, "maybe.validity.npy").shape == ref["x"].shape
        assert "raw" in names and frag.nested("raw").contains("__fragment_metadata.tdb")
        seen += 1
    assert seen == 2


def test_rle_and_dictionary_strings_equal_libtiledb(arrays):
    """RLE and DICTIONARY on var-sized strings keep the offsets in the data tile (the
    offsets tiles are empty): the decoded cells equal what tiledb reads."""
    uri = str(arrays / "var_strings")
    (name, frag, meta), = fragments(uri)
    ref = fragment_read(uri, name, meta["non_empty_domain"])
    for attr in ("rle_utf8", "rle_ascii", "dict_utf8", "dict_ascii", "rle_sum_utf8"):
        cells = var_cells(frag, attr)
        assert cells == [c if isinstance(c, bytes) else c.encode() for c in ref[attr]], attr
    assert frag.check()[0] == []


def tile_order_to_grid(cells, grid, extents, order):
    """Cells stored tile by tile (tile and cell order ``order``) as the 2-D region they cover."""
    (gr, gc), (er, ec) = grid, extents
    if order == "row-major":
        return cells.reshape(gr, gc, er, ec).transpose(0, 2, 1, 3).reshape(gr * er, gc * ec)
    return cells.reshape(gc, gr, ec, er).transpose(1, 3, 0, 2).reshape(gr * er, gc * ec)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_dense_fragments_in_tile_order(arrays, layout):
    """A dense fragment's tiles cover its non-empty domain grown to whole tiles; inside that
    domain they hold what tiledb reads at the fragment's timestamp (aligned or not)."""
    uri = str(arrays / f"dense_{layout}")
    order = f"{layout}-major"
    for name, frag, meta in fragments(uri):
        (r0, r1), (c0, c1) = meta["non_empty_domain"]
        ref = fragment_read(uri, name, meta["non_empty_domain"])
        tr0, tc0 = (r0 - 1) // 4, c0 // 3  # first tile (domain starts at r=1, c=0)
        grid = ((r1 - 1) // 4 - tr0 + 1, c1 // 3 - tc0 + 1)
        for attr in ("v", "k", "m"):
            region = tile_order_to_grid(load(frag, f"{attr}.npy"), grid, (4, 3), order)
            inside = region[r0 - 1 - 4 * tr0:r1 - 4 * tr0, c0 - 3 * tc0:c1 + 1 - 3 * tc0]
            assert np.array_equal(inside, ref[attr]), (name, attr)
        validity = tile_order_to_grid(load(frag, "m.validity.npy"), grid, (4, 3), order)
        t = meta["timestamps"][0]
        shape = ref["m"].shape
        assert validity[r0 - 1 - 4 * tr0:r1 - 4 * tr0, c0 - 3 * tc0:c1 + 1 - 3 * tc0].tolist() \
            == (np.arange(shape[0] * shape[1]) % 3 != 0).reshape(shape).astype(int).tolist(), t
        strings = np.array([c.decode() for c in var_cells(frag, "s")], dtype=object)
        inside = tile_order_to_grid(strings, grid, (4, 3), order)
        assert inside[r0 - 1 - 4 * tr0:r1 - 4 * tr0, c0 - 3 * tc0:c1 + 1 - 3 * tc0].tolist() \
            == ref["s"].tolist()
        assert "r.npy" not in frag.names()  # a dense fragment stores no coordinates


@pytest.mark.parametrize("layout", ["row", "col"])
def test_dense_view_equals_whole_array(arrays, layout):
    """dense/ATTR.npy: fill values, then fragments in timestamp order, as A[:] reads."""
    uri = str(arrays / f"dense_{layout}")
    dense = open_container(uri).nested("dense")
    with tiledb.open(uri) as A:
        ref = A[:]
    assert sorted(dense.names()) == ["k.npy", "m.npy", "m.validity.npy", "s.data",
                                     "s.offsets.npy", "v.npy"]
    for attr in ("v", "k"):
        assert np.array_equal(load(dense, f"{attr}.npy"), ref[attr], equal_nan=True), attr
    assert (load(dense, "k.npy") == -7).any()  # the fill value shows where nothing was written
    valid = load(dense, "m.validity.npy").astype(bool)
    assert np.array_equal(valid, ~ref["m"].mask) and not valid.all()
    assert np.array_equal(load(dense, "m.npy"), ref["m"].data)
    cells = var_cells(dense, "s")  # row-major; tiledb-py drops the fill's trailing NUL
    assert [c.rstrip(b"\0").decode() for c in cells] == ref["s"].ravel().tolist()
    assert b"\0" in cells and b"1:0" in cells


def test_dense_var_sized_view_equals_whole_array(tmp_path):
    """dense/ATTR.offsets.npy + ATTR.data of var-sized bytes and int32 attributes over
    overlapping fragments (col-major cells, so row-major output is a reordering), equal
    cell for cell to A[:], the fill value where nothing was written."""
    uri = str(tmp_path / "var")
    dom = tiledb.Domain(tiledb.Dim("r", domain=(0, 5), tile=4, dtype=np.int64),
                        tiledb.Dim("c", domain=(0, 4), tile=2, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, cell_order="col-major", tile_order="col-major",
        attrs=[tiledb.Attr("b", dtype=bytes, var=True, filters=[tiledb.ZstdFilter()]),
               tiledb.Attr("i", dtype=np.int32, var=True)]))

    def cells(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    for t, (rows, cols) in enumerate([(slice(0, 4), slice(0, 3)), (slice(2, 6), slice(1, 5))],
                                     start=1):
        n = (rows.stop - rows.start) * (cols.stop - cols.start)
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[rows, cols] = {
                "b": cells([bytes([t]) * (k % 4) for k in range(n)]).reshape(shape),
                "i": cells([np.arange(1 + k % 3, dtype=np.int32) + 10 * t
                            for k in range(n)]).reshape(shape)}
    dense = open_container(uri).nested("dense")
    with tiledb.open(uri) as A:
        ref = A[:]
    assert var_cells(dense, "b") == ref["b"].ravel().tolist()
    got = [np.frombuffer(c, np.int32).tolist() for c in var_cells(dense, "i")]
    assert got == [c.tolist() for c in ref["i"].ravel()]
    assert b"\x80" in var_cells(dense, "b")  # the fill where nothing was written


def test_consolidation_timestamps_deletes_and_string_dimensions(arrays):
    """The consolidated fragment holds every cell of the three it merged, with t.tdb
    timestamps; dt.tdb/dci.tdb mark the deleted cells; a string dimension reads as
    offsets + data; each plain fragment equals tiledb at its timestamp."""
    uri = str(arrays / "strings")
    merged, written = None, set()
    for name, frag, meta in fragments(uri):
        if meta["has_timestamps"]:
            merged = frag, meta
            continue
        t = meta["timestamps"][0]
        ref = fragment_read(uri, name, meta["non_empty_domain"])
        cells = list(zip([c.decode() for c in var_cells(frag, "name")],
                         load(frag, "y.npy").tolist(), load(frag, "val.npy").tolist()))
        assert sorted(cells) == sorted(zip([n.decode() for n in ref["name"]], ref["y"].tolist(),
                                           ref["val"].tolist()))
        written |= {cell + (t,) for cell in cells}
    frag, meta = merged
    assert meta["has_delete_meta"] and meta["timestamps"] == [1, 3]
    stamps = load(frag, "__timestamps.npy").tolist()
    values = load(frag, "val.npy")
    cells = set(zip([c.decode() for c in var_cells(frag, "name")], load(frag, "y.npy").tolist(),
                    values.tolist(), stamps))
    assert cells == written and len(written) == 27
    deleted = load(frag, "__delete_timestamps.npy") == 4
    assert deleted.tolist() == (values < 3.5).tolist()
    assert (load(frag, "__delete_condition_index.npy")[deleted] == 0).all()
    valid = load(frag, "note.validity.npy").astype(bool)
    notes = var_cells(frag, "note")
    assert valid.any() and not valid.all()
    assert all(n.startswith(b"n") == v for n, v in zip(notes, valid))  # nulls are empty


def test_schema_and_metadata_json(arrays):
    array = open_container(str(arrays / "dense_col"))
    assert array.names() == ["schema.json", "schemas", "metadata.json", "fragments", "dense"]
    schema = json.loads(array.read("schema.json", 0, 1 << 20))
    assert schema["cell_order"] == schema["tile_order"] == "col-major"
    k = next(a for a in schema["attributes"] if a["name"] == "k")
    assert k["fill"] == -7 and [f["name"] for f in k["filters"]["filters"]] == \
        ["DOUBLE_DELTA", "LZ4"]
    assert [d["tile_extent"] for d in schema["dimensions"]] == [4, 3]
    meta = json.loads(array.read("metadata.json", 0, 1 << 20))
    with tiledb.open(str(arrays / "dense_col")) as A:
        assert {k: v["value"] for k, v in meta.items()} == \
            {k: list(v) if isinstance(v, tuple) else v for k, v in A.meta.items()}
    schemas = array.nested("schemas")
    assert len(schemas.names()) == 1 and json.loads(
        schemas.read(schemas.names()[0], 0, 1 << 20)) == schema


def test_listing_fragments_reads_no_fragment_metadata(arrays):
    """Listing fragments/ (and counting its subdirectories) opens no fragment metadata:
    what makes listing an array of 1,000 fragments fast."""
    array = open_container(str(arrays / "sparse"))
    folder = array.nested("fragments")
    assert all(folder.nested(n) is not None for n in folder.names())
    assert all(array.fragment(n).meta is None for n in folder.names())


def test_uncommitted_fragment_is_not_shown(arrays, tmp_path):
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    commit = sorted((uri / "__commits").iterdir())[0]
    commit.unlink()
    array = open_container(str(uri))
    assert commit.name[:-4] not in array.nested("fragments").names()
    assert any("no commit file" in p for p in array.problems)


# ---------------------------------------------------------------- through a real mount

def test_mounted_array_and_directory_source(arrays, mount):
    m = mount(arrays / "sparse")
    assert sorted(os.listdir(m.mountpoint)) == ["fragments", "metadata.json", "schema.json",
                                                "schemas", "sparse"]
    frag = sorted((m.mountpoint / "fragments").iterdir())[0]
    uri = str(arrays / "sparse")
    meta = json.loads((frag / "fragment.json").read_text())
    ref = fragment_read(uri, frag.name, meta["non_empty_domain"])
    assert np.array_equal(np.load(frag / "stacked.npy", mmap_mode="r"), ref["stacked"])
    assert (frag / "raw" / "a0.tdb").read_bytes() == \
        (arrays / "sparse" / "__fragments" / frag.name / "a0.tdb").read_bytes()
    tree = mount(arrays, options=["rw"])  # arrays inside a directory source, read-only
    with tiledb.open(str(arrays / "dense_row")) as A:
        assert np.array_equal(np.load(tree.mountpoint / "dense_row" / "dense" / "k.npy"),
                              A[:]["k"])
    with pytest.raises(OSError) as err:
        (tree.mountpoint / "dense_row" / "schema.json").write_text("{}")
    assert err.value.errno == errno.EROFS


def flip_in_tile(path, at=-3):
    """Flip one byte of the last chunk data of the file's first tile."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_checksum_mismatch_is_eio_for_that_tile(arrays, tmp_path, mount):
    """A flipped byte under CHECKSUM_MD5 gives EIO on md5.npy with one log line naming the
    fragment, field and tile; the other fields still read; check exits 1 naming it."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "sparse", uri)
    index = list(FILTERED_ATTRIBUTES).index("md5")
    name = sorted((uri / "__fragments").iterdir())[0].name
    flip_in_tile(uri / "__fragments" / name / f"a{index}.tdb")
    m = mount(uri)
    frag = m.mountpoint / "fragments" / name
    with pytest.raises(OSError) as err:
        (frag / "md5.npy").read_bytes()
    assert err.value.errno == errno.EIO
    assert np.load(frag / "zstd.npy").size == 3000
    lines = [line for line in m.log_text().splitlines() if "checksum" in line]
    assert len(lines) == 1 and f"fragments/{name}/md5.npy" in lines[0] and "tile 5" in lines[0]
    result = subprocess.run(["ctdsfs", "check", str(uri)], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "CHECKSUM_MD5 checksum mismatch" in result.stdout + result.stderr


# ---------------------------------------------------------------- damaged and hostile arrays

def write_generic_tile(path, body):
    """``path`` as one unfiltered generic tile holding ``body`` (as libtiledb could write)."""
    pipeline = struct.pack("<II", 65536, 0)
    chunks = struct.pack("<QIII", 1, len(body), len(body), 0) + body
    head = struct.pack("<IQQBQBI", 22, len(chunks), len(body), 6, 1, 0, len(pipeline))
    path.write_bytes(head + pipeline + chunks)


def edit_schema(uri, edit):
    path = next(p for p in (uri / "__schema").iterdir() if p.is_file())
    body, _ = read_generic_tile(path.read_bytes(), 0, "schema")
    write_generic_tile(path, edit(body))


def test_rewritten_schema_still_reads(arrays, tmp_path):
    """The helper's unfiltered schema tile is read like libtiledb's zlib one (and by it)."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    edit_schema(uri, lambda body: body)
    with tiledb.open(str(uri)) as A:
        assert np.array_equal(load(open_container(str(uri)).nested("dense"), "k.npy"),
                              A[:]["k"])


def test_unknown_filter_leaves_field_in_raw_only(arrays, tmp_path):
    uri = tmp_path / "a"
    shutil.copytree(arrays / "sparse", uri)
    marker = b"\x04\x00\x00\x00zstd"  # name length, name; then type, cell_val_num, pipeline

    def unknown_filter(body):
        at = body.index(marker) + len(marker) + 5 + 8
        assert body[at] == 2  # ZSTD
        return body[:at] + b"\x63" + body[at + 1:]
    edit_schema(uri, unknown_filter)
    for _, frag, meta in fragments(str(uri)):
        assert "zstd.npy" not in frag.names() and "gzip.npy" in frag.names()
        assert "unknown(99) cannot be undone" in meta["fields"]["zstd"]["problem"]
        assert frag.nested("raw").contains("a2.tdb")


@pytest.mark.parametrize("hostile", [b"a/b/c", b"..\x00\x00\x00"[:5], b"\x1b[31m"])
def test_hostile_attribute_names_are_hidden(arrays, tmp_path, hostile):
    uri = tmp_path / "a"
    shutil.copytree(arrays / "sparse", uri)
    edit_schema(uri, lambda body: body.replace(b"\x05\x00\x00\x00plain",
                                               b"\x05\x00\x00\x00" + hostile))
    for _, frag, meta in fragments(str(uri)):
        shown = [n for n in frag.names() if n.endswith(".npy")]
        assert all("/" not in n and "\0" not in n for n in shown)
        assert len(shown) == len(FILTERED_ATTRIBUTES) + 4 - (hostile != b"\x1b[31m")
    result = subprocess.run(["ctdsfs", "info", str(uri)], capture_output=True, text=True)
    assert result.returncode == 0 and "\x1b" not in result.stdout


def data_file(uri, attr):
    frag = sorted((uri / "__fragments").iterdir())[0]
    return frag / f"a{list(FILTERED_ATTRIBUTES).index(attr)}.tdb"


def truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


def bomb(path):
    """The first chunk declares 3 GiB of original bytes."""
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", 3 << 30)
    path.write_bytes(bytes(data))


def set_footer_u64(uri, index, value):
    """Set u64 number ``index`` after the footer's fixed part (file sizes first)."""
    meta = sorted((uri / "__fragments").iterdir())[0] / "__fragment_metadata.tdb"
    data = bytearray(meta.read_bytes())
    footer = len(data) - 8 - struct.unpack("<Q", data[-8:])[0]
    name_len = struct.unpack_from("<Q", data, footer + 4)[0]
    at = footer + 4 + 8 + name_len + 1 + 1 + 16 + 16 + 2 + 8 * index  # 1-D int64 domain
    data[at:at + 8] = struct.pack("<Q", value)
    meta.write_bytes(bytes(data))


FIELDS = len(FILTERED_ATTRIBUTES) + 4  # + text, maybe, the legacy coordinates slot, x


DAMAGE = {  # what is done, and what ``ctdsfs check`` must say about it
    "truncated data file": (lambda uri: truncate(data_file(uri, "zstd"), 1000),
                            "run past the end of the file"),
    "empty data file": (lambda uri: truncate(data_file(uri, "gzip"), 0),
                        "run past the end of the file"),
    "decompression bomb": (lambda uri: bomb(data_file(uri, "zstd")),
                           "chunks declare more than the tile's"),
    "lying footer": (lambda uri: set_footer_u64(uri, 0, 1 << 40),
                     "bytes, the footer says 1099511627776"),
    "tile offsets past any file": (lambda uri: set_footer_u64(uri, 3 * FIELDS + 1, 1 << 63),
                                   "past any file"),
    "truncated fragment metadata": (lambda uri: truncate(
        sorted((uri / "__fragments").iterdir())[0] / "__fragment_metadata.tdb", 500),
        "__fragment_metadata.tdb"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damage_is_eio_or_a_problem_never_a_traceback(arrays, tmp_path, damage):
    uri = tmp_path / "a"
    shutil.copytree(arrays / "sparse", uri)
    spoil, said = DAMAGE[damage]
    spoil(uri)
    array = open_container(str(uri))
    bad = walk(array)
    problems = [p for _, frag, _ in fragments(str(uri)) for p in frag.problems]
    assert bad or problems
    for command in (["info"], ["info", "--json"], ["check", "--json"]):
        result = subprocess.run(["ctdsfs", *command, str(uri)], capture_output=True, text=True)
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr
    check = subprocess.run(["ctdsfs", "check", str(uri)], capture_output=True, text=True)
    assert check.returncode == 1 and said in check.stdout, check.stdout + check.stderr


def test_damaged_schema_is_one_line(arrays, tmp_path):
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    truncate(next(p for p in (uri / "__schema").iterdir() if p.is_file()), 40)
    with pytest.raises(CtdsfsError) as err:
        open_container(str(uri))
    assert "__schema" in str(err.value) and "\n" not in str(err.value)
    result = subprocess.run(["ctdsfs", "info", str(uri)], capture_output=True, text=True)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1


def test_fuzzed_bytes_never_escape(arrays, tmp_path):
    """Flip random bytes of the schema, fragment metadata and data files of a real array:
    opening, listing and reading everything raises nothing but one-line errors."""
    rng = random.Random(7)
    pristine = arrays / "strings"
    files = sorted(p.relative_to(pristine) for p in pristine.rglob("*")
                   if p.is_file() and p.stat().st_size and "__commits" not in p.parts)
    for round_ in range(60):
        uri = tmp_path / f"f{round_}"
        shutil.copytree(pristine, uri)
        for _ in range(rng.choice((1, 3, 8))):
            path = uri / rng.choice(files)
            data = bytearray(path.read_bytes())
            at = rng.randrange(len(data))
            data[at] = rng.choice((0, 0xFF, data[at] ^ (1 << rng.randrange(8))))
            path.write_bytes(bytes(data))
        open_everything(uri)
        shutil.rmtree(uri)


def test_info_and_check_json(arrays):
    uri = str(arrays / "strings")
    info = json.loads(subprocess.run(["ctdsfs", "info", "--json", uri], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["format"] == "TileDB" and len(info["fragments"]) == 4
    assert [d["name"] for d in info["schema"]["dimensions"]] == ["name", "y"]
    check = subprocess.run(["ctdsfs", "check", "--json", uri], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = subprocess.run(["ctdsfs", "info", uri], capture_output=True, text=True, check=True)
    assert "TileDB sparse array" in text.stdout


def test_old_format_versions(data_dir):
    """Arrays old libtiledb releases wrote (TileDB's own backward-compatibility inputs):
    version 10 (fragments beside their .ok files, no tile statistics) and an empty v11."""
    uri = str(data_dir / "tiledb" / "zero_var_chunks_v10")
    (name, frag, meta), = fragments(uri)
    assert meta["version"] == 10 and "fragment_statistics" not in meta
    ref = fragment_read(uri, name, meta["non_empty_domain"])
    assert load(frag, "a.npy").tolist() == ref["a"].tolist() == [1]
    assert var_cells(frag, "d") == list(ref["d"]) == [b""]
    assert frag.check()[0] == []
    empty = open_container(str(data_dir / "tiledb" / "sparse_array_v11"))
    schema = json.loads(empty.read("schema.json", 0, 1 << 20))
    assert schema["version"] == 11 and empty.nested("fragments").names() == []
    a3 = schema["attributes"][2]
    assert (a3["type"], a3["cell_val_num"], a3["filters"]["filters"][0]["name"]) == \
        ("FLOAT32", 2, "ZSTD")


def test_version_1_array_equals_libtiledb(data_dir, tmp_path):
    """Format version 1 (TileDB 1.4): schema in __array_schema.tdb, a fragment committed by
    its folder's name alone, metadata in one generic tile, coordinates of both dimensions
    in __coords.tdb (zipped); each dimension reads as its own .npy, equal to libtiledb."""
    uri = tmp_path / "v1"
    shutil.copytree(data_dir / "tiledb" / "non_split_coords_v1_4_0", uri)
    (name, frag, meta), = fragments(str(uri))
    assert meta["version"] == 1 and meta["timestamps"] == [1541540586869] * 2
    assert meta["non_empty_domain"] == [[1, 4], [10, 10]]
    with tiledb.open(str(uri)) as array:
        ref = array[:]
    for field in ("a", "d1", "d2"):
        assert load(frag, f"{field}.npy").tolist() == ref[field].tolist()
    assert frag.check()[0] == []
    check = subprocess.run(["ctdsfs", "check", str(uri)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_version_1_fragment_metadata_flipped_never_escapes(data_dir, tmp_path):
    """Every byte of a version 1 fragment's metadata and coordinates set to 0, 0xFF and
    flipped: opening, listing, reading and checking raise only one-line errors."""
    uri = tmp_path / "v1"
    shutil.copytree(data_dir / "tiledb" / "non_split_coords_v1_4_0", uri)
    (folder,) = [p for p in uri.iterdir() if p.is_dir()]
    for path in (folder / "__fragment_metadata.tdb", folder / "__coords.tdb"):
        pristine = path.read_bytes()
        for at in range(len(pristine)):
            for value in {0, 0xFF, pristine[at] ^ 0x10}:
                path.write_bytes(pristine[:at] + bytes([value]) + pristine[at + 1:])
                open_everything(uri)
        path.write_bytes(pristine)


def test_version_1_attribute_name_never_leaves_the_fragment(data_dir, tmp_path):
    """Before version 9 data files are named after their attribute: a schema naming one
    ``../../x`` hides that field (reason in fragment.json, a check problem) and never
    reads ``x.tdb`` two folders up, which the test plants there."""
    uri = tmp_path / "v1"
    shutil.copytree(data_dir / "tiledb" / "non_split_coords_v1_4_0", uri)
    (folder,) = [p for p in uri.iterdir() if p.is_dir()]
    (tmp_path / "x.tdb").write_bytes((folder / "a.tdb").read_bytes())
    path = uri / "__array_schema.tdb"
    body, _ = read_generic_tile(path.read_bytes(), 0, "schema")
    write_generic_tile(path, swap(struct.pack("<I", 1) + b"a",
                                  struct.pack("<I", 7) + b"../../x")(bytes(body)))
    (name, frag, meta), = fragments(str(uri))
    assert [n for n in frag.names() if n.endswith(".npy")] == ["d1.npy", "d2.npy"]
    assert "not shown" in json.dumps(meta["fields"]["../../x"])
    problems = frag.check()[0]
    assert any("../../x.tdb" in p and "not a file name" in p for p in problems), problems


@pytest.mark.parametrize("name,why", [
    ("dense_array_v1_3_0", "format version 81 is not one ctdsfs reads"),
    ("experimental_array_vUINT32_MAX", "format version 4294967295 is not one ctdsfs reads")])
def test_unversioned_and_future_arrays_are_refused_in_one_line(data_dir, name, why):
    """An array from before format versions (TileDB 1.3) and one from a future version:
    `ctdsfs info` says which version it met, exit status 1, no traceback."""
    done = subprocess.run(["ctdsfs", "info", str(data_dir / "tiledb" / name)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and why in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_consolidated_fragment_metadata(arrays, tmp_path):
    """__fragment_meta/NAME.meta (the footers of every fragment in one generic tile) reads
    as fragment_meta/NAME.meta.json, each footer equal to the fragment's own."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    tiledb.consolidate(str(uri), config=tiledb.Config(
        {"sm.consolidation.mode": "fragment_meta"}))
    folder = open_container(str(uri)).nested("fragment_meta")
    (name,) = folder.names()
    footers = json.loads(folder.read(name, 0, 1 << 20))["fragments"]
    own = {n: meta for n, _, meta in fragments(str(uri))}
    assert [f["fragment"] for f in footers] == list(own)
    for footer in footers:
        meta = own[footer["fragment"]]
        assert footer["non_empty_domain"] == meta["non_empty_domain"]
        assert footer["file_sizes"]["v"] == meta["fields"]["v"]["file_size"]


def swap(old, new):
    """An edit of the decoded schema: ``old`` (which must be there) becomes ``new``."""
    def edit(body):
        assert old in body
        return body.replace(old, new, 1)
    return edit


def without_dimensions(body):
    """The domain's two dimensions cut out, the count set to 0 (the rest still parses)."""
    start = body.index(b"\x02\x00\x00\x00\x01\x00\x00\x00r")
    end = body.index(b"\x04\x00\x00\x00\x01\x00\x00\x00v")  # four attributes, v first
    return body[:start] + b"\x00\x00\x00\x00" + body[end:]


HOSTILE_SCHEMA_EDITS = {  # edits of dense_row's decoded schema
    "cells of 0 values": swap(b"\x01\x00\x00\x00v\x03\x01\x00\x00\x00",
                              b"\x01\x00\x00\x00v\x03\x00\x00\x00\x00"),
    "unknown datatype": swap(b"\x01\x00\x00\x00v\x03", b"\x01\x00\x00\x00v\xbd"),
    "fill value of the wrong size": swap(b"\x02\x00\x00\x00\x00\x00\x00\x00\xf9\xff",
                                         b"\x01\x00\x00\x00\x00\x00\x00\x00\xf9"),
    "domain of the wrong size": swap(b"\x08\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00",
                                     b"\x07\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"),
    "no dimensions": without_dimensions,
}


@pytest.mark.parametrize("edit", HOSTILE_SCHEMA_EDITS)
def test_hostile_schema_values(arrays, tmp_path, edit):
    """Values inside the schema (behind its zlib checksum in real files) that no writer
    makes: a one-line refusal, or the array with EIO where it cannot be read."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    edit_schema(uri, HOSTILE_SCHEMA_EDITS[edit])
    try:
        walk(open_container(str(uri)))
    except CtdsfsError as exc:
        assert "__schema" in str(exc) and "\n" not in str(exc)


def test_fuzzed_schema_values_never_escape(arrays, tmp_path):
    """Random bytes of the decoded schema (written back unfiltered, so no codec check
    stops them) and of fragment footers: only one-line errors and EIO."""
    rng = random.Random(11)
    for round_ in range(40):
        uri = tmp_path / f"f{round_}"
        shutil.copytree(arrays / "dense_row", uri)

        def flip(body):
            body = bytearray(body)
            for _ in range(rng.choice((1, 2, 4))):
                body[rng.randrange(len(body))] = rng.randrange(256)
            return bytes(body)
        edit_schema(uri, flip)
        open_everything(uri)
        shutil.rmtree(uri)


def test_timestamped_names_are_ordered_as_numbers(tmp_path):
    """__meta/__9_9_... is older than __10_10_...: the later put wins, as in libtiledb."""
    uri = str(tmp_path / "a")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, 9), tile=5, dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=np.int32)], sparse=True))
    for t, value in ((9, "older"), (10, "newer")):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A.meta["key"] = value
    meta = json.loads(open_container(uri).read("metadata.json", 0, 1 << 20))
    with tiledb.open(uri) as A:
        assert meta["key"]["value"] == A.meta["key"] == "newer"


def test_consolidated_dense_array(arrays, tmp_path):
    """After consolidation (not vacuumed) the merged fragment covers the three it holds:
    its tiles, and dense/ATTR.npy, still equal what tiledb reads."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_col", uri)
    tiledb.consolidate(str(uri), config=tiledb.Config({"sm.consolidation.mode": "fragments"}))
    names = [name for name, _, _ in fragments(str(uri))]
    assert len(names) == 4 and names[1].startswith("__1_3_")
    with tiledb.open(str(uri)) as A:
        ref = A[:]
    dense = open_container(str(uri)).nested("dense")
    for attr in ("v", "k", "m"):
        assert np.array_equal(load(dense, f"{attr}.npy"), ref[attr], equal_nan=True), attr
    frag = open_container(str(uri)).nested("fragments").nested(names[1])
    whole = tile_order_to_grid(load(frag, "k.npy"), (3, 3), (4, 3), "col-major")
    assert np.array_equal(whole, ref["k"])


def test_linked_data_file_is_never_followed(arrays, tmp_path):
    """A data file (or __commits/__meta file) that is a symbolic link is not read through:
    an array could otherwise hand out any file the daemon may read. The link's field
    fails (EIO, a check problem); nothing of the outside file appears."""
    uri = tmp_path / "a"
    shutil.copytree(arrays / "sparse", uri)
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET-" * 50_000)
    target = data_file(uri, next(iter(FILTERED_ATTRIBUTES)))
    secret_copy = target.read_bytes()
    target.unlink()
    (tmp_path / "outside.tdb").write_bytes(secret_copy)
    target.symlink_to(tmp_path / "outside.tdb")  # a perfectly valid data file, but outside
    array = open_container(str(uri))
    assert walk(array) >= 1  # the linked field's tiles fail
    problems, _ = array.check()
    assert any(target.name in p for p in problems), problems


def test_one_bounded_reader_for_tiledb_and_pycauset(arrays, tmp_path):
    """TileDB's generic tiles and pycauset's metadata map read through one bounded reader
    (io/byte_reader.py): a length past the end is refused before anything is taken,
    each format saying so in its own words."""
    from ctdsfs.errors import FormatError
    from ctdsfs.formats.pycauset import decode_typed
    from ctdsfs.io.byte_reader import Reader

    reader = Reader(b"\x05\x00\x00\x00ab", "x")
    with pytest.raises(FormatError, match=r"^x: truncated \(wanted 5 bytes, 2 left\)$"):
        reader.take(reader.unpack("I"))
    assert reader.pos == 4 and bytes(reader.take(2)) == b"ab" and not reader.left()
    with pytest.raises(FormatError, match=r"^metadata payload is truncated$"):
        decode_typed(b"\x08\x01\x00\x00\x00\x01\x00k\x05\xff\xff\xff\x7f")
    assert decode_typed(b"\x08\x01\x00\x00\x00\x01\x00k\x05\x02\x00\x00\x00hi") == \
        ("map", [("k", ("str", "hi"))])
    uri = tmp_path / "a"
    shutil.copytree(arrays / "dense_row", uri)
    schema = next(p for p in (uri / "__schema").iterdir() if p.is_file())
    truncate(schema, 80)
    with pytest.raises(FormatError, match=rf"^{uri}: __schema/{schema.name}: truncated "
                                          r"\(wanted \d+ bytes, \d+ left\)$"):
        open_container(str(uri))


def test_tiles_decoded_ahead_are_queued_once_and_waited_for():
    """A tile queued for decoding ahead counts as being decoded: asking again queues
    nothing (duplicates used to hold a second read-ahead thread waiting on the first,
    so tiles were decoded one at a time), and a reader that wants it waits for that one
    decoding; a tile that fails ahead is decoded again by its reader, who gets the error."""
    import threading

    from ctdsfs.io.decoded_cache import DecodedCache

    cache = DecodedCache()
    queued, loads, got = [], [], []

    def load():
        loads.append(1)
        return b"tile"

    cache.load_ahead("k", 1, load, queued.append)
    cache.load_ahead("k", 1, load, queued.append)
    assert len(queued) == 1
    reader = threading.Thread(target=lambda: got.append(cache.get_or_load("k", 1, load)))
    reader.start()
    reader.join(0.05)
    assert reader.is_alive()  # (waits for the queued decoding instead of doing its own)
    queued[0]()
    reader.join(10)
    assert got == [b"tile"] and loads == [1]
    cache.load_ahead("k", 1, load, queued.append)  # cached: nothing to do
    assert len(queued) == 1

    def bad():
        raise BlockError("tile 3: checksum mismatch", "tile 3: checksum mismatch")

    cache.load_ahead("bad", 1, bad, queued.append)
    queued[-1]()
    with pytest.raises(BlockError, match="checksum"):
        cache.get_or_load("bad", 1, bad)
