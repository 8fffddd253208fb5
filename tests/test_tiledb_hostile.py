"""Hostile TileDB arrays: links inside the array, decompression bombs, hostile filter
pipelines, encryption. Each gives a one-line refusal, a problem, or EIO for one tile:
never a byte from outside the array, a traceback or unbounded memory."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tiledb

from ctdsfs.errors import CtdsfsError
from ctdsfs.formats import open_container

OUTSIDE_VALUE = 424242  # every cell of the outside array; never seen through the inside one
INSIDE_VALUE = 7


def write_sparse(uri, value, key):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 99), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    with tiledb.open(uri, "w") as A:
        A[np.arange(5)] = {"a": np.full(5, value, np.int64)}
        A.meta[key] = value


def write_dense(uri, value, key):
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 19), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=False, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    with tiledb.open(uri, "w") as A:
        A[0:20] = np.full(20, value, np.int64)
        A.meta[key] = value


def ctdsfs(*args):
    return subprocess.run(["ctdsfs", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def fragment_names(uri):
    return sorted(os.listdir(uri / "__fragments"))


def relink(inside, outside, folder):
    """Replace ``inside/folder`` by a link to ``outside/folder``."""
    shutil.rmtree(inside / folder)
    (inside / folder).symlink_to(outside / folder)


def outside_pair(tmp_path, writer):
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    writer(str(inside), INSIDE_VALUE, "inside_key")
    writer(str(outside), OUTSIDE_VALUE, "outside_key")
    return inside, outside


def assert_nothing_outside(array_path, tmp_path, mount):
    """Neither the library view, ``ctdsfs info`` nor a mount shows an outside byte."""
    outside_names = fragment_names(tmp_path / "outside")
    array = open_container(str(array_path))
    shown = array.nested("fragments").names()
    assert not set(shown) & set(outside_names)
    done = ctdsfs("info", "--json", array_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert not {f["name"] for f in info["fragments"]} & set(outside_names)
    assert "outside_key" not in info["metadata"]
    assert any("link" in p for p in info["problems"]), info["problems"]
    m = mount(array_path)
    for root, _, files in os.walk(m.mountpoint):
        for name in files:
            data = (m.mountpoint / root / name).read_bytes()
            assert b"outside_key" not in data, name
            if name.endswith(".npy"):
                assert OUTSIDE_VALUE not in np.load(m.mountpoint / root / name).ravel(), name
    return info


@pytest.mark.parametrize("writer", [write_sparse, write_dense])
def test_linked_fragments_folder_is_never_followed(tmp_path, mount, writer):
    """``__fragments`` a link to another array's, with its commits copied in: no
    fragment of the other array is listed, decoded or merged into dense/."""
    inside, outside = outside_pair(tmp_path, writer)
    relink(inside, outside, "__fragments")
    for commit in os.listdir(outside / "__commits"):
        shutil.copy(outside / "__commits" / commit, inside / "__commits" / commit)
    info = assert_nothing_outside(inside, tmp_path, mount)
    assert info["fragments"] == []


def test_linked_fragment_folder_is_never_followed(tmp_path, mount):
    inside, outside = outside_pair(tmp_path, write_sparse)
    name = fragment_names(outside)[0]
    (inside / "__fragments" / name).symlink_to(outside / "__fragments" / name)
    shutil.copy(outside / "__commits" / f"{name}.wrt", inside / "__commits")
    info = assert_nothing_outside(inside, tmp_path, mount)
    assert [f["name"] for f in info["fragments"]] == [
        n for n in fragment_names(inside) if n != name]


def test_linked_meta_and_commits_folders_are_never_followed(tmp_path, mount):
    inside, outside = outside_pair(tmp_path, write_sparse)
    for name in fragment_names(outside):
        shutil.copytree(outside / "__fragments" / name, inside / "__fragments" / name)
    relink(inside, outside, "__meta")
    relink(inside, outside, "__commits")
    info = assert_nothing_outside(inside, tmp_path, mount)
    assert info["metadata"] == {} and info["fragments"] == []
