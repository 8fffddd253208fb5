"""Hostile numbers in tables that casacore 3.8's alternate managers and Dysco hold, one
family at a time on tables python-casacore 3.8 wrote: cell shapes in table.dat that the
manager's file cannot hold, row counts no process can hold, and the row files' 64-bit
header fields past int64. Each read gives values or a one-line FormatError, before any
allocation at the size claimed (within 4 GiB more address space, so that a huge one
fails rather than swaps); columns/ answers EIO for the damaged column only, over the VFS and a
mount."""

import errno
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats.casacore import tabledat
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.vfs.filesystem import FSError

from ...address_space import address_space
from .dysco_ms import spec
from .test_columns_altmans import write
from .test_columns_dysco import write_ms
from .test_columns_hostile import _everything_through_the_vfs, columns_fs, listing

RANGES = ((0, None), (0, 1), (5, 9))


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    where = tmp_path_factory.mktemp("hostile-altmans")
    return {"stokes": write(where / "stokes.ms", "stokes", False),
            "sisco": write(where / "sisco.ms", "sisco-random", False),
            "dysco": write_ms(where / "dysco.ms", {"managers": [{
                "name": "D", "columns": ["DATA", "WEIGHT_SPECTRUM"],
                "spec": spec(10, 6, "TruncatedGaussian", "AF")}], "times": 4})}


def damaged(source, tmp_path, change_dat=None, file=None, edits=()):
    """A copy of table ``source`` with its table.dat changed by ``change_dat`` and
    ``edits`` (offset, struct format, value) packed into its file ``file``."""
    path = tmp_path / "t.ms"
    shutil.copytree(source, path)
    if change_dat is not None:
        dat = tabledat.decode(Path(path, "table.dat").read_bytes())
        change_dat(dat)
        Path(path, "table.dat").write_bytes(dat.encode())
        Path(path, "table.lock").unlink()  # (its row count would be taken first)
    if edits:
        data = bytearray(Path(path, file).read_bytes())
        for at, fmt, value in edits:
            struct.pack_into(fmt, data, at, value)
        Path(path, file).write_bytes(bytes(data))
    return str(path)


def cell_shape(name, shape):
    """table.dat's change: column ``name``'s fixed shape (Python order) ``shape``."""
    def change(dat):
        index = [c.name for c in dat.desc.columns].index(name)
        for place in (dat.desc.columns[index].shape, dat.column_set.columns[index].fixed_shape):
            place.version = 2  # (64-bit axes)
            place.values = list(shape[::-1])
    return change


def rows(count):
    def change(dat):
        dat.version, dat.nrow = 3, count
        dat.column_set.version, dat.column_set.nrow = 3, count
    return change


def refused_in_one_line(table, name, start=0, stop=None):
    with pytest.raises(FormatError) as caught:
        table.read_column(name, start, stop)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize("column", ["L2", "L1m", "DATA_I"])
@pytest.mark.parametrize("shape", [(2**31 - 1, 4), (2**31 - 1, 2**31 - 1), (4, -1),
                                   (2**40, 4), (6, 2**31 - 1), (-1, -1)])
def test_a_sisco_cell_shape_its_file_cannot_hold(tables, tmp_path, column, shape):
    """Before, SiscoStMan made its output at table.dat's shape before reading a byte (64 GiB
    a row: MemoryError; a negative axis: ValueError)."""
    path = damaged(tables["sisco"], tmp_path, cell_shape(column, shape))
    table = open_table(TableDirectory(path), path)
    with address_space():
        for start, stop in RANGES:
            refused_in_one_line(table, column, start, stop)
        assert _everything_through_the_vfs(path) >= 1
    assert len(table.read_column("L1")) == table.nrow  # (another manager of the table)


READ_COLUMNS = {"stokes": ["DATA", "FLAG", "WEIGHT_SPECTRUM", "ANTENNA1", "UVW"],
                "sisco": ["L2", "DATA_I"], "dysco": ["DATA", "WEIGHT_SPECTRUM"]}


@pytest.mark.parametrize("count", [2**40, 2**60, 2**63 - 1])
@pytest.mark.parametrize("kind", sorted(READ_COLUMNS))
def test_a_row_count_no_process_can_hold(tables, tmp_path, kind, count):
    """StokesIStMan and Dysco read rows past their files as zeros and AntennaPairStMan
    repeats its pattern, so nothing but memory bounds a row count from table.dat: a read
    of the whole column is refused before it is made (before: MemoryError or ValueError);
    the first rows read as before."""
    intact = open_table(TableDirectory(tables[kind]), tables[kind])
    path = damaged(tables[kind], tmp_path, rows(count))
    table = open_table(TableDirectory(path), path)
    assert table.nrow == count
    with address_space():
        for name in READ_COLUMNS[kind]:
            assert "more than this process can hold" in refused_in_one_line(table, name)
            # (Sisco and Dysco's AF normalisation read ids from StandardStMan columns,
            # which refuse a row count past their index)
            if kind == "stokes" or (kind, name) == ("dysco", "WEIGHT_SPECTRUM"):
                np.testing.assert_array_equal(table.read_column(name, 0, 5),
                                              intact.read_column(name, 0, 5))
            else:
                refused_in_one_line(table, name, 0, 5)


# the 64-bit fields of each row-based file's header: the private header's stride and
# manager header size, then each manager's own
ROW_FILE_FIELDS = {"AntennaPairStMan": ["stride", "header", 36],
                   "UvwStMan": ["stride", "header", 36, 44, 52],
                   "StokesIStMan": ["stride", "header"]}
PLACES = {"stride": 12, "header": 20}


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 2**62 + 1])
@pytest.mark.parametrize("manager,field", [(m, f) for m, fields in ROW_FILE_FIELDS.items()
                                           for f in fields])
def test_row_file_header_fields_past_int64(tables, tmp_path, manager, field, value):
    """Before, UvwStMan's rows a time step (offset 36) past 2**63 overflowed its int64
    arithmetic (OverflowError)."""
    source = tables["stokes"]
    table = open_table(TableDirectory(source), source)
    seqnr = next(c.seqnr for c in table.columns.values() if c.manager == manager)
    names = [c.name for c in table.columns.values() if c.seqnr == seqnr] + ["UVW"]
    path = damaged(source, tmp_path, file=f"table.f{seqnr}",
                   edits=[(PLACES.get(field, field), "<Q", value)])
    table = open_table(TableDirectory(path), path)
    with address_space():
        for name in names:
            for start, stop in RANGES:
                try:
                    table.read_column(name, start, stop)
                except FormatError as exc:
                    assert "\n" not in str(exc)
        _everything_through_the_vfs(path)


def test_a_sisco_cell_shape_through_a_mount(tables, tmp_path, mount):
    """The damaged column's reads fail with EIO, the table's other columns read; the
    daemon logs no traceback."""
    path = damaged(tables["sisco"], tmp_path, cell_shape("L2", (2**31 - 1, 4)))
    m = mount(path, ["columns"])
    with open(m.mountpoint / "columns" / "L2.npy", "rb") as f, \
            pytest.raises(OSError) as caught:
        f.read(1 << 20)
    assert caught.value.errno == errno.EIO
    assert len(np.load(m.mountpoint / "columns" / "L1.npy")) == 30
    assert "L2" in m.log_text() and "Traceback" not in m.log_text()


SHAPES_NOT_SHOWN = [((-1, 4), "gives its cells the shape"),
                    ((6, -4), "gives its cells the shape"),
                    ((-1, -1), "gives its cells the shape"),
                    ((2**40, 2**40), "pass the largest file size"),
                    ((4, 2**62), "pass the largest file size"),
                    ((2**31 - 1,) * 3, "pass the largest file size")]


@pytest.mark.parametrize("shape,message", SHAPES_NOT_SHOWN)
@pytest.mark.parametrize("kind,column", [("stokes", "DATA"), ("stokes", "FLAG"),
                                         ("sisco", "L2"), ("dysco", "DATA"),
                                         ("dysco", "WEIGHT_SPECTRUM"), ("stokes", "UVW"),
                                         ("dysco", "UVW")])
def test_a_cell_shape_no_file_can_show(tables, tmp_path, kind, column, shape, message):
    """A fixed shape in table.dat with a negative axis, or whose rows pass the largest
    file size: the column is left out of columns/, its reason in table.json; reads
    refused in one line. Before: a NAME.npy of a negative size, of a shape no array has,
    of its header alone (the axes' product wrapped in int64), or past 2**63 bytes."""
    if column == "UVW":  # (a vector column: one axis)
        shape = (min(shape),) if min(shape) < 0 else (2**62,)
    path = damaged(tables[kind], tmp_path, cell_shape(column, shape))
    fs, columns = columns_fs(path)
    sizes = listing(fs, columns)
    assert f"{column}.npy" not in sizes and all(0 <= size < 1 << 63 for size in sizes.values())
    fh = fs.open(fs.lookup(columns, "table.json").ino, os.O_RDONLY)
    described = json.loads(fs.read(fh, 0, sizes["table.json"]))
    assert message in described["columns"][column]["error"]
    with pytest.raises(FSError):  # (not made by name either)
        fs.lookup(columns, f"{column}.npy")
    table = open_table(TableDirectory(path), path)
    with address_space():
        for start, stop in RANGES:
            refused_in_one_line(table, column, start, stop)
