"""TiledDataStMan columns (tables casacore's C++ library writes: several hypercubes, a
cube extended after another, cubes with two row axes) decoded and compared with
python-casacore's getcol/getcell, in both byte orders, separate files and MultiFile."""

import io
import os
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.sources.columns import with_columns
from ctdsfs.sources.directory import directory_or_table
from ctdsfs.vfs import ROOT_INO, ContainerFS

from .test_columns import table_source
from .tiled_data_table import write_tiled_data_table


def assert_cells_as_casacore(table, path, name, start=0, stop=None):
    """Rows ``start..stop`` of ``name`` equal getcell's, row by row (python-casacore's
    getvarcol fails on a TiledDataStMan column of several cell shapes)."""
    stop = table.nrow if stop is None else stop
    got = table.read_column(name, start, stop)
    with ct.table(path, ack=False) as ref:
        for row in range(start, stop):
            cell = got[row - start] if isinstance(got, np.ndarray) else got.cell(row - start)
            if row >= table._reader(table.columns[name].seqnr).rows_held:
                assert cell is None  # in no cube: casacore refuses to read it
                with pytest.raises(RuntimeError, match="rownr is too high"):
                    ref.getcell(name, row)
                continue
            expected = ref.getcell(name, row)
            assert cell.dtype == expected.dtype, (name, row)
            np.testing.assert_array_equal(cell, expected, err_msg=f"{name} {row}")
    return got


@pytest.mark.parametrize("endian", ["little", "big"])
def test_several_hypercubes_equal_getcol(tmp_path, endian):
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", endian)
    table = open_table(TableDirectory(path))
    assert table.big_endian == (endian == "big")
    reader = table._reader(table.columns["DATA"].seqnr)
    assert reader.kind == "TiledDataStMan" and len(reader.cubes) == 3
    assert reader.row_map.tolist() == [0, 10, 30, 40]  # cube 0 extended after cube 1
    assert reader.cube_map.tolist() == [0, 1, 0, 2]
    assert sorted(reader.files.values()) == ["table.f0_TSM0", "table.f0_TSM1"]
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "FLAG"):
            got = table.read_column(name)
            expected = ref.getcol(name)
            assert got.dtype == expected.dtype and got.shape == (45, 6, 4)
            np.testing.assert_array_equal(got, expected, err_msg=name)
            for a, b in [(0, 1), (8, 12), (9, 31), (29, 41), (35, 45), (44, 45)]:
                np.testing.assert_array_equal(table.read_column(name, a, b),
                                              ref.getcol(name, a, b - a), err_msg=f"{name} {a}")
    assert table.describe()["columns"]["ID"]["data_manager"] == "TiledDataStMan"
    with ct.table(path, ack=False) as ref:  # (its values are in the cubes' records)
        np.testing.assert_array_equal(table.read_column("ID"), ref.getcol("ID"))


@pytest.mark.parametrize("endian", ["little", "big"])
def test_cubes_with_two_row_axes_and_two_cell_shapes(tmp_path, endian):
    path = write_tiled_data_table(tmp_path / "m.tab", "mixed", endian)
    table = open_table(TableDirectory(path))
    reader = table._reader(table.columns["DATA"].seqnr)
    assert [c.ndim for c in reader.cubes] == [4, 4] and reader.cell_ndim == 2
    for name in ("DATA", "FLAG"):
        got = assert_cells_as_casacore(table, path, name)
        assert not isinstance(got, np.ndarray) and set(got.shapes) == {(3, 2), (2, 3), None}
        assert got.defined.tolist() == [True] * 26 + [False] * 2
        for a, b in [(1, 7), (3, 9), (7, 15), (13, 14), (15, 26), (25, 28)]:
            assert_cells_as_casacore(table, path, name, a, b)
    assert table.uniform_shape("DATA") == (True, None)
    # the write map of the same rows: each value's byte (a Bool's bit) in the tile files
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "FLAG"):
            row = 5
            for file, places in table.cell_places(name, 5, 17):
                data = np.frombuffer(Path(path, file).read_bytes(), np.uint8)
                if name == "FLAG":
                    got = (data[places // 8] >> (places % 8)) & 1 == 1
                else:
                    at = places[..., None] + np.arange(4)
                    got = data[at].copy().view(">f4" if endian == "big" else "<f4")[..., 0]
                for cell in got:
                    np.testing.assert_array_equal(cell, ref.getcell(name, row))
                    row += 1
            assert row == 17


def test_multifile_written_by_casacore(tmp_path):
    """casacore's C++ library writes the tables in MultiFiles (big- and little-endian)."""
    for variant, endian in [("uniform", "big"), ("mixed", "little")]:
        path = write_tiled_data_table(tmp_path / f"{variant}.mf", variant, endian,
                                      multifile=True)
        assert sorted(os.listdir(path)) == ["table.dat", "table.info", "table.lock",
                                            "table.mf"]
        with table_source(path) as source:
            table = open_table(source)
            for name in ("DATA", "FLAG"):
                got = assert_cells_as_casacore(table, path, name)
                assert isinstance(got, np.ndarray) == (variant == "uniform")


def test_columns_directory_shows_data_columns_npy(tmp_path):
    """``columns/`` of the table: DATA.npy, FLAG.npy and the id column's ID.npy equal
    getcol."""
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "little")
    fs = ContainerFS(with_columns(directory_or_table(path, source=True)), path)
    columns = fs.lookup(ROOT_INO, "columns").ino
    names = {name for name, _, _ in fs.readdir(fs.opendir(columns))}
    assert {"DATA.npy", "FLAG.npy", "ID.npy"} <= names
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "FLAG", "ID"):
            fh = fs.open(fs.lookup(columns, f"{name}.npy").ino, os.O_RDONLY)
            try:
                got = np.load(io.BytesIO(fs.read(fh, 0, 1 << 20)))
            finally:
                fs.release(fh)
            np.testing.assert_array_equal(got, ref.getcol(name))


def _block_at(header, k):
    """The first value of the ``k``-th Block (0: row map, 1: cube map, 2: position map)
    after the hypercubes: the header's last three Blocks."""
    at = len(header)
    for _ in range(3 - k):
        at = header.rindex(b"Block", 0, at)
    return at + 5 + 4 + 4  # type name, version, count


@pytest.mark.parametrize("k,value,message", [(0, 5, "inconsistent"),
                                             (0, 1 << 40, "inconsistent"),
                                             (1, 7, "inconsistent"),
                                             (2, 1 << 20, "positions")])
def test_hostile_row_maps(tmp_path, k, value, message):
    """A stretch's first row, cube or position changed: a one-line FormatError."""
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "little")
    header = bytearray((tmp_path / "u.tab" / "table.f0").read_bytes())
    at = _block_at(header, k)
    width = 8 if k == 0 else 4
    assert int.from_bytes(header[at:at + width], "big") == [0, 0, 0][k]
    header[at:at + width] = value.to_bytes(width, "big")
    (tmp_path / "u.tab" / "table.f0").write_bytes(bytes(header))
    with pytest.raises(FormatError, match=message) as err:
        open_table(TableDirectory(path)).read_column("DATA")
    assert "\n" not in str(err.value) and "column DATA" in str(err.value)


def test_fixed_shape_cells_written_through_the_view(tmp_path):
    """Writes into DATA.npy and FLAG.npy of a MultiFile table (runs across the stretches
    of different cubes, Bool bits mid-byte) land where casacore reads them:
    python-casacore gives the new values."""
    from ctdsfs.formats.casacore.columns_view import ColumnsView
    from ctdsfs.sources.directory import TableView

    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "big", multifile=True)
    with ct.table(path, ack=False) as ref:
        expected = {name: ref.getcol(name) for name in ("DATA", "FLAG")}
    source = TableView(path, writable=True)
    view = ColumnsView(source, "u.tab/columns")
    for name, first, count in [("DATA", 9 * 24 + 5, 24 * 22), ("FLAG", 29 * 24 + 3, 40)]:
        flat = expected[name].reshape(-1)
        new = (~flat[first:first + count] if name == "FLAG" else
               (np.arange(count) * (1 - 2j)).astype(flat.dtype))
        flat[first:first + count] = new
        raw = view.read(f"{name}.npy", 0, 4096)
        head = 10 + int.from_bytes(bytes(raw[8:10]), "little")
        assert view.write(f"{name}.npy", head + first * flat.itemsize, new.tobytes()) == \
            new.nbytes
    source.commit()
    source.close()
    with ct.table(path, ack=False) as ref:
        for name, values in expected.items():
            np.testing.assert_array_equal(ref.getcol(name), values, err_msg=name)


def test_hostile_manager_type_name(tmp_path):
    """The header's type name read long (its length field grown over the fields after
    it, newlines among them): still a one-line refusal."""
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "little")
    header = bytearray((tmp_path / "u.tab" / "table.f0").read_bytes())
    at = header.index(b"TiledDataStMan") - 4
    assert int.from_bytes(header[at:at + 4], "big") == len("TiledDataStMan")
    header[at:at + 4] = (300).to_bytes(4, "big")
    (tmp_path / "u.tab" / "table.f0").write_bytes(bytes(header))
    with pytest.raises(FormatError) as err:
        open_table(TableDirectory(path)).read_column("DATA")
    assert "\n" not in str(err.value)
