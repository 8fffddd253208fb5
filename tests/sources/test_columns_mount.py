"""``mount.ctdsfs -o columns``: every table directory a mount shows gets ``columns/``, and
``numpy.load`` of its files gives python-casacore's getcol; without the option nothing
of it is shown (``cp -r`` copies the table's own files only)."""

import json
import os
import shutil
import sys
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.toolbox import pack

from ..formats.casacore.test_columns import write_table

COLUMNS = ("DATA", "FLAG", "UVW", "TIME", "ANTENNA1", "WEIGHT")
FLOOR = Path(__file__).resolve().parents[2] / "scripts" / "pyfuse3_floor.py"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """A MeasurementSet in separate files, the same packed by ``ctdsfs pack``, and one
    python-casacore stored as MultiFile (every table a ``table.mf`` beside table.dat)."""
    where = tmp_path_factory.mktemp("ms")
    plain = write_table(where / "plain.ms", "ms", "600")
    pack(plain, str(where / "obs.mf"), quiet=True)
    multifile = write_table(where / "mf.ms", "ms", "600", multifile=True)
    return {"plain": plain, "packed": str(where / "obs.mf"), "multifile": multifile}


def assert_columns_as_getcol(mountpoint, reference):
    with ct.table(reference, ack=False) as ref:
        for name in COLUMNS:
            got = np.load(mountpoint / "columns" / f"{name}.npy")
            expected = ref.getcol(name)
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            np.testing.assert_array_equal(got, expected, err_msg=name)
    with ct.table(f"{reference}/ANTENNA", ack=False) as ref:
        antenna = mountpoint / "ANTENNA" / "columns"
        offsets = np.load(antenna / "NAME.offsets.npy")
        data = (antenna / "NAME.data").read_bytes()
        names = [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
        assert names == ref.getcol("NAME") == ["ant-α", "ant-β", "ant-γ"]
        np.testing.assert_array_equal(np.load(antenna / "POSITION.npy"), ref.getcol("POSITION"))
    described = json.loads((mountpoint / "columns" / "table.json").read_text())
    assert described["columns"]["DATA"]["data_manager"] == "TiledShapeStMan"
    assert described["columns"]["UVW"]["keywords"]["QuantumUnits"]["values"] == ["m"] * 3


@pytest.mark.parametrize("kind", ["packed", "multifile"])
def test_columns_of_every_table_as_getcol(mount, tables, kind):
    """A packed container's nested tables and a MultiFile table directory (the table view)
    each show columns/ (tables in separate files: the next tests and test_columns_remote)."""
    m = mount(tables[kind], ["columns"])
    assert_columns_as_getcol(m.mountpoint, tables["plain"])
    assert (m.mountpoint / "columns").is_dir()
    assert "columns" in [p.name for p in m.mountpoint.iterdir()]
    assert (m.mountpoint / "FIELD" / "columns" / "table.json").is_file()
    if kind == "multifile":
        assert not (m.mountpoint / "table.mf").exists()  # the table view, as without columns
    with pytest.raises(OSError):
        (m.mountpoint / "columns" / "DATA.npy").write_bytes(b"x")


def test_without_the_option_cp_copies_no_columns(mount, tables, tmp_path):
    m = mount(tables["packed"])
    assert not (m.mountpoint / "columns").exists()
    shutil.copytree(m.mountpoint, tmp_path / "copy")
    assert not list((tmp_path / "copy").rglob("columns"))
    with ct.table(str(tmp_path / "copy"), ack=False) as copy, \
            ct.table(tables["plain"], ack=False) as ref:
        np.testing.assert_array_equal(copy.getcol("DATA"), ref.getcol("DATA"))


def test_a_table_with_its_own_columns_entry_keeps_it(mount, tables, tmp_path):
    """The main table's own ``columns`` directory is shown as it is; its subtables (in
    separate files) get the view."""
    table = tmp_path / "t.ms"
    shutil.copytree(tables["plain"], table)
    (table / "columns").mkdir()
    (table / "columns" / "mine.txt").write_text("the user's own\n")
    m = mount(table, ["columns"])
    assert [p.name for p in (m.mountpoint / "columns").iterdir()] == ["mine.txt"]
    with ct.table(f"{tables['plain']}/ANTENNA", ack=False) as ref:
        antenna = m.mountpoint / "ANTENNA" / "columns"
        np.testing.assert_array_equal(np.load(antenna / "POSITION.npy"), ref.getcol("POSITION"))
    assert "has its own entry 'columns'" in m.log_text()


def test_a_table_that_does_not_decode_shows_an_empty_columns(mount, tmp_path):
    """Its directory still lists; columns/ is empty, and the log names the table.dat."""
    table = tmp_path / "src" / "t"
    table.mkdir(parents=True)
    (table / "table.dat").write_bytes(b"\x01\x02not casacore" * 20)
    m = mount(tmp_path / "src", ["columns"])
    assert sorted(p.name for p in (m.mountpoint / "t").iterdir()) == ["columns", "table.dat"]
    assert list((m.mountpoint / "t" / "columns").iterdir()) == []
    log = m.log_text()
    assert f"{table}/table.dat: " in log and "no columns shown" in log
    assert "Traceback" not in log


def test_benchmark_floor_serves_the_files_byte_for_byte(mount, tables, tmp_path):
    """The benchmark's floor for the decoded views (scripts/pyfuse3_floor.py ``files``) is
    only a floor if it serves the files' own bytes: the tiled columns' .npy saved from
    getcol, read whole, across reads, at the end; an empty file; nothing else."""
    decoded = tmp_path / "decoded"
    decoded.mkdir()
    with ct.table(tables["plain"], ack=False) as ref:
        columns = {name: ref.getcol(name) for name in ("DATA", "FLAG", "UVW")}
    for name, values in columns.items():
        np.save(decoded / f"{name}.npy", values)
    (decoded / "odd.bin").write_bytes(os.urandom((1 << 20) + 12345))
    (decoded / "empty").write_bytes(b"")
    files = {f"{name}.npy": decoded / f"{name}.npy" for name in columns}
    files.update({"odd": decoded / "odd.bin", "empty": decoded / "empty"})
    m = mount(None, command=lambda mountpoint: [
        sys.executable, str(FLOOR), "files", str(mountpoint),
        *(f"{name}={path}" for name, path in files.items())])
    assert sorted(p.name for p in m.mountpoint.iterdir()) == sorted(files)
    for name, path in files.items():
        assert (m.mountpoint / name).read_bytes() == path.read_bytes(), name
    data = files["odd"].read_bytes()
    with open(m.mountpoint / "odd", "rb") as f:
        f.seek((1 << 20) - 100)
        assert f.read(300) == data[(1 << 20) - 100:(1 << 20) + 200]
        f.seek(len(data) - 10)
        assert f.read(100) == data[-10:] and f.read(100) == b""
    for name, values in columns.items():
        np.testing.assert_array_equal(np.load(m.mountpoint / f"{name}.npy"), values)
    assert not (m.mountpoint / "odd.bin").exists()
