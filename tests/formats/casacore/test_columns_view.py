"""columns/: a casacore table's columns as .npy files, read back with numpy.load and
compared with python-casacore's getcol/getvarcol."""

import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.errors import ReadOnlyError
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.formats.casacore.columns_view import ColumnsView

from .test_columns import CountingSource, made, table_source  # noqa: F401  (made: the fixture)


def read_in_pieces(view, name, piece=100_003):
    """A file of the view read as FUSE would, in ranged reads of odd size."""
    size = view.entry_size(name)
    data = b"".join(view.read(name, at, piece) for at in range(0, size, piece))
    assert len(data) == size
    return data


def load(view, name):
    return np.load(io.BytesIO(read_in_pieces(view, name)))


def test_measurement_set_columns_as_npy(made):  # noqa: F811 (the fixture)
    path = made("ms", "3000")
    view = ColumnsView(TableDirectory(path), path)
    names = set(view.names())
    assert {"DATA.npy", "FLAG.npy", "UVW.npy", "TIME.npy", "table.json"} <= names
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "FLAG", "UVW", "TIME", "ANTENNA1", "WEIGHT"):
            got = load(view, f"{name}.npy")
            expected = ref.getcol(name)
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            np.testing.assert_array_equal(got, expected, err_msg=name)
        described = json.loads(view.read("table.json", 0, 1 << 20))
        assert described["columns"]["UVW"]["keywords"]["QuantumUnits"]["values"] == ["m"] * 3
        assert described["columns"]["DATA"]["files"] == ["DATA.npy"]
        assert described["columns"]["FLAG_CATEGORY"]["files"] == [
            "FLAG_CATEGORY.shapes.npy", "FLAG_CATEGORY.offsets.npy", "FLAG_CATEGORY.values.npy"]
    with pytest.raises(ReadOnlyError):
        view.write("DATA.npy", 0, b"x")


def test_a_read_decodes_only_the_rows_it_touches(made, monkeypatch):  # noqa: F811 (the fixture)
    from ctdsfs.formats.casacore import columns_view as casacore_columns_view
    monkeypatch.setattr(casacore_columns_view, "BLOCK_BYTES", 256 << 10)
    path = made("ms", "3000")
    source = CountingSource(path)
    view = ColumnsView(source, path)
    size = view.entry_size("DATA.npy")
    def tiles_read():
        return sum(n for f, n in source.bytes_read.items() if "_TSM" in f)
    before = tiles_read()
    piece = view.read("DATA.npy", size // 2, 4096)
    moved = tiles_read() - before
    assert len(piece) == 4096
    assert 0 < moved < (size // 4), moved  # a block of rows, not the column
    with ct.table(path, ack=False) as ref:
        whole = ref.getcol("DATA")
    header = size - whole.nbytes
    assert piece == whole.tobytes()[size // 2 - header:size // 2 - header + 4096]


def kernel_reads(size, piece, swapped):
    """(offset, size) of a sequential reader's reads as the kernel sends them: in pairs,
    the second of a pair sometimes answered first."""
    reads = [(at, piece) for at in range(0, size, piece)]
    if swapped:
        for i in range(1, len(reads) - 1, 2):
            reads[i], reads[i + 1] = reads[i + 1], reads[i]
    return reads


@pytest.mark.parametrize("swapped", [False, True])
def test_a_sequential_reader_gets_blocks_decoded_once(made, monkeypatch, swapped):  # noqa: F811 (the fixture)
    """Reads smaller than a block going through DATA.npy (in order or in the kernel's
    swapped pairs) decode each block once, answered from memory (no worker thread) once
    decoded, holding at most two blocks; the bytes are getcol's."""
    from ctdsfs.formats.casacore import columns_view as casacore_columns_view
    monkeypatch.setattr(casacore_columns_view, "BLOCK_BYTES", 256 << 10)
    path = made("ms", "3000")
    view = ColumnsView(TableDirectory(path), path)
    size = view.entry_size("DATA.npy")
    column = view._entry("DATA.npy")
    decodes = []
    original = column.table.read_column
    monkeypatch.setattr(column.table, "read_column",
                        lambda *args: decodes.append(args[1:]) or original(*args))
    pieces = {}
    for at, n in kernel_reads(size, 64 << 10, swapped):
        pieces[at] = view.read("DATA.npy", at, n)
        assert len(column._blocks) <= 2
        assert view.cached("DATA.npy", at, n) or at == 0  # (the header: read, not held)
    data = b"".join(pieces[at] for at in sorted(pieces))
    with ct.table(path, ack=False) as ref:
        assert data[size - ref.getcol("DATA").nbytes:] == ref.getcol("DATA").tobytes()
    blocks = -(-3000 // column.rows_per_block)
    assert len(decodes) <= blocks + 1, decodes  # and the header's first rows, exactly
    # blocks start on multiples of their rows, where tiles start: whole tile rows
    assert all(first % column.rows_per_block == 0 for first, _ in decodes[1:]), decodes


def test_the_kernels_reads_in_flight_decode_side_by_side(made, monkeypatch):  # noqa: F811 (the fixture)
    """Two reads of a block or more (the kernel's 1 MiB reads in flight) decode their own
    rows at the same time, not one after the other."""
    from ctdsfs.formats.casacore import columns_view as casacore_columns_view
    monkeypatch.setattr(casacore_columns_view, "BLOCK_BYTES", 256 << 10)
    path = made("ms", "3000")
    view = ColumnsView(TableDirectory(path), path)
    column = view._entry("DATA.npy")
    original = column.table.read_column

    def slow(*args):
        time.sleep(0.5)
        return original(*args)
    monkeypatch.setattr(column.table, "read_column", slow)
    piece = 1 << 20
    with ThreadPoolExecutor(2) as pool:
        start = time.monotonic()
        got = list(pool.map(lambda at: view.read("DATA.npy", at, piece), [piece, 2 * piece]))
        took = time.monotonic() - start
    assert took < 0.9, took
    with ct.table(path, ack=False) as ref:
        whole = ref.getcol("DATA").tobytes()
    header = view.entry_size("DATA.npy") - len(whole)
    assert b"".join(got) == whole[piece - header:3 * piece - header]


def test_strings_and_variable_shapes(made):  # noqa: F811 (the fixture)
    path = made("var", "StandardStMan")
    view = ColumnsView(TableDirectory(path), path)
    with ct.table(path, ack=False) as ref:
        shapes = load(view, "v_float.shapes.npy")
        offsets = load(view, "v_float.offsets.npy")
        values = load(view, "v_float.values.npy")
        for row in range(ref.nrows()):
            if not ref.iscelldefined("v_float", row):
                assert (shapes[row] == -1).all()
                continue
            cell = values[offsets[row]:offsets[row + 1]].reshape(shapes[row])
            np.testing.assert_array_equal(cell, ref.getcell("v_float", row))
    path = made("fixed", "StandardStMan")
    view = ColumnsView(TableDirectory(path), path)
    with ct.table(path, ack=False) as ref:
        offsets = load(view, "s_string.offsets.npy")
        data = view.read("s_string.data", 0, view.entry_size("s_string.data"))
        strings = [data[offsets[i]:offsets[i + 1]].decode() for i in range(len(offsets) - 1)]
        assert strings == ref.getcol("s_string")
        np.testing.assert_array_equal(load(view, "a_bool.npy"), ref.getcol("a_bool"))


def string_cells(view, name):
    """Each row of String array column ``name`` from its files: None (undefined), or the
    cell as a list of lists (C order), as getvarcol's ``array`` reshaped to its ``shape``."""
    shapes, offsets = load(view, f"{name}.shapes.npy"), load(view, f"{name}.offsets.npy")
    bounds = load(view, f"{name}.values.offsets.npy")
    data = view.read(f"{name}.values.data", 0, view.entry_size(f"{name}.values.data"))
    strings = [data[bounds[k]:bounds[k + 1]].decode() for k in range(len(bounds) - 1)]
    assert shapes.dtype == np.int64 and offsets.dtype == bounds.dtype == np.uint64
    return [None if (shape < 0).all() else
            np.array(strings[offsets[i]:offsets[i + 1]], object).reshape(shape).tolist()
            for i, shape in enumerate(shapes)]


@pytest.mark.parametrize("manager", ["StandardStMan", "StManAipsIO", "IncrementalStMan"])
def test_string_arrays_give_back_getvarcol(made, manager):  # noqa: F811 (the fixture)
    """Fixed-shape (2 x 2) and variable-shape String arrays, non-ASCII strings and undefined
    cells included: from shapes, row offsets, string offsets and UTF-8 bytes."""
    for what, name in (("fixed", "a_string"), ("var", "v_string")):
        path = made(what, manager)
        view = ColumnsView(TableDirectory(path), path)
        cells = string_cells(view, name)
        described = json.loads(view.read("table.json", 0, 1 << 20))
        assert described["columns"][name]["files"] == [
            f"{name}.shapes.npy", f"{name}.offsets.npy", f"{name}.values.offsets.npy",
            f"{name}.values.data"]
        with ct.table(path, ack=False) as ref:
            expected = ref.getvarcol(name)
            undefined = 0
            for row, cell in enumerate(cells):
                if not ref.iscelldefined(name, row):
                    assert cell is None, (what, row)
                    undefined += 1
                    continue
                want = expected[f"r{row + 1}"]
                assert cell == np.array(want["array"], object).reshape(
                    want["shape"][1:]).tolist(), (what, row)
            if what == "fixed":  # getcol: {'shape': [nrow, 2, 2], 'array': all strings}
                whole = ref.getcol(name)
                assert [s for c in cells for r in c for s in r] == whole["array"]
                assert [len(cells)] + list(np.shape(cells[0])) == whole["shape"]
            assert any("日本語" in s for c in cells if c for r in c for s in r)
            assert undefined == (7 if what == "var" and manager != "IncrementalStMan" else 0)


def test_multifile_table(made):  # noqa: F811 (the fixture)
    path = made("fixed", "TiledColumnStMan", multifile=True)
    with table_source(path) as source:
        view = ColumnsView(source, path)
        with ct.table(path, ack=False) as ref:
            for name in ref.colnames():
                np.testing.assert_array_equal(load(view, f"{name}.npy"), ref.getcol(name))


def test_one_column_read_without_listing_the_view(made):  # noqa: F811 (the fixture)
    """A reader that opens DATA.npy by name (a Dask worker) reads nothing of the other
    columns: not the indirect arrays of WEIGHT and SIGMA (table.f3i), not FLAG's tiles;
    the listing that follows shows the same file."""
    path = made("ms", "3000")
    source = CountingSource(path)
    view = ColumnsView(source, path)
    data = load(view, "DATA.npy")
    assert set(source.bytes_read) <= {"table.dat", "table.lock", "table.f0", "table.f0_TSM1"}
    with ct.table(path, ack=False) as ref:
        np.testing.assert_array_equal(data, ref.getcol("DATA"))
    assert "DATA.npy" in view.names() and "table.f3i" in source.bytes_read


class _PlainSource:
    """A source with only ``read`` and ``entry_size`` (a remote store's kind)."""

    def __init__(self, path):
        self.local = TableDirectory(path)

    def entry_size(self, name):
        return self.local.entry_size(name)

    def read(self, name, offset, size):
        return self.local.read(name, offset, size)


def test_local_tables_read_into_aligned_buffers_and_decode_at_once(made):  # noqa: F811
    """A table of local files: tile bytes go into buffers that start as far past a
    64-byte boundary as their file offset does (the kernel copies into them at full
    speed), the pieces of a tile row each into its place, the same bytes as a source
    without ``read_into`` gives; the rows of its tiled columns are decoded on the
    mount's loop (``cached``), an indirect array's (StandardStMan) in worker threads.
    A MultiFile-stored table shown as a directory (TableView) reads its files through
    its container: neither."""
    from ctdsfs.formats.casacore.base import read_aligned, read_pieces
    from ctdsfs.sources.columns import with_columns
    from ctdsfs.sources.directory import directory_or_table

    path = made("ms", "3000")
    (tiles,) = open_table(TableDirectory(path)).manager_files("DATA")
    raw = open(os.path.join(path, tiles), "rb").read()
    local, plain = TableDirectory(path), _PlainSource(path)
    for offset, size in [(0, 4096), (1, 100), (4095, 70_001), (65_536 + 48, 1 << 17)]:
        got = read_aligned(local, tiles, offset, size, "tiles")
        assert got.__array_interface__["data"][0] % 64 == offset % 64
        assert got.tobytes() == raw[offset:offset + size] == \
            read_aligned(plain, tiles, offset, size, "tiles").tobytes()
        pieces = read_pieces(local, tiles, offset, 5000, 7, 333, "tiles")
        assert pieces.tolist() == read_pieces(plain, tiles, offset, 5000, 7, 333,
                                              "tiles").tolist()
        assert pieces[6].tobytes() == raw[offset + 30_000:offset + 30_333]
    header = len(ColumnsView(local, path).read("DATA.npy", 0, 128))
    assert ColumnsView(local, path).cached("DATA.npy", header, 1 << 20)
    assert not ColumnsView(plain, path).cached("DATA.npy", header, 1 << 20)
    assert not ColumnsView(local, path).cached("WEIGHT.npy", header, 1 << 20)  # (SSM)

    stored = made("fixed", "TiledColumnStMan", multifile=True)
    shown = with_columns(directory_or_table(stored))
    view = shown.nested("columns")
    assert getattr(shown.inner, "read_into", None) is None
    with ct.table(stored, ack=False) as ref:
        for name in ref.colnames():
            assert not view.cached(f"{name}.npy", 128, 1 << 20)
            np.testing.assert_array_equal(load(view, f"{name}.npy"), ref.getcol(name))
