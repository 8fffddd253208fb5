"""Hostile table files through ``columns/`` itself (the view and the VFS over it): a column
that does not decode costs its own files only, each bad case ends in EIO for one file or
a one-line refusal, with bounded memory and no traceback."""

import json
import os

import pytest

from ctdsfs.formats.casacore_base import DirectorySource
from ctdsfs.formats.casacore_columns import open_table
from ctdsfs.vfs import ROOT_INO, ContainerFS
from ctdsfs.vfs.columns import with_columns
from ctdsfs.vfs.directory import directory_or_table
from ctdsfs.vfs.filesystem import FSError

from .test_columns import _patch, made  # noqa: F401  (the module's table fixture)


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
    table = open_table(DirectorySource(path))
    ssm = table._reader(0)
    offset, group = ssm.place["s_string"]
    bucket = int(ssm.indexes[group].bucket[0])
    row = next(i for i, s in enumerate(table.read_column("s_string").tolist())
               if len(s.encode()) > 8)
    _patch(path, "table.f0", 512 + bucket * ssm.bucket_size + offset + 12 * row + 8,
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
