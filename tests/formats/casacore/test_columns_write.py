"""``mount.ctdsfs -o rw,columns``: writes into ``columns/NAME.npy`` change the table's cells,
and python-casacore reads exactly the new values (its own putcol of the same values gives
byte-identical storage-manager files); every other write there is refused with EPERM in
the write call and changes nothing."""

import errno
import mmap
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.formats import open_container
from ctdsfs.toolbox import pack, to_sepfile, unpack

from ...conftest import Mount, require_fuse

HERE = Path(__file__).parent
NROW = 300


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Tables python-casacore writes once (one process, MultiFile storage through its
    .casarc): a MeasurementSet (FLAG in TiledShapeStMan, UVW in TiledColumnStMan, the
    rest in StandardStMan), its big-endian copy, every type in StandardStMan (and its
    big-endian copy), in IncrementalStMan and (fixed-shape arrays) in each tiled
    manager, variable-shape arrays; and every type in StandardStMan stored in
    separate files (a plain directory), and that table packed by ``ctdsfs pack`` into a
    MultiFile and into a MultiHDF5 container; the MeasurementSet in separate files packed
    into a MultiHDF5 container (python-casacore here has no HDF5: casacore reads
    MultiHDF5 tables unpacked)."""
    where = tmp_path_factory.mktemp("tables")
    for name, multifile in (("home-mf", True), ("home-plain", False)):
        (where / name).mkdir()
        (where / name / ".casarc").write_text(
            "table.storage.option: multifile\n" if multifile else "")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import casacore_column_tables as c\n"
        "import casacore.tables as ct\n"
        "w = sys.argv[2]\n"
        f"c.measurement_set(w + '/ms', {NROW})\n"
        "ct.table(w + '/ms', ack=False).copy(w + '/big.ms', deep=True, endian='big')\n"
        "c.scalar_and_fixed(w + '/ssm', 'StandardStMan')\n"
        "c.scalar_and_fixed(w + '/ism', 'IncrementalStMan')\n"
        "c.varshape(w + '/var', 'StandardStMan')\n"
        "ct.table(w + '/ssm', ack=False).copy(w + '/big-ssm', deep=True, endian='big')\n"
        "for m in ('TiledColumnStMan', 'TiledShapeStMan', 'TiledCellStMan'):\n"
        "    c.scalar_and_fixed(w + '/' + m, m)\n")
    subprocess.run([sys.executable, "-c", script, str(HERE), str(where)], check=True,
                   env=dict(os.environ, HOME=str(where / "home-mf")))
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import casacore_column_tables as c; c.scalar_and_fixed(sys.argv[2], "
                    "'StandardStMan')", str(HERE), str(where / "plain")], check=True,
                   env=dict(os.environ, HOME=str(where / "home-plain")))
    pack(str(where / "plain"), str(where / "packed.mf"), quiet=True)
    pack(str(where / "plain"), str(where / "packed.mfh5"), format="hdf5", quiet=True)
    shutil.copytree(where / "ms", where / "ms-sepfile")
    to_sepfile(str(where / "ms-sepfile"), quiet=True)
    pack(str(where / "ms-sepfile"), str(where / "ms.mfh5"), format="hdf5", quiet=True)
    return where


def as_casacore_opens(path):
    """``path``, or for a container packed by ``ctdsfs pack`` its tree unpacked beside it."""
    if not path.is_file():
        return path
    unpacked = path.with_name(path.name + ".unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    unpack(str(path), str(unpacked), quiet=True)
    return unpacked


def every_column(path):
    """{name: getcol} of every column whose cells are all defined."""
    out = {}
    with ct.table(str(as_casacore_opens(path)), ack=False) as t:
        for name in t.colnames():
            try:
                out[name] = t.getcol(name)
            except RuntimeError:  # (undefined cells: FLAG_CATEGORY)
                continue
    return out


def stored_files(path):
    """{name: bytes} of a table's storage-manager files (in its table.mf, in a packed
    container, or in the directory)."""
    if not path.is_file() and not (path / "table.mf").exists():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.name.startswith("table.f")}
    container = open_container(str(path if path.is_file() else path / "table.mf"))
    try:
        return {n: bytes(container.read(n, 0, container.entry_size(n)))
                for n in container.names() if n.startswith("table.f")}
    finally:
        container.close()


def npy_edit(expected, path, offset, data):
    """Write ``data`` at ``offset`` of the mounted ``path`` (os.pwrite), and into the
    expected bytes of that file."""
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
    finally:
        os.close(fd)
    expected[offset:offset + len(data)] = data


def header_size(path):
    with open(path, "rb") as f:
        head = f.read(12)
    return 10 + int.from_bytes(head[8:10], "little")


def check_edits(mount, written, tmp_path, edits):
    """Mount copies of the tables ``edits`` names (in one tree) rw,columns, let
    ``edit(columns, expected)`` write columns of each (``expected``: {column: bytearray
    of its NAME.npy, edited as the mount is}); then the mount reads the edits back, and
    after unmounting python-casacore reads them, every other column as before; every
    byte the mount changed in the storage-manager files, python-casacore's own putcol
    of the same values into another copy changes to the same value (the tiled managers'
    data files come out identical)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in edits:
        copy = shutil.copy if name.endswith((".mf", ".mfh5")) else shutil.copytree
        copy(written / name, tree / name)
        shutil.copytree(as_casacore_opens(written / name), tmp_path / "by-casacore" / name)
    before = {name: every_column(tree / name) for name in edits}
    original = {name: stored_files(tree / name) for name in edits}
    m = mount(tree, ["rw", "columns"])
    values = {}
    for name, edit in edits.items():
        columns = m.mountpoint / name / "columns"
        expected = {c: bytearray((columns / f"{c}.npy").read_bytes()) for c in edit.columns}
        edit(columns, expected)
        values[name] = {c: np.load(columns / f"{c}.npy") for c in expected}
        for column, data in expected.items():
            assert (columns / f"{column}.npy").read_bytes() == bytes(data), (name, column)
    m.close()
    for name in edits:
        check_table(tree / name, tmp_path / "by-casacore" / name, before[name],
                    original[name], values[name])


def check_table(path, by_casacore, before, original, values):
    after = every_column(path)
    assert after.keys() == before.keys()
    for column in after:
        want = values[column] if column in values else before[column]
        if not isinstance(want, np.ndarray):  # (Strings)
            np.testing.assert_equal(after[column], want, err_msg=column)
            continue
        assert after[column].dtype == want.dtype, column
        np.testing.assert_array_equal(after[column], want, err_msg=column)
    for column in values:
        assert not np.array_equal(values[column], before[column]), column  # (a real change)
    with ct.table(str(by_casacore), readonly=False, ack=False) as t:
        for column, value in values.items():
            t.putcol(column, value)
    ours, theirs = stored_files(path), stored_files(by_casacore)
    for file, data in ours.items():
        old = np.frombuffer(original[file], np.uint8)
        new, putcol = np.frombuffer(data, np.uint8), np.frombuffer(theirs[file], np.uint8)
        assert len(new) == len(old), file
        changed = np.flatnonzero(new != old)
        assert (putcol[changed] == new[changed]).all(), file  # bytes putcol changes too
        if "_TSM" in file:  # (SSM files: casacore also rewrites its index on close)
            assert data == theirs[file], file


def edit_flag_and_uvw(columns, expected):
    flag = columns / "FLAG.npy"
    a = np.load(flag, mmap_mode="r+")
    a[10:20] = True
    a[5, 3, 1] = not a[5, 3, 1]
    a.flush()
    del a
    head = header_size(flag)
    shown = np.frombuffer(expected["FLAG"], bool, offset=head).reshape(NROW, 64, 4)
    shown = shown.copy()
    shown[10:20] = True
    shown[5, 3, 1] = not shown[5, 3, 1]
    expected["FLAG"][head:] = shown.tobytes()
    # bits in the middle of a byte, across rows and tiles: unaligned Bool bytes
    npy_edit(expected["FLAG"], flag, head + 40 * 256 + 77, bytes([1, 0, 1, 1, 0, 1, 1]))
    npy_edit(expected["FLAG"], flag, head + 255 * 256 + 250, bytes([1] * 20))
    uvw = columns / "UVW.npy"
    u = np.load(uvw, mmap_mode="r+")
    u[3:7] = [1.5, -2.5, 3.25]
    u.flush()
    del u
    head = header_size(uvw)
    shown = np.frombuffer(expected["UVW"], "<f8", offset=head).reshape(NROW, 3).copy()
    shown[3:7] = [1.5, -2.5, 3.25]
    expected["UVW"][head:] = shown.tobytes()
    # three bytes in the middle of one value, and a run over two rows from mid-value
    npy_edit(expected["UVW"], uvw, head + 8 * (3 * 9 + 1) + 5, b"\x12\x34\x56")
    npy_edit(expected["UVW"], uvw, head + 8 * (3 * 20 + 2) + 3, bytes(range(40, 61)))
    weight = columns / "WEIGHT.npy"  # arrays StandardStMan keeps in its array file
    head = header_size(weight)
    npy_edit(expected["WEIGHT"], weight, head + 4 * (4 * 7 + 3) + 1, bytes(range(7, 14)))
    w = np.load(weight, mmap_mode="r+")
    w[100:103] = [[1, 2, 3, 4]] * 3
    w.flush()
    del w
    shown = np.frombuffer(expected["WEIGHT"], "<f4", offset=head).reshape(NROW, 4).copy()
    shown[100:103] = [[1, 2, 3, 4]] * 3
    expected["WEIGHT"][head:] = shown.tobytes()


edit_flag_and_uvw.columns = ("FLAG", "UVW", "WEIGHT")


def edit_ssm(columns, expected):
    for column, offset, data in (("s_double", 8 * 5 + 3, b"\x01\x02\x03\x04\x05\x06\x07"),
                                 ("s_bool", 3, bytes([1, 1, 0, 1, 0, 0, 1, 1, 1])),
                                 ("s_int", 4 * 30 + 2, b"\x7f\x00\x11"),
                                 ("s_uchar", 2 * 36, b"\xff\x00"),
                                 ("a_bool", 15 * 7 + 4, bytes([1, 0, 1] * 9)),
                                 ("a_dcomplex", 16 * 15 * 2 + 9, bytes(range(1, 50))),
                                 ("a_short", 2 * 15 * 35 + 1, b"\x99\x88\x77")):
        path = columns / f"{column}.npy"
        npy_edit(expected[column], path, header_size(path) + offset, data)
    a = np.load(columns / "a_int.npy", mmap_mode="r+")
    a[2:4, :, 1] = [7, 8, 9]
    a.flush()
    del a
    path = columns / "a_int.npy"
    head = header_size(path)
    shown = np.frombuffer(expected["a_int"], "<i4", offset=head).reshape(-1, 3, 5).copy()
    shown[2:4, :, 1] = [7, 8, 9]
    expected["a_int"][head:] = shown.tobytes()


edit_ssm.columns = ("s_double", "s_bool", "s_int", "s_uchar", "a_bool", "a_dcomplex",
                    "a_short", "a_int")


def test_cells_written_through_numpy(mount, written, tmp_path):
    """FLAG (Bool bits in TiledShapeStMan tiles), UVW (TiledColumnStMan) and WEIGHT
    (StandardStMan's array file) of a MultiFile MeasurementSet, little- and big-endian; scalars and arrays kept in StandardStMan's
    buckets (Bools as bits, uChar widened to uint16 in the file) of a table packed into a
    .mf (the MS: table directories whose files are in table.mf): memmap r+ and os.pwrite
    at unaligned offsets."""
    check_edits(mount, written, tmp_path, {"ms": edit_flag_and_uvw, "big.ms": edit_flag_and_uvw,
                                           "packed.mf": edit_ssm})


def test_cells_written_in_multihdf5_containers(mount, written, tmp_path):
    """The same edits in MultiHDF5 containers (committed through their journal): the
    MeasurementSet's FLAG, UVW and WEIGHT, and StandardStMan's scalars and arrays."""
    check_edits(mount, written, tmp_path, {"ms.mfh5": edit_flag_and_uvw,
                                           "packed.mfh5": edit_ssm})


def refused(path, offset, data):
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(OSError) as caught:
            os.pwrite(fd, data, offset)
        return caught.value.errno
    finally:
        os.close(fd)


def test_other_writes_refused_with_eperm_changing_nothing(mount, written, tmp_path):
    """Strings, IncrementalStMan, variable-shape arrays, table.json, the .npy
    header, a write past the end, a Bool byte of 2 (also through a memory map: its
    flush fails), a uChar above 255, a resize, a new file; any cell of a table in separate files (written in place, a crash could leave
    half a write): EPERM in the write call; every file of the tables is byte for byte as
    it was (MultiFile tables in a directory tree: each its own table view)."""
    tree = tmp_path / "tree"
    for name in ("ssm", "ism", "var", "plain"):
        shutil.copytree(written / name, tree / name)
    originals = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    m = mount(tree, ["rw", "columns"])
    cols = {name: m.mountpoint / name / "columns" for name in ("ssm", "ism", "var", "plain")}
    ssm = cols["ssm"]
    size = (ssm / "s_int.npy").stat().st_size
    head = header_size(ssm / "s_int.npy")
    cases = [(ssm / "s_string.data", 0, b"x"), (ssm / "s_string.offsets.npy", 200, b"\1"),
             (ssm / "table.json", 0, b"{"), (ssm / "s_int.npy", 8, b"\2"),
             (ssm / "s_int.npy", size - 2, b"\0\0\0\0"), (ssm / "s_int.npy", size, b"\0"),
             (ssm / "s_bool.npy", header_size(ssm / "s_bool.npy") + 3, b"\2"),
             (ssm / "s_uchar.npy", header_size(ssm / "s_uchar.npy"), b"\x2c\x01"),
             (cols["ism"] / "s_int.npy", head, b"\1\2\3\4"),
             (cols["var"] / "v_int.values.npy", 200, b"\1"),
             (cols["plain"] / "s_int.npy", head, b"\1\2\3\4")]
    for path, offset, data in cases:
        assert refused(path, offset, data) == errno.EPERM, (path, offset)
    with pytest.raises(OSError) as caught:
        os.truncate(ssm / "s_int.npy", size + 8)
    assert caught.value.errno == errno.EPERM
    with pytest.raises(OSError) as caught:
        (ssm / "new.npy").write_bytes(b"")
    assert caught.value.errno == errno.EPERM
    with open(ssm / "a_bool.npy", "r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        mapped[header_size(ssm / "a_bool.npy") + 7] = 2  # a Bool byte of 2, through a map
        with pytest.raises(OSError) as caught:
            mapped.flush()
        assert caught.value.errno == errno.EPERM
    # a header written as it is (a page the kernel writes back whole) is no change
    fd = os.open(ssm / "s_int.npy", os.O_RDWR)
    os.pwrite(fd, (ssm / "s_int.npy").read_bytes()[:head + 4], 0)
    os.close(fd)
    m.close()
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == originals
    assert "Traceback" not in m.log.read_text()


def test_numpy_and_casacore_through_one_mount_see_each_other(mount, written, tmp_path):
    """casacore writing the table through the mount changes what columns/ reads (rows
    decoded before included), and a NumPy write into columns/ is what casacore then
    reads through the mount."""
    shutil.copytree(written / "ms", tmp_path / "ms")
    m = mount(tmp_path / "ms", ["rw", "columns"])
    uvw = m.mountpoint / "columns" / "UVW.npy"
    expected = np.load(uvw)  # (decoded and kept by the view)
    with ct.table(str(m.mountpoint), readonly=False, ack=False) as t:
        t.putcol("UVW", np.full((5, 3), 7.0), startrow=2, nrow=5)
    expected[2:7] = 7.0
    np.testing.assert_array_equal(np.load(uvw), expected)
    a = np.load(uvw, mmap_mode="r+")
    a[0] = [9, -9, 0.5]
    a.flush()
    del a
    expected[0] = [9, -9, 0.5]
    with ct.table(str(m.mountpoint), ack=False) as t:
        np.testing.assert_array_equal(t.getcol("UVW"), expected)


COLUMN_CRASH_POINTS = int(os.environ.get("CTDSFS_COLUMN_CRASH_POINTS", "2"))


def flag_of(path):
    with ct.table(str(as_casacore_opens(path)), ack=False) as t:
        return t.getcol("FLAG")


@pytest.mark.parametrize("name", ["ms", "ms.mfh5"])
def test_kill_9_leaves_the_last_or_the_next_commit(written, tmp_path, name):
    """kill -9 the daemon while FLAG is written (unaligned runs of Bool bytes over rows and
    tiles, each committed by fsync), in a MultiFile and in a MultiHDF5 MeasurementSet:
    python-casacore then reads the values of the last commit or of the one in flight,
    never a mix."""
    require_fuse()
    rng = random.Random(25)
    path = tmp_path / name
    (shutil.copy if name.endswith(".mfh5") else shutil.copytree)(written / name, path)
    state = flag_of(path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for point in range(COLUMN_CRASH_POINTS):
        m = Mount(path, mnt, options=["rw", "columns", "commit=3600"], log=tmp_path / "crash.log")
        flag = mnt / "columns" / "FLAG.npy"
        head = header_size(flag)
        expected = state
        m.kill_after(rng.uniform(0.05, 0.4))
        try:
            fd = os.open(flag, os.O_RDWR)
            while True:
                at = rng.randrange(0, state.size - 1)
                data = bytes(rng.choices((0, 1), k=rng.randrange(1, min(3000, state.size - at))))
                expected = state.copy()
                expected.reshape(-1)[at:at + len(data)] = np.frombuffer(data, bool)
                os.pwrite(fd, data, head + at)
                os.fsync(fd)  # the commit
                state = expected
        except OSError:
            pass  # the daemon is gone
        m.reap_killed()
        got = flag_of(path)
        assert np.array_equal(got, state) or np.array_equal(got, expected), point
        state = got


@pytest.mark.parametrize("name", ["TiledColumnStMan", "TiledShapeStMan", "TiledCellStMan",
                                  "big-ssm"])
def test_every_type_written_by_the_view(written, tmp_path, name):
    """The view's write (without a mount) into every type's fixed-shape array column (and
    scalar column, in StandardStMan) of each tiled manager and of a big-endian
    StandardStMan table: a run of new values from a random element (Bool bits mid-byte),
    committed; python-casacore reads them, the other columns as they were."""
    from ctdsfs.formats.casacore.columns_view import ColumnsView
    from ctdsfs.sources.directory import TableView

    from .casacore_column_tables import TYPES, values

    path = tmp_path / "t"
    shutil.copytree(written / name, path)
    before = every_column(path)
    rng = np.random.default_rng(7)
    source = TableView(str(path), writable=True)
    view = ColumnsView(source, "t/columns")
    expected = {}
    for i, column in enumerate(c for v in TYPES for c in (f"a_{v}", f"s_{v}") if c in before):
        vtype = column[2:]
        flat = before[column].copy().reshape(-1)
        first = int(rng.integers(0, flat.size - 20))
        new = values(vtype, 20, 1000 + i).astype(flat.dtype)
        flat[first:first + 20] = new
        head = header_size_of(view.read(f"{column}.npy", 0, 4096))
        assert view.write(f"{column}.npy", head + first * flat.itemsize, new.tobytes()) == \
            new.nbytes
        expected[column] = flat.reshape(before[column].shape)
        np.testing.assert_array_equal(  # the view reads back what it wrote
            np.frombuffer(view.read(f"{column}.npy", head, 1 << 20), flat.dtype), flat)
    assert len(expected) == (20 if name == "big-ssm" else 10)
    source.commit()
    source.close()
    after = every_column(path)
    for column, got in after.items():
        np.testing.assert_equal(got, expected.get(column, before[column]), err_msg=column)


def header_size_of(data):
    return 10 + int.from_bytes(bytes(data[8:10]), "little")
