"""casacore columns decoded without casacore, compared with python-casacore's getcol/getvarcol
on tables it writes here: every type in every decoded storage manager, both byte orders,
MultiFile storage, a MeasurementSet, and hostile table files."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats import open_container
from ctdsfs.formats.casacore.base import LayeredSource, TableDirectory
from ctdsfs.formats.casacore.columns import NotDecoded, StringColumn, open_table

from ...address_space import address_space
from .tiled_data_table import write_tiled_data_table

HERE = Path(__file__).parent
MANAGERS = ["StandardStMan", "IncrementalStMan", "StManAipsIO", "TiledColumnStMan",
            "TiledShapeStMan", "TiledCellStMan"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``made(what, manager, multifile=False)``: a copy (in a fresh directory) of a table
    python-casacore wrote once for the whole module."""
    import shutil
    written = {}

    def copy(what, manager, multifile=False):
        key = (what, manager, multifile)
        if key not in written:
            where = tmp_path_factory.mktemp("written") / "t"
            written[key] = write_table(where, what, manager, multifile)
        target = tmp_path_factory.mktemp("copy") / Path(written[key]).name
        shutil.copytree(written[key], target)
        return str(target)
    return copy


@contextlib.contextmanager
def table_source(path):
    """The files of a table stored in separate files, or in MultiFile (``table.dat`` beside
    ``table.mf``), as the decoders read them."""
    multifile = os.path.join(path, "table.mf")
    if not os.path.exists(multifile):
        yield TableDirectory(path)
        return
    container = open_container(multifile)
    try:
        yield LayeredSource(TableDirectory(path), container)
    finally:
        container.close()


def write_table(path, what, manager, multifile=False):
    """python-casacore writes the table in a subprocess (its own HOME and .casarc); a
    TiledDataStMan table ("uniform" or "mixed") casacore's C++ library writes."""
    if manager == "TiledDataStMan":
        return write_tiled_data_table(path, what, multifile=multifile)
    home = Path(path).parent / f".home-{Path(path).name}"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "")
    subprocess.run([sys.executable, str(HERE / "casacore_column_tables.py"), what, str(path),
                    manager], check=True, env=dict(os.environ, HOME=str(home)))
    return str(path)


def assert_same_as_casacore(path, source=None, label=None):
    """Every column decoded equals getcol (getvarcol for var-shape and string arrays)."""
    table = open_table(source or TableDirectory(path))
    ref = ct.table(str(path), ack=False)
    try:
        assert table.nrow == ref.nrows()
        checked = 0
        for name, col in table.columns.items():
            assert col.decoded, (name, col.manager)
            got = table.read_column(name)
            if isinstance(got, StringColumn):
                assert got.tolist() == ref.getcol(name), name
            elif isinstance(got, np.ndarray):
                expected = ref.getcol(name)
                assert got.dtype == expected.dtype, name
                if table.nrow == 0:  # getcol gives (0,) for an empty array column
                    assert got.size == expected.size == 0
                    continue
                np.testing.assert_array_equal(got, expected, err_msg=name)
            else:
                cells = ref.getvarcol(name)
                for row in range(table.nrow):
                    expect = cells[f"r{row + 1}"]
                    cell = got.cell(row)
                    if not ref.iscelldefined(name, row):  # getvarcol gives False
                        assert cell is None, (name, row)
                    elif isinstance(expect, dict):  # strings: {'shape', 'array'}
                        assert cell is not None, (name, row)
                        assert list(cell.shape) == expect["shape"][1:], (name, row)
                        assert cell.ravel().tolist() == expect["array"], (name, row)
                    else:
                        np.testing.assert_array_equal(cell, expect[0], err_msg=f"{name} {row}")
                        assert cell.dtype == expect.dtype, (name, row)
            checked += 1
        return table, checked
    finally:
        ref.close()


@pytest.mark.parametrize("manager", MANAGERS)
def test_every_type_fixed_shape(made, manager):
    path = made("fixed", manager)
    table, checked = assert_same_as_casacore(path)
    assert checked == len(table.columns) >= 10
    assert table.keywords["TELESCOPE"] == "ÅLMA"
    assert table.columns["a_double"].keywords["QuantumUnits"]["values"] == ["m", "m"]


VAR_MANAGERS = [m for m in MANAGERS if m != "TiledColumnStMan"]  # it needs fixed shapes


@pytest.mark.parametrize("manager", VAR_MANAGERS)
def test_variable_shapes_and_undefined_cells(made, manager):
    path = made("var", manager)
    table, checked = assert_same_as_casacore(path)
    assert checked == len(table.columns)
    some = table.read_column("v_int")
    if manager not in ("TiledCellStMan", "IncrementalStMan"):  # ISM: a value holds on
        assert not some.defined[3] and some.defined[:3].all()


def test_several_hypercubes_and_row_ranges(made):
    path = made("var", "TiledShapeStMan")
    table = open_table(TableDirectory(path))
    reader = table._reader(table.columns["v_float"].seqnr)
    assert len(reader.cubes) > 3  # one per cell shape, plus casacore's empty cube 0
    ref = ct.table(path, ack=False)
    for a, b in [(0, 3), (4, 5), (6, 13), (20, 37)]:
        got = table.read_column("v_float", a, b)
        cells = ref.getvarcol("v_float", a, b - a)
        for row in range(a, b):
            expect = cells[f"r{row + 1}"]
            cell = got.cell(row - a) if not isinstance(got, np.ndarray) else got[row - a]
            if not ref.iscelldefined("v_float", row):
                assert cell is None
            else:
                np.testing.assert_array_equal(cell, expect[0])
    ref.close()


def test_big_endian_copy(made, tmp_path):
    for manager in MANAGERS:
        for what in ("fixed", "var") if manager in VAR_MANAGERS else ("fixed",):
            path = made(what, manager)
            with ct.table(path, ack=False) as t:
                t.copy(str(tmp_path / f"{manager}-{what}-be"), deep=True, valuecopy=True,
                       endian="big")
            table, _ = assert_same_as_casacore(str(tmp_path / f"{manager}-{what}-be"))
            assert table.big_endian


def test_multifile_storage_read_through_ctdsfs_multifile(tmp_path):
    for manager, what in [("StandardStMan", "fixed"), ("TiledShapeStMan", "var")]:
        path = write_table(tmp_path / f"{manager}.mf", what, manager, multifile=True)
        assert sorted(os.listdir(path)) == ["table.dat", "table.info", "table.lock", "table.mf"]
        with table_source(path) as source:
            table, checked = assert_same_as_casacore(path, source)
            assert checked == len(table.columns)


def test_measurement_set_and_subtables(tmp_path):
    path = write_table(tmp_path / "obs.ms", "ms", "40")
    _, checked = assert_same_as_casacore(path)
    assert checked > 20
    for sub in sorted(os.listdir(path)):
        if os.path.exists(os.path.join(path, sub, "table.dat")):
            assert_same_as_casacore(os.path.join(path, sub))
    ms = open_table(TableDirectory(path))
    assert ms.columns["DATA"].manager == "TiledShapeStMan"
    assert ms.columns["FLAG"].cell_shape is None  # var-shape, yet every cell one shape
    flags = ms.read_column("FLAG", 7, 23)
    with ct.table(path, ack=False) as ref:
        np.testing.assert_array_equal(flags, ref.getcol("FLAG", 7, 16))
        assert "UVW" in ms.describe()["columns"]
        assert ms.columns["UVW"].keywords["QuantumUnits"]["values"] == ["m", "m", "m"]


def test_column_of_a_manager_not_decoded_is_listed_not_read(made):
    """A column bound to a manager not decoded (here table.dat names Adios2StMan) is listed
    with its manager, and reading it is refused, not guessed."""
    from ctdsfs.formats.casacore import tabledat
    path = made("fixed", "IncrementalStMan")
    dat = tabledat.decode(Path(path, "table.dat").read_bytes())
    dat.column_set.data_managers[0] = ("Adios2StMan", dat.column_set.data_managers[0][1])
    Path(path, "table.dat").write_bytes(dat.encode())
    table = open_table(TableDirectory(path))
    info = table.describe()["columns"]["s_int"]
    assert info["data_manager"] == "Adios2StMan" and not info["decoded"]
    with pytest.raises(NotDecoded, match="Adios2StMan"):
        table.read_column("s_int")


def _read_everything(path):
    table = open_table(TableDirectory(path))
    for name, col in table.columns.items():
        if col.decoded:
            stop = None
            if col.in_cube_records and col.manager == "TiledDataStMan":  # (an id column:
                stop = table._reader(col.seqnr).rows_held  # none in rows past the cubes)
            table.read_column(name, 0, stop)


def mutated(path, files, rng, counts, values):
    """Overwrite ``values`` at spots of each file in turn (``counts``: how many among the
    first KiB, where headers and indexes are, and how many anywhere), yielding after each
    change and restoring the file after; within 4 GiB more address space, so a huge
    allocation fails instead of swapping."""
    with address_space():
        for name in files:
            original = Path(path, name).read_bytes()
            size = len(original)
            spots = sorted(set(rng.integers(0, min(size, 1024), counts[0]).tolist()) |
                           set(rng.integers(0, size, counts[1]).tolist()))
            try:
                for at in spots:
                    for value in values:
                        data = bytearray(original)
                        data[at:at + len(value)] = value[:size - at]
                        Path(path, name).write_bytes(bytes(data))
                        yield name, at
            finally:
                Path(path, name).write_bytes(original)


@pytest.mark.parametrize("manager,what", [("StandardStMan", "fixed"),
                                          ("IncrementalStMan", "fixed"),
                                          ("StManAipsIO", "var"),
                                          ("TiledShapeStMan", "var"),
                                          ("TiledCellStMan", "var"),
                                          ("TiledDataStMan", "mixed")])
def test_hostile_storage_manager_files(made, manager, what):
    """Bytes of the storage-manager files overwritten (header fields, index entries,
    bucket numbers, tile counts, string lengths): each read gives the right values or a
    one-line FormatError, never another exception."""
    path = made(what, manager)
    files = [f for f in sorted(os.listdir(path)) if f.startswith("table.f") and
             "_TSM" not in f][:2]  # headers, indexes, buckets (tile data is only values)
    refused = 0
    for _ in mutated(path, files, np.random.default_rng(7), (9, 4),
                     (b"\xff\xff\xff\x7f", b"\x00\x00\x00\x00", b"\x80")):
        try:
            _read_everything(path)
        except FormatError as exc:
            assert "\n" not in str(exc)
            refused += 1
    assert refused > 0  # some mutations hit a checked field
    _read_everything(path)


def test_hostile_hypercube_shape_refused(made):
    """A hypercube shape grown past what its _TSM file holds is refused up front."""
    path = made("fixed", "TiledColumnStMan")
    header = bytearray(Path(path, "table.f0").read_bytes())
    grown = 0
    at = header.find(b"IPosition")
    while at >= 0:  # each IPosition: type name, version, rank, values (Int or Int64)
        version, rank = (int.from_bytes(header[at + k:at + k + 4], "big") for k in (9, 13))
        width = 4 if version == 1 else 8
        values = [int.from_bytes(header[at + 17 + width * k:at + 17 + width * (k + 1)], "big")
                  for k in range(rank)]
        if rank == 3 and values[-1] == 37:  # the cube shape (rows last): widen axis 0
            header[at + 17:at + 17 + width] = (1 << 20).to_bytes(width, "big")
            grown += 1
        at = header.find(b"IPosition", at + 1)
    assert grown == 1
    Path(path, "table.f0").write_bytes(bytes(header))
    with pytest.raises(FormatError, match="needs .* bytes"):
        _read_everything(path)


class CountingSource(TableDirectory):
    """Records the bytes read from each file."""

    def __init__(self, path):
        super().__init__(path)
        self.bytes_read = {}

    def read(self, name, offset, size):
        data = super().read(name, offset, size)
        self.bytes_read[name] = self.bytes_read.get(name, 0) + len(data)
        return data

    def read_into(self, name, offset, buffer):
        count = super().read_into(name, offset, buffer)
        self.bytes_read[name] = self.bytes_read.get(name, 0) + count
        return count


def test_row_ranges_read_only_their_rows_bytes(made):
    """Rows 1234..1240: of a tiled column only those rows' bytes in each tile are read (a
    tile's last axis is the row: its rows lie together), not whole tiles; of the other
    managers at most two buckets. Row ranges across and inside tiles equal getcol."""
    path = made("ms", "2000")
    table = open_table(TableDirectory(path))
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "FLAG", "UVW", "TIME", "ANTENNA1"):
            source = CountingSource(path)
            ranged = open_table(source)
            col = table.columns[name]
            reader = ranged._reader(col.seqnr)  # headers and indexes read on opening
            opened = dict(source.bytes_read)
            got = ranged.read_column(name, 1234, 1240)
            np.testing.assert_array_equal(got, ref.getcol(name, 1234, 6))
            moved = sum(source.bytes_read.values()) - sum(opened.values())
            whole = table.read_column(name).nbytes
            if col.manager.startswith("Tiled"):
                cube = reader.cubes[-1]
                across = cube.n_tiles // cube.grid[-1]
                on_disk = got.size // 8 if got.dtype == bool else got.nbytes
                assert on_disk <= moved <= on_disk + across, name  # a byte per tile of Bools
            else:
                assert moved <= 2 * reader.bucket_size < whole, name
            for a, b in [(0, 1), (63, 65), (100, 357), (1000, 1256), (1999, 2000)]:
                np.testing.assert_array_equal(ranged.read_column(name, a, b),
                                              ref.getcol(name, a, b - a), err_msg=name)
    # Bool, Complex and Short in the same tiles, two tiles across a row, a row's Bools off
    # byte boundaries (tiles this small are read across their gaps)
    shared = made("shared", "TiledColumnStMan")
    table = open_table(TableDirectory(shared))
    with ct.table(shared, ack=False) as ref:
        for name in ("a_bool", "a_complex", "a_short"):
            for a, b in [(0, 37), (3, 4), (6, 8), (5, 30), (7, 14), (36, 37)]:
                np.testing.assert_array_equal(table.read_column(name, a, b),
                                              ref.getcol(name, a, b - a), err_msg=f"{name} {a}")


def _patch(path, name, at, value):
    data = bytearray(Path(path, name).read_bytes())
    data[at:at + len(value)] = value
    Path(path, name).write_bytes(bytes(data))


def long_string_reference(path):
    """Where in ``table.f0`` SSM keeps the 12-byte reference (heap bucket, offset, length)
    of the first ``s_string`` value too long to stand in the reference itself."""
    table = open_table(TableDirectory(path))
    ssm = table._reader(0)
    offset, group = ssm.place["s_string"]
    bucket = int(ssm.indexes[group].bucket[0])
    row = next(i for i, s in enumerate(table.read_column("s_string").tolist())
               if len(s.encode()) > 8)
    return 512 + bucket * ssm.bucket_size + offset + 12 * row


@pytest.mark.parametrize("value", [0x7FFFFFFF, 0xFFFFFFF0])
def test_hostile_ssm_string_reference_and_bucket_index(made, value):
    """A string's heap bucket or length, or a bucket number in SSM's index, pointing
    anywhere: a one-line FormatError naming the column."""
    path = made("fixed", "StandardStMan")
    ssm = open_table(TableDirectory(path))._reader(0)
    ref_at = long_string_reference(path)
    little = value.to_bytes(4, "little")
    for field in (0, 8):  # heap bucket number, string length
        copy = made("fixed", "StandardStMan")
        _patch(copy, "table.f0", ref_at + field, little)
        with pytest.raises(FormatError, match="column s_string: .*") as err:
            open_table(TableDirectory(copy)).read_column("s_string")
        assert "\n" not in str(err.value)
    # the data bucket numbers in the index: Block<uInt> after the last-row Block
    index_bytes = Path(path, "table.f0").read_bytes()
    first_index = 512 + ssm.first_index_bucket * ssm.bucket_size
    blocks = index_bytes.find(b"Block", index_bytes.find(b"Block", first_index) + 1)
    copy = made("fixed", "StandardStMan")
    _patch(copy, "table.f0", blocks + 5 + 4 + 4, little)  # type name, version, count
    with pytest.raises(FormatError, match="bucket"):
        _read_everything(copy)


@pytest.mark.parametrize("count", [0, 0x7FFFFFFF])
def test_hostile_ism_value_count(made, count):
    """The number of values of a column in an ISM bucket's index, zero or huge."""
    path = made("fixed", "IncrementalStMan")
    ism = open_table(TableDirectory(path))._reader(0)
    bucket_at = 512 + int(ism.bucket_nr[0]) * ism.bucket_size
    head = int.from_bytes(Path(path, "table.f0").read_bytes()[bucket_at:bucket_at + 4], "little")
    _patch(path, "table.f0", bucket_at + (head & 0x0FFFFFFF), count.to_bytes(4, "little"))
    with pytest.raises(FormatError, match="index has .* values"):
        _read_everything(path)


def test_hostile_row_map_of_tiled_shape_manager(made):
    """A TiledShapeStMan position map sending rows past their hypercube."""
    path = made("var", "TiledShapeStMan")
    reader = open_table(TableDirectory(path))._reader(0)
    header = Path(path, "table.f0").read_bytes()
    pos_block = header.rindex(b"Block")  # the last Block: the position map
    first_pos = pos_block + 5 + 4 + 4
    assert int.from_bytes(header[first_pos:first_pos + 4], "big") == int(reader.pos_map[0])
    _patch(path, "table.f0", first_pos, (1 << 20).to_bytes(4, "big"))
    with pytest.raises(FormatError, match="positions"):
        _read_everything(path)
