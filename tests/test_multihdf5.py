"""MultiHDF5 (casacore's HDF5 container), read-only: casacore-written files through the mount."""

import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from ctdsfs.container import open_container
from ctdsfs.errors import CtdsfsError

from .conftest import DATA, pattern


def test_casacore_multihdf5_fixture():
    c = open_container(DATA / "mh5_basic.mfh5")
    assert c.names() == ["empty.bin", "data10000.bin", "hello.txt"]
    assert c.read("data10000.bin", 0, 20000) == pattern(10000, 7, 3)
    assert c.read("hello.txt", 0, 100) == b"hello"
    assert c.read("empty.bin", 0, 10) == b""
    assert c.read("data10000.bin", 4090, 12) == pattern(10000, 7, 3)[4090:4102]
    assert c.block_size == 4096 and c.problems == []


def test_table_fixture_files():
    c = open_container(DATA / "t_mh5.tab" / "table.mfh5")
    assert sorted(c.names()) == ["table.f0", "table.f0i"]


def test_writing_is_refused_clearly(tmp_path):
    with pytest.raises(CtdsfsError, match="MultiHDF5 containers mount read-only"):
        open_container(DATA / "mh5_basic.mfh5", writable=True)


def test_inconsistent_headers(tmp_path):
    path = tmp_path / "bad.mfh5"
    shutil.copy(DATA / "mh5_basic.mfh5", path)
    with h5py.File(path, "r+") as f:
        f["__MultiHDF5_Header__"].attrs["sizes"] = np.array([0, 10 ** 9, 5], np.int64)
    c = open_container(path)
    assert c.names() == ["empty.bin", "hello.txt"]
    assert "larger than its 4 rows" in c.problems[0]
    c.close()
    with h5py.File(path, "r+") as f:
        del f["__MultiHDF5_Header__"].attrs["blockSize"]
    with pytest.raises(CtdsfsError, match="not a casacore MultiHDF5"):
        open_container(path)


@pytest.mark.fuse
def test_mount_and_legacy_view(mount, tmp_path):
    m = mount(DATA / "mh5_basic.mfh5")
    for name in ("data10000.bin", "hello.txt", "empty.bin"):
        assert (m.mountpoint / name).read_bytes() == (DATA / "inputs" / name).read_bytes()
    src = tmp_path / "src"
    shutil.copytree(DATA / "t_mh5.tab", src / "t.tab")
    view = mount(src)
    assert "table.mfh5" not in os.listdir(view.mountpoint / "t.tab")
    out = subprocess.run(["taql", f"select A, S, D from {view.mountpoint / 't.tab'}"],
                         capture_output=True, text=True, check=True).stdout
    assert "10 selected rows" in out or "select result of 10 rows" in out
    for r in (0, 4, 9):
        assert f"{r}\t{r}\t" in out  # A and S columns: A=r, S=str(r)
