"""``columns/`` over the VFS without FUSE: the view follows a container another process
commits to (the table rewritten: more rows, other values)."""

import io
import os

import casacore.tables as ct
import numpy as np

from ctdsfs.formats import create_container, open_container
from ctdsfs.sources.columns import with_columns
from ctdsfs.vfs import ROOT_INO, ContainerFS


def small_table(path, values):
    desc = ct.maketabdesc([ct.makescacoldesc("X", 0.0)])
    with ct.table(str(path), desc, nrow=len(values), ack=False) as t:
        t.putcol("X", np.asarray(values, float))
    return {name: (path / name).read_bytes() for name in os.listdir(path)
            if (path / name).is_file()}


def store(container, files):
    for name, data in files.items():
        if not container.contains(name):
            container.create(name)
        container.truncate(name, 0)
        container.write(name, 0, data)
    container.commit()


def load(fs, ino):
    fh = fs.open(ino, os.O_RDONLY)
    try:
        return np.load(io.BytesIO(fs.read(fh, 0, 1 << 20)))
    finally:
        fs.release(fh)


def test_columns_view_is_made_anew_when_another_process_commits(tmp_path):
    first = small_table(tmp_path / "a", [1.0, 2.0, 3.0])
    second = small_table(tmp_path / "b", [5.0, 6.0, 7.0, 8.0, 9.0])
    path = tmp_path / "t.mf"
    writer = create_container(path, block_size=512)
    store(writer, first)
    fs = ContainerFS(with_columns(open_container(path)), path)
    columns = fs.lookup(ROOT_INO, "columns").ino
    np.testing.assert_array_equal(load(fs, fs.lookup(columns, "X.npy").ino), [1.0, 2.0, 3.0])
    store(writer, second)
    columns = fs.lookup(ROOT_INO, "columns").ino
    np.testing.assert_array_equal(load(fs, fs.lookup(columns, "X.npy").ino),
                                  [5.0, 6.0, 7.0, 8.0, 9.0])
    writer.close()


def test_a_stat_of_columns_decodes_nothing(tmp_path):
    """``columns/`` holds no directories, so its link count (2) is known without listing
    it: a reader's first lookup does not decode every column to name the files."""
    from ctdsfs.sources.directory import directory_or_table

    small_table(tmp_path / "t", [1.0, 2.0])
    container = with_columns(directory_or_table(str(tmp_path / "t"), source=True))
    fs = ContainerFS(container, str(tmp_path / "t"))
    assert fs.lookup(ROOT_INO, "columns").nlink == 2
    assert container.nested("columns")._built is None  # not listed
    assert fs.lookup(fs.lookup(ROOT_INO, "columns").ino, "X.npy").size > 0
    assert container.nested("columns")._built is None
    fs.close()
