"""casacore 3.8's alternate storage managers (AntennaPairStMan, UvwStMan, StokesIStMan,
SiscoStMan) decoded without casacore: every column bit for bit as python-casacore's
getcol, from separate files, MultiFile and a packed container, through the container
API, a real mount, fsspec and Dask; damaged files give EIO or a one-line refusal."""

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import casacore.tables as ct
import fsspec
import numpy as np
import pytest

from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.toolbox import pack
from ctdsfs.vfs.filesystem import FSError

from .test_columns import mutated, table_source
from .test_columns_hostile import _everything_through_the_vfs, columns_fs

HERE = Path(__file__).resolve().parent
ALTERNATE = ("AntennaPairStMan", "UvwStMan", "StokesIStMan", "SiscoStMan")
KINDS = ("stokes", "stokes-large", "stokes-by-antenna2", "sisco-random", "sisco-structured",
         "sisco-large")


def write(path, kind, multifile):
    home = Path(path).parent / f".home-{Path(path).name}"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "")
    subprocess.run([sys.executable, str(HERE / "altman_tables.py"), kind, str(path)],
                   check=True, env=dict(os.environ, HOME=str(home)), capture_output=True)
    return str(path)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each kind of MeasurementSet in separate files, as MultiFile, and packed."""
    where = tmp_path_factory.mktemp("altmans")
    made = {}
    for kind in KINDS:
        plain = write(where / f"{kind}.ms", kind, False)
        packed = str(where / f"{kind}.mf")
        pack(plain, packed, quiet=True)
        made[kind] = {"plain": plain, "multifile": write(where / f"{kind}-mf.ms", kind, True),
                      "packed": packed}
    return made


def alternate_columns(path):
    with ct.table(path, ack=False) as t:
        info = t.getdminfo()
    return sorted(c for dm in info.values() if dm["TYPE"] in ALTERNATE for c in dm["COLUMNS"])


def same_bits(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), what


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["plain", "multifile"])
def test_every_column_as_getcol(written, kind, form):
    """Whole columns and row ranges (starting in the middle of a time step, going back to
    the start) equal getcol, NaN payloads and signed zeros included."""
    path = written[kind][form]
    names = alternate_columns(path)
    assert len(names) == (6 if kind.startswith("stokes") else 2 if kind == "sisco-large"
                          else 12)
    if form == "multifile":  # the managers' own files stay beside table.mf
        assert os.path.exists(os.path.join(path, "table.mf"))
    with table_source(path) as source, ct.table(path, ack=False) as ref:
        table = open_table(source)
        for name in names:
            expected = ref.getcol(name)
            same_bits(table.read_column(name), expected, name)
            for start, stop in ((7, 19), (3, 4), (0, 5), (table.nrow - 2, table.nrow)):
                same_bits(table.read_column(name, start, stop), expected[start:stop],
                          f"{name}[{start}:{stop}]")
    if kind == "stokes":
        flags = ref_flags = ct.table(path, ack=False).getcol("FLAG")
        assert flags.any() and not flags.all() and (ref_flags[..., 0] == ref_flags[..., 3]).all()


def test_sisco_reads_that_overlap_the_rows_decoded_carry_on(written):
    """Reads that start a row or more before the previous one ended, or come a little out
    of order (as the mount's reads of rows straddling its reads do), carry on the
    stream from the rows kept: each row is decoded once, not again from the first."""
    path = written["sisco-large"]["plain"]
    with table_source(path) as source, ct.table(path, ack=False) as ref:
        table = open_table(source)
        expected = ref.getcol("L2")
        reader = table._reader(table.columns["L2"].seqnr)
        ranges = [(0, 40), (39, 80), (70, 120), (160, 200), (119, 161), (200, table.nrow)]
        for start, stop in ranges:
            same_bits(table.read_column("L2", start, stop), expected[start:stop],
                      f"L2[{start}:{stop}]")
            if start == 0:
                stream = reader._stream
            assert reader._stream is stream, f"L2[{start}:{stop}] decoded from the first row"


@pytest.mark.parametrize("kind", ["stokes", "sisco-structured"])
@pytest.mark.parametrize("form", ["packed", "multifile"])
def test_numpy_load_through_a_mount(mount, written, kind, form):
    """``numpy.load`` of columns/ gives getcol; the columns are listed with their manager,
    and a write into one is refused."""
    m = mount(written[kind][form], ["rw,columns"] if form == "multifile" else ["columns"])
    reference = written[kind]["plain"]
    described = json.loads((m.mountpoint / "columns" / "table.json").read_text())
    with ct.table(reference, ack=False) as ref:
        for name in alternate_columns(reference):
            same_bits(np.load(m.mountpoint / "columns" / f"{name}.npy"), ref.getcol(name),
                      name)
            assert described["columns"][name]["decoded"], name
    managers = {c["data_manager"] for c in described["columns"].values()}
    assert managers >= ({"StokesIStMan", "UvwStMan", "AntennaPairStMan"}
                        if kind == "stokes" else {"SiscoStMan"})
    target = m.mountpoint / "columns" / ("DATA.npy" if kind == "stokes" else "L2.npy")
    if form == "packed":  # a read-only mount
        with pytest.raises(OSError, match="Read-only"):
            open(target, "r+b")
        return
    with pytest.raises(PermissionError):  # EPERM at the open or the write
        with open(target, "r+b") as f:
            f.seek(200)
            f.write(b"\x01" * 8)


def test_fsspec_and_dask(written):
    from ctdsfs.dask_columns import column_array

    packed, reference = written["stokes-large"]["packed"], written["stokes-large"]["plain"]
    fs = fsspec.filesystem("ctdsfs", fo=packed, columns=True)
    with ct.table(reference, ack=False) as ref:
        for name in ("UVW", "ANTENNA2", "FLAG"):
            with fs.open(f"columns/{name}.npy") as f:
                same_bits(np.load(f), ref.getcol(name), name)
        uvw = column_array(packed, "UVW", chunks=333)
        same_bits(uvw.compute(), ref.getcol("UVW"), "UVW through Dask")
        same_bits(column_array(packed, "DATA", chunks=500)[400:1300].compute(),
                  ref.getcol("DATA")[400:1300], "DATA rows through Dask")


@pytest.mark.parametrize("kind", ["stokes", "stokes-by-antenna2", "sisco-random"])
def test_hostile_manager_files(written, tmp_path, kind):
    """Header counts, strides, patterns, antenna numbers, chunk sizes and deflate streams
    overwritten: columns/ lists, and each read gives values, EIO or a one-line refusal,
    within 4 GiB of address space; restored, it reads as before."""
    path = tmp_path / "t.ms"
    shutil.copytree(written[kind]["plain"], path)
    with ct.table(str(path), ack=False) as t:
        managers = [dm for dm in t.getdminfo().values() if dm["TYPE"] in ALTERNATE]
    files = [f"table.f{dm['SEQNR']}" for dm in managers][:4]
    intact = _everything_through_the_vfs(str(path))
    assert intact == 0
    failed = 0
    for _ in mutated(str(path), files, np.random.default_rng(12), (4, 1),
                     (b"\xff\xff\xff\x7f", b"\x07")):
        failed += _everything_through_the_vfs(str(path)) - intact
    assert failed > 0
    assert _everything_through_the_vfs(str(path)) == intact


@pytest.mark.parametrize("kind,cut", [("sisco-random", "L2"), ("stokes", "UVW"),
                                      ("stokes", "DATA"), ("stokes-by-antenna2", "ANTENNA1")])
def test_a_manager_file_cut_short(written, tmp_path, kind, cut):
    """A manager's file cut to half: the reads that reach past it fail with EIO and a
    one-line reason (StokesIStMan rows past its file read as zeros, as in casacore; UVW
    fails with the antennas it is computed from), the other columns read as before."""
    path = tmp_path / "t.ms"
    shutil.copytree(written[kind]["plain"], path)
    with ct.table(str(path), ack=False) as t:
        seqnr = t.getdminfo(cut)["SEQNR"]
        hit = {c for dm in t.getdminfo().values() if dm["SEQNR"] == seqnr
               for c in dm["COLUMNS"]}
        hit |= {"UVW"} if "ANTENNA1" in hit else set()  # UVW reads the antennas
        expected = {name: t.getcol(name) for name in alternate_columns(str(path))}
    target = path / f"table.f{seqnr}"
    target.write_bytes(target.read_bytes()[:target.stat().st_size // 2])
    fs, columns = columns_fs(str(path))
    for name, values in expected.items():
        fh = fs.open(fs.lookup(columns, f"{name}.npy").ino, os.O_RDONLY)
        try:
            data = fs.read(fh, 0, 1 << 24)
        except FSError as exc:
            assert name in hit and exc.errno == errno.EIO and "\n" not in str(exc), name
            continue
        finally:
            fs.release(fh)
        got = np.load(io.BytesIO(data))
        if name in hit:
            assert cut == "DATA", name
            same_bits(got[:len(got) // 3], values[:len(got) // 3], name)
            assert not got[-1].any()
        else:
            same_bits(got, values, name)
