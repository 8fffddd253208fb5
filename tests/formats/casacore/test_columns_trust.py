"""A table directory that cannot be trusted, through ``columns/`` (issue 35): a storage
manager's file missing, unreadable or a link, strings in ``table.dat`` that are not UTF-8,
and array cells whose header cannot be true. Each costs the columns it holds (left out
with their error in table.json, or EIO on read), never the listing, never a traceback;
every other column reads as before."""

import errno
import json
import os
import re
import shutil
import struct

import casacore.tables as ct
import fsspec
import numpy as np
import pytest

from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.toolbox import pack
from ctdsfs.vfs.filesystem import FSError

from .test_columns import made  # noqa: F401  (the table fixture)
from .test_columns_hostile import columns_fs, listing

TABLES = [("fixed", "StandardStMan"), ("var", "StandardStMan"), ("fixed", "IncrementalStMan"),
          ("var", "StManAipsIO"), ("fixed", "TiledColumnStMan"), ("var", "TiledShapeStMan"),
          ("var", "TiledCellStMan")]


def _shown(path):
    """{file of columns/: its bytes, or the errno its read gave} and table.json's columns."""
    fs, columns = columns_fs(path)
    files = {}
    for name, size in listing(fs, columns).items():
        try:
            fh = fs.open(fs.lookup(columns, name).ino, os.O_RDONLY)
            try:
                files[name] = bytes(fs.read(fh, 0, size))
            finally:
                fs.release(fh)
        except FSError as exc:
            assert "\n" not in str(exc), exc
            files[name] = exc.errno
    return files, json.loads(files["table.json"])["columns"]


def _column(file):
    return file.split(".")[0]


def assert_costs_only(path, reference, damaged):
    """What columns/ of ``path`` shows is ``reference``'s but for the columns in
    ``damaged``: each of those left out with its error, or EIO on read."""
    files, described = _shown(path)
    for name, data in reference.items():
        if name == "table.json":
            continue
        if _column(name) in damaged:
            assert files.get(name, errno.EIO) == errno.EIO, name
            if name not in files:
                assert described[_column(name)]["error"], name
        else:
            assert files.get(name) == data, name
    assert set(files) <= set(reference)
    assert any(_column(n) in damaged for n in reference)  # (the damage reached a column)


def _manager_files(path, seqnr):
    return sorted(n for n in os.listdir(path) if re.fullmatch(rf"table\.f{seqnr}(\D.*)?", n))


def _columns_of(path, seqnr):
    return {n for n, c in open_table(TableDirectory(path)).columns.items() if c.seqnr == seqnr}


@pytest.mark.parametrize("damage", ["missing", "directory", "empty"])
@pytest.mark.parametrize("what,manager", TABLES)
def test_an_unreachable_manager_file_costs_its_columns_only(made, what, manager, damage):  # noqa: F811
    """Each file of one storage manager (its header, its array file, its tiles) deleted,
    replaced by a directory (chmod 000 would not stop root) or emptied in turn. Before,
    a missing file made all of columns/ EIO (FileNotFoundError out of its listing)."""
    path = made(what, manager)
    reference, _ = _shown(path)
    damaged = _columns_of(path, 1)
    for name in _manager_files(path, 1):
        original = os.path.join(path, name)
        kept = shutil.copy(original, original + ".kept")
        os.unlink(original)
        if damage == "directory":
            os.mkdir(original)
        elif damage == "empty":
            open(original, "wb").close()
        assert_costs_only(path, reference, damaged)
        if damage == "directory":
            os.rmdir(original)
        os.replace(kept, original)


@pytest.mark.parametrize("target", ["inside", "outside", "directory", "dangling", "fifo"])
def test_a_link_in_place_of_any_table_file_is_refused_in_one_line(made, tmp_path, target):  # noqa: F811
    """A manager's header, array file and tiles, and table.dat, each replaced by a link: to
    another file of the table, to a copy of itself outside, to a directory, to nothing,
    to a FIFO. Nothing is read through it: the columns it holds are left out or EIO,
    with one line (before: ELOOP's traceback out of the listing); a table.dat that is a
    link makes the directory a plain one (no columns/), as casacore's own file check."""
    for what, manager in [("var", "StandardStMan"), ("var", "TiledShapeStMan")]:
        path = made(what, manager)
        reference, _ = _shown(path)
        os.mkfifo(tmp_path / "fifo") if not (tmp_path / "fifo").exists() else None
        for name in _manager_files(path, 1) + ["table.dat"]:
            original = os.path.join(path, name)
            outside = shutil.copy(original, tmp_path / name)
            os.rename(original, original + ".kept")
            os.symlink({"inside": os.path.join(path, "table.f0"), "outside": outside,
                        "directory": path, "dangling": tmp_path / "none",
                        "fifo": tmp_path / "fifo"}[target], original)
            if name == "table.dat":
                fs, columns = columns_fs(path)
                assert listing(fs, columns) == {}
            else:
                assert_costs_only(path, reference, _columns_of(path, 1))
            os.unlink(original)
            os.rename(original + ".kept", original)


def _non_utf8_table(path):
    """A table whose every string in table.dat holds "é": the table's and a column's keyword
    names and values, column names and comments, the data managers' names and a type."""
    cols = [ct.makescacoldesc("colé", 0.0, comment="commé", datamanagergroup="smé"),
            ct.makescacoldesc("other", 0, datamanagertype="IncrementalStMan",
                              datamanagergroup="ismé")]
    dminfo = {"*1": {"TYPE": "StandardStMan", "NAME": "smé", "COLUMNS": ["colé"]},
              "*2": {"TYPE": "IncrementalStMan", "NAME": "ismé", "COLUMNS": ["other"]}}
    with ct.table(str(path), ct.maketabdesc(cols), dminfo=dminfo, nrow=9, ack=False) as t:
        t.putcol("colé", np.arange(9) / 4)
        t.putcol("other", np.arange(9) // 3)
        t.putkeyword("keyé", "valé")
        t.putcolkeyword("colé", "unité", "mé")


def test_strings_that_are_not_utf8_in_table_dat(tmp_path):
    """Every "é" of table.dat made two bytes that are not UTF-8 (and the type name of one
    manager too): columns/ lists, table.json keeps each byte as the escape \\udcNN (as
    `tableinfo --json` does; before, it could not be encoded and columns/ was EIO), the
    columns read as before, also through fsspec."""
    path = tmp_path / "t"
    _non_utf8_table(path)
    with ct.table(str(path), ack=False) as t:
        values = t.getcol("colé")
    dat = (path / "table.dat").read_bytes()
    bad = dat.replace("é".encode(), b"\xff\xfe").replace(b"IncrementalStMan",
                                                         b"Incremental\xffStMan"[:16])
    assert bad.count(b"\xff\xfe") >= 8 and b"IncrementalStMan" not in bad
    (path / "table.dat").write_bytes(bad)
    col = "col\udcff\udcfe"
    files, described = _shown(path)
    assert np.load(__import__("io").BytesIO(files[f"{col}.npy"])).tolist() == values.tolist()
    text = files["table.json"].decode()  # (UTF-8)
    assert "\\udcff\\udcfe" in text and "\udcff" not in text
    table = json.loads(text)
    assert table["keywords"] == {"key\udcff\udcfe": "val\udcff\udcfe"}
    assert described[col]["keywords"] == {"unit\udcff\udcfe": "m\udcff\udcfe"}
    assert described["other"]["data_manager"].encode("utf-8", "surrogateescape") == \
        b"Incremental\xffStMa" and not described["other"]["decoded"]
    packed = tmp_path / "t.mf"
    pack(str(path), str(packed), quiet=True)
    fs = fsspec.filesystem("ctdsfs", fo=str(packed), columns=True)
    assert json.loads(fs.cat("columns/table.json")) == table
    assert fs.cat(f"columns/{col}.npy") == files[f"{col}.npy"]


def _patched_header(path, name, big_endian, shape, change):
    """``path/name`` with the first array header (rank, then the axes, casacore order) of
    ``shape`` changed by ``change`` (rank, axes) -> bytes."""
    order = ">" if big_endian else "<"
    header = struct.pack(f"{order}{len(shape) + 1}i", len(shape), *shape)
    data = bytearray(open(os.path.join(path, name), "rb").read())
    at = data.find(header)
    assert at > 0, (name, header)
    data[at:at + len(header)] = change(len(shape), list(shape), order)
    return bytes(data)


CHANGES = {  # an array header that cannot be true -> its bytes
    "rank 0": lambda rank, axes, o: struct.pack(f"{o}i", 0) + b"\0" * 4 * rank,
    "rank 1 in a column of 2": lambda rank, axes, o: struct.pack(f"{o}3i", 1, axes[0] * axes[1],
                                                                 0),
    "rank 3 in a column of 2": lambda rank, axes, o: struct.pack(f"{o}3i", 3, *axes),
    "a negative axis": lambda rank, axes, o: struct.pack(f"{o}3i", rank, -axes[0], axes[1]),
    "a huge axis": lambda rank, axes, o: struct.pack(f"{o}3i", rank, 0x7FFFFFFF, axes[1]),
}
# (manager, column, file, byte order of its headers: None for the table's)
HEADERS = [("StandardStMan", "v_float", "table.f2i", None),
           ("StandardStMan", "v_string", "table.f4", True),  # its heap's shaped arrays
           ("IncrementalStMan", "v_float", "table.f2i", None),
           ("StManAipsIO", "v_int", "table.f1i", True)]


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("manager,column,name,big_endian", HEADERS)
def test_an_array_header_that_cannot_be_true(made, manager, column, name, big_endian, change):  # noqa: F811
    """Row 0's array header (shape [2, 1] in casacore order) made impossible: the column
    is left out or EIO, never shown with a cell that is undefined in one file and
    defined in another (before: a rank-0 cell was shown undefined in shapes.npy while its
    offsets gave it one value; a rank-1 cell passed in a 2-axis column)."""
    path = made("var", manager)
    reference, _ = _shown(path)
    table = open_table(TableDirectory(path))
    order = table.big_endian if big_endian is None else big_endian
    data = _patched_header(path, name, order, (2, 1), CHANGES[change])
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)
    assert_costs_only(path, reference, {column})
