"""The id and coordinate columns of tiled hypercolumns, whose values casacore keeps in each
hypercube's value record: decoded and compared with python-casacore (getcol for scalars;
getcell for coordinate vectors, whose getcol in python-casacore 3.8 does not return the
records' values), in tables casacore's C++ library (TiledDataStMan: id columns, vector
and scalar coordinates, rows in no cube) and python-casacore (coordinates of every type
in TiledColumnStMan, TiledShapeStMan, TiledCellStMan) write, both byte orders, separate
files and MultiFile; shown in columns/, never written, hostile records refused."""

import errno
import io
import json
import os
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.errors import FormatError, NotPermitted
from ctdsfs.formats.casacore.aipsio import AipsWriter
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import StringColumn, open_table
from ctdsfs.formats.casacore.columns_view import ColumnsView
from ctdsfs.sources.directory import TableView

from .test_columns import made, table_source  # noqa: F401  (made: the module's table fixture)
from .tiled_data_table import write_tiled_data_table

AXIS_COLUMNS = {"uniform": ["ID", "NAME", "TIME", "FREQ"],
                "mixed": ["ID", "NAME", "TIME", "CHAN", "BASELINE"]}


def assert_as_casacore(table, path, name, start=0, stop=None):
    """Rows ``start..stop`` of ``name``: a scalar column equals getcol (dtype too), a
    vector column getcell row by row (None where casacore cannot read the row)."""
    stop = table.nrow if stop is None else stop
    got = table.read_column(name, start, stop)
    with ct.table(path, ack=False) as ref:
        if not table.columns[name].is_array:
            expected = ref.getcol(name, start, stop - start)
            if isinstance(got, StringColumn):
                assert got.tolist() == expected, name
            else:
                assert got.dtype == expected.dtype, name
                np.testing.assert_array_equal(got, expected, err_msg=name)
            return got
        for row in range(start, stop):
            cell = got[row - start] if isinstance(got, np.ndarray) else got.cell(row - start)
            try:
                expected = ref.getcell(name, row)
            except RuntimeError:
                assert cell is None, (name, row)
                continue
            assert cell is not None and cell.dtype == expected.dtype, (name, row)
            np.testing.assert_array_equal(cell, expected, err_msg=f"{name} {row}")
    return got


@pytest.mark.parametrize("variant,endian,multifile", [("uniform", "little", False),
                                                      ("uniform", "big", True),
                                                      ("mixed", "big", False),
                                                      ("mixed", "little", True)])
def test_tiled_data_manager_id_and_coordinate_columns(tmp_path, variant, endian, multifile):
    """Id columns (Int, String), a Double coordinate vector and scalar (uniform), an Int
    vector of two lengths, scalars on both row axes (mixed: rows 26-27 in no cube)."""
    path = write_tiled_data_table(tmp_path / "t.tab", variant, endian, multifile=multifile)
    with table_source(path) as source:
        table = open_table(source)
        for name in AXIS_COLUMNS[variant]:
            col = table.columns[name]
            assert col.decoded and col.in_cube_records and col.manager == "TiledDataStMan"
            if variant == "uniform":
                got = assert_as_casacore(table, path, name)
                for a, b in [(0, 1), (8, 12), (9, 31), (29, 41), (44, 45)]:
                    assert_as_casacore(table, path, name, a, b)
            else:
                got = assert_as_casacore(table, path, name, 0, 26)
                for a, b in [(3, 9), (7, 15), (13, 14), (21, 26)]:
                    assert_as_casacore(table, path, name, a, b)
                if col.is_array:  # rows in no cube: undefined cells
                    whole = assert_as_casacore(table, path, name)
                    assert whole.defined.tolist() == [True] * 26 + [False] * 2
                    assert {s for s in whole.shapes} == {(3,), (2,), None}
                else:
                    with pytest.raises(FormatError, match=f"column {name}: .*rows 26..28 "
                                       "are in no hypercube") as err:
                        table.read_column(name)
                    assert "\n" not in str(err.value)
                    with ct.table(path, ack=False) as ref, \
                            pytest.raises(RuntimeError, match="rownr is too high"):
                        ref.getcol(name)
        if variant == "uniform":  # values each cube holds, not only zeros
            assert set(table.read_column("ID").tolist()) == {0, 1, 2}
            assert "cube été1" in table.read_column("NAME").tolist()
            assert (table.read_column("FREQ")[10:30] > 1e9).all()
            assert (table.read_column("TIME")[30:40] >= 5e9).all()
        else:
            assert set(got.tolist()) == {-2, -1, 0, 1}  # BASELINE: the inner row axis


def coordinate_tables(made, manager):  # noqa: F811
    """python-casacore's tables of coordinate columns in ``manager``: little-endian,
    big-endian, and little-endian in a MultiFile."""
    return [made("coordinates", manager), made("coordinates-big", manager),
            made("coordinates", manager, multifile=True)]


@pytest.mark.parametrize("manager", ["TiledColumnStMan", "TiledShapeStMan", "TiledCellStMan"])
def test_coordinate_columns_written_by_python_casacore(made, manager):  # noqa: F811
    """Vector and scalar coordinates of Int, uInt, Float, Double, Complex and DComplex:
    as python-casacore reads them; rows without a cell shape (TiledShapeStMan: casacore's
    cube 0) undefined in a vector column, and a scalar column there refused."""
    tables = coordinate_tables(made, manager)
    for path in tables:
        with table_source(path) as source:
            table = open_table(source)
            assert table.big_endian == (path == tables[1])
            names = [n for n, c in table.columns.items() if c.in_cube_records]
            assert len(names) == (12 if manager == "TiledCellStMan" else 18)
            for name in names:
                if manager == "TiledShapeStMan" and name == "t_double":
                    with pytest.raises(FormatError, match="rows 3..4 are in no hypercube"):
                        table.read_column(name)
                    continue
                got = assert_as_casacore(table, path, name)
                if manager == "TiledShapeStMan" and name.endswith("_double"):
                    assert got.defined.tolist() == [row not in (3, 7) for row in range(11)]
                values = got.values if hasattr(got, "values") else got
                assert np.count_nonzero(values) > len(values) // 2, name  # values put
                for a, b in [(2, 5), (6, 11)]:
                    assert_as_casacore(table, path, name, a, b)


def test_records_decoded_in_batches(made, monkeypatch):  # noqa: F811
    """A read over more cubes than the records kept (TiledCellStMan: a cube per row)
    decodes them batch by batch: the same cells, with the reads running side by side
    keeping their own batches."""
    from concurrent.futures import ThreadPoolExecutor

    from ctdsfs.formats.casacore import tsm_axes as casacore_tsm_axes
    monkeypatch.setattr(casacore_tsm_axes, "MAX_RECORDS_KEPT", 2)
    path = made("coordinates", "TiledCellStMan")
    table = open_table(TableDirectory(path))
    names = ["x_dcomplex", "y_int", "x_float", "y_uint"]
    serial = {name: assert_as_casacore(table, path, name) for name in names}
    with ThreadPoolExecutor(4) as pool:
        for name, got in zip(names * 4, pool.map(table.read_column, names * 4)):
            for part in ("offsets", "values") if name.startswith("x") else (None,):
                np.testing.assert_array_equal(getattr(got, part) if part else got,
                                              getattr(serial[name], part) if part else
                                              serial[name], err_msg=name)
    assert_as_casacore(table, path, "x_int", 3, 9)


def npy(view, name):
    return np.load(io.BytesIO(view.read(name, 0, view.entry_size(name))))


def test_shown_in_the_columns_view(tmp_path):
    """ID.npy, NAME.offsets.npy and NAME.data, TIME.npy, FREQ.npy as casacore reads them;
    in the mixed table the scalar columns with rows in no cube are listed in table.json
    with the reason and no file, and CHAN shows its undefined cells."""
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "little")
    view = ColumnsView(TableDirectory(path), "u.tab/columns")
    with ct.table(path, ack=False) as ref:
        for name in ("ID", "TIME", "FREQ"):
            got = npy(view, f"{name}.npy")
            expected = ref.getcol(name) if name != "FREQ" else np.array(
                [ref.getcell(name, row) for row in range(45)])
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            np.testing.assert_array_equal(got, expected, err_msg=name)
        offsets = npy(view, "NAME.offsets.npy")
        data = view.read("NAME.data", 0, view.entry_size("NAME.data"))
        assert [bytes(data[a:b]).decode() for a, b in zip(offsets[:-1], offsets[1:])] == \
            ref.getcol("NAME")
    described = json.loads(view.read("table.json", 0, 1 << 20))["columns"]
    assert described["ID"]["files"] == ["ID.npy"] and described["ID"]["shape"] == []
    assert described["FREQ"]["files"] == ["FREQ.npy"]

    path = write_tiled_data_table(tmp_path / "m.tab", "mixed", "big")
    view = ColumnsView(TableDirectory(path), "m.tab/columns")
    names = set(view.names())
    described = json.loads(view.read("table.json", 0, 1 << 20))["columns"]
    for name in ("ID", "NAME", "TIME", "BASELINE"):
        assert not any(n.startswith(name + ".") for n in names), name
        assert described[name]["files"] == []
        assert "rows 26..28 are in no hypercube" in described[name]["error"]
    shapes = npy(view, "CHAN.shapes.npy")
    assert shapes[:, 0].tolist() == [3] * 8 + [2] * 6 + [3] * 12 + [-1] * 2
    with ct.table(path, ack=False) as ref:
        values, offsets = npy(view, "CHAN.values.npy"), npy(view, "CHAN.offsets.npy")
        for row in range(26):
            np.testing.assert_array_equal(values[offsets[row]:offsets[row + 1]],
                                          ref.getcell("CHAN", row))


def test_writes_into_them_refused_with_eperm(mount, tmp_path):
    """``-o rw,columns`` on a MultiFile table: a write into ID.npy, TIME.npy, FREQ.npy or
    NAME.data is EPERM in the write call (before: no such files), and nothing changes;
    the view refuses them by name."""
    (tmp_path / "tree").mkdir()
    path = Path(write_tiled_data_table(tmp_path / "tree" / "u.tab", "uniform", "big",
                                       multifile=True))
    originals = {p: p.read_bytes() for p in path.iterdir()}
    m = mount(tmp_path / "tree", ["rw", "columns"])
    columns = m.mountpoint / "u.tab" / "columns"
    for name in ("ID.npy", "TIME.npy", "FREQ.npy", "NAME.data"):
        size = (columns / name).stat().st_size
        fd = os.open(columns / name, os.O_RDWR)
        try:
            with pytest.raises(OSError) as caught:
                os.pwrite(fd, b"\1\2\3\4\5\6\7\x08", size - 8)
            assert caught.value.errno == errno.EPERM, name
        finally:
            os.close(fd)
    with ct.table(str(path), ack=False) as ref:
        np.testing.assert_array_equal(np.load(columns / "TIME.npy"), ref.getcol("TIME"))
    m.close()
    assert {p: p.read_bytes() for p in path.iterdir()} == originals
    source = TableView(str(path), writable=True)
    try:
        view = ColumnsView(source, "u.tab/columns")
        with pytest.raises(NotPermitted, match="id and coordinate columns"):
            view.write("ID.npy", view.entry_size("ID.npy") - 4, b"\0\0\0\7")
    finally:
        source.close()


# ---------------------------------------------------------------- hostile records

def record_bytes(fields):
    """A casacore ``Record`` AipsIO object: ``fields`` is [(name, type, write_value)],
    each ``write_value(w)`` writing the field's description extra and value as a pair
    ``(describe, value)`` of callables."""
    w = AipsWriter()
    w.start("Record", 1)
    w.start("RecordDesc", 2)
    w.i32(len(fields))
    for name, code, describe, _ in fields:
        w.string(name)
        w.i32(code)
        describe(w)
        w.string("")
    w.end()
    w.i32(0)
    for *_, value in fields:
        value(w)
    w.end()
    return bytes(w.getvalue())


def nested_desc(w, depth):
    """A field X of records nested ``depth`` deep, an Int at the bottom."""
    w.start("RecordDesc", 2)
    w.i32(1)
    w.string("X")
    w.i32(25 if depth else 5)
    if depth:
        nested_desc(w, depth - 1)
    w.string("")
    w.end()


def spliced(path, cube, record):
    """The TiledDataStMan header of ``path`` with cube ``cube``'s value record replaced by
    ``record`` (the manager's and its TiledStMan part's object lengths adjusted)."""
    name = Path(path, "table.f0")
    header = name.read_bytes()
    start, end = open_table(TableDirectory(path))._reader(0).cubes[cube].record_span
    new = bytearray(header[:start] + record + header[end:])
    delta = len(record) - (end - start)
    base = new.index(b"\x00\x00\x00\x0aTiledStMan") - 4
    for at in (4, base):  # (the outer object's length follows the magic)
        new[at:at + 4] = (int.from_bytes(new[at:at + 4], "big") + delta).to_bytes(4, "big")
    name.write_bytes(bytes(new))


def int_field(name, value):
    return (name, 5, lambda w: None, lambda w: w.i32(value))


def string_field(name, value):
    return (name, 11, lambda w: None, lambda w: w.string(value))


HOSTILE_RECORDS = {
    "huge": ([int_field("ID", 0), string_field("NAME", "x" * (9 << 20))], "too large"),
    "deep": ([int_field("ID", 0), ("NAME", 25, lambda w: nested_desc(w, 100),
                                  lambda w: w.i32(1))], "nested more than"),
    "count": ([int_field("ID", 0), string_field("NAME", "cube 0"),
               ("TIME", 21, lambda w: (w.start("IPosition", 1), w.u32(0), w.end()),
                lambda w: (w.start("Array<double>", 1), w.u32(1), w.u32(20),
                           w.u32(0x7FFFFFF0), w.f64(1.0), w.end()))], "count"),
    "type": ([string_field("ID", "0"), string_field("NAME", "cube 0")],
             "ID in hypercube 0's record is String, the column Int"),
    "missing": ([int_field("ID", 0)], "has no field NAME"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RECORDS))
def test_hostile_value_records(tmp_path, case):
    """A cube's record replaced by one of 9 MiB, one nested 100 deep, an array's element
    count past the record, a field of another type, a field missing: reading the id or
    coordinate columns of its rows is a one-line FormatError; the data columns and the
    other cubes' rows still read."""
    path = write_tiled_data_table(tmp_path / "u.tab", "uniform", "little")
    with ct.table(path, ack=False) as ref:
        data = ref.getcol("DATA")
    fields, message = HOSTILE_RECORDS[case]
    spliced(path, 0, record_bytes(fields))
    table = open_table(TableDirectory(path))
    name = {"huge": "ID", "deep": "ID", "count": "TIME", "type": "ID", "missing": "NAME"}[case]
    with pytest.raises(FormatError, match=message) as err:
        table.read_column(name)
    assert "\n" not in str(err.value) and f"column {name}" in str(err.value)
    np.testing.assert_array_equal(table.read_column("DATA"), data)
    np.testing.assert_array_equal(table.read_column("ID", 10, 30), [1] * 20)
