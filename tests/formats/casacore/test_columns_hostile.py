"""Hostile table files through ``columns/`` itself (the view and the VFS over it): a column
that does not decode costs its own files only, each bad case ends in EIO for one file or
a one-line refusal, with bounded memory and no traceback."""

import errno
import json
import os

import numpy as np
import pytest

from ctdsfs.sources.columns import with_columns
from ctdsfs.sources.directory import directory_or_table
from ctdsfs.vfs import ROOT_INO, ContainerFS
from ctdsfs.vfs.filesystem import FSError

from .test_columns import _patch, long_string_reference, made, mutated  # noqa: F401  (made: the table fixture)


def listing(fs, ino):
    """Every entry's (name, size) of directory ``ino``, as ``ls -l`` asks them."""
    return {name: attr.size for name, attr, _ in fs.readdir(fs.opendir(ino))
            if name not in (".", "..")}


def columns_fs(path):
    fs = ContainerFS(with_columns(directory_or_table(path, source=True)), path)
    return fs, fs.lookup(ROOT_INO, "columns").ino


def test_a_string_column_that_does_not_decode_leaves_the_others_listed(made):  # noqa: F811
    """A string length in SSM's 12-byte reference pointing past everything: before, the
    listing of columns/ asked the string files' sizes and failed whole with EIO."""
    path = made("fixed", "StandardStMan")
    _patch(path, "table.f0", long_string_reference(path) + 8,
           (0x7FFFFFF0).to_bytes(4, "little"))
    fs, columns = columns_fs(path)
    sizes = listing(fs, columns)
    assert "s_string.data" not in sizes and "s_string.offsets.npy" not in sizes
    assert sizes["s_double.npy"] > 0 and "table.json" in sizes
    fh = fs.open(fs.lookup(columns, "table.json").ino, os.O_RDONLY)
    described = json.loads(fs.read(fh, 0, 1 << 20))
    assert described["columns"]["s_string"]["files"] == []
    assert "string length" in described["columns"]["s_string"]["error"]
    with pytest.raises(FSError):
        fs.lookup(columns, "s_string.data")


def _everything_through_the_vfs(path):
    """columns/ listed with sizes and every file read whole, over the VFS; the failures
    (FSError: EIO or another errno with a one-line message; a column left out, with its
    error in table.json; a table not shown), counted."""
    try:
        fs, columns = columns_fs(path)
    except FSError as exc:
        assert "\n" not in str(exc)
        return 1
    try:
        return _failures_reading_everything(fs, columns)
    finally:
        fs.close()  # (the table's files: thousands of cases in one process)


def _failures_reading_everything(fs, columns):
    try:
        sizes = listing(fs, columns)
    except FSError as exc:
        assert "\n" not in str(exc)
        return 1
    if "table.json" not in sizes:
        return 1
    fh = fs.open(fs.lookup(columns, "table.json").ino, os.O_RDONLY)
    described = json.loads(fs.read(fh, 0, sizes["table.json"]))
    fs.release(fh)
    failures = sum("error" in c for c in described["columns"].values())
    for name, size in sizes.items():
        try:
            fh = fs.open(fs.lookup(columns, name).ino, os.O_RDONLY)
            try:
                for at in range(0, size, 1 << 20):
                    fs.read(fh, at, 1 << 20)
            finally:
                fs.release(fh)
        except FSError as exc:
            assert "\n" not in str(exc), exc
            failures += 1
    return failures


@pytest.mark.parametrize("manager,what", [("StandardStMan", "fixed"),
                                          ("StandardStMan", "var"),
                                          ("IncrementalStMan", "fixed"),
                                          ("StManAipsIO", "var"),
                                          ("TiledShapeStMan", "var"),
                                          ("TiledColumnStMan", "fixed"),
                                          ("TiledShapeStMan", "coordinates")])
def test_hostile_table_files_through_the_columns_view(made, manager, what):  # noqa: F811
    """Bytes of the storage managers' files (headers, bucket indexes, tile counts, string
    lengths and references, hypercube shapes, array shapes) overwritten, then columns/
    listed and read through the VFS: values, EIO or a one-line refusal for the file
    touched, never another exception, within 4 GiB of address space. (The coordinate
    columns' hypercube value records too: the table has one column casacore cannot read
    either, refused when intact.)"""
    path = made(what, manager)
    files = [f for f in sorted(os.listdir(path)) if f.startswith("table.f") and
             "_TSM" not in f]
    intact = _everything_through_the_vfs(path)
    assert intact == (1 if what == "coordinates" else 0)
    failed = 0
    for _ in mutated(path, files, np.random.default_rng(11), (4, 2),
                     (b"\xff\xff\xff\x7f", b"\x00\x00\x00\x00")):
        failed += _everything_through_the_vfs(path) - intact
    assert failed > 0  # some mutations hit a checked field
    assert _everything_through_the_vfs(path) == intact


def test_a_tile_file_cut_short_while_shown(made):  # noqa: F811
    """The tiles' file of DATA cut to half its size after the view opened it (reads of a
    local table go into buffers, no size asked first): EIO for the rows past the cut, a
    one-line reason, and the rows before it still read as getcol gives them."""
    import casacore.tables as ct

    from ctdsfs.formats.casacore.base import TableDirectory
    from ctdsfs.formats.casacore.columns import open_table

    path = made("ms", "2000")
    with ct.table(str(path), ack=False) as ref:
        expected = ref.getcol("DATA", 0, 64)
    fs, columns = columns_fs(path)
    fh = fs.open(fs.lookup(columns, "DATA.npy").ino, os.O_RDONLY)
    size = fs.getattr(fs.lookup(columns, "DATA.npy").ino).size
    row, head = expected[0].nbytes, size - 2000 * expected[0].nbytes
    (tiles,) = open_table(TableDirectory(path)).manager_files("DATA")
    os.truncate(os.path.join(path, tiles), os.path.getsize(os.path.join(path, tiles)) // 2)
    with pytest.raises(FSError) as failed:
        fs.read(fh, head + 1900 * row, 50 * row)
    assert failed.value.errno == errno.EIO and "\n" not in str(failed.value)
    first = np.frombuffer(fs.read(fh, head, 64 * row), expected.dtype).reshape(expected.shape)
    np.testing.assert_array_equal(first, expected)
    fs.release(fh)
