"""bcolz names and layouts a bcolz (or bloscpack) user writes (issue 24 items 8, 9, 10):
column names outside latin-1, a column named ``table``, the row count at a ctable's top,
and an array bloscpack's ``pack_ndarray_to_file`` stored."""

import io
import json
import os
import warnings

import bcolz
import numpy as np

from ctdsfs.formats import open_container

from .test_bcolz import bloscpack_file


def whole(container, name):
    return container.read(name, 0, container.entry_size(name))


def numpy_save_bytes(array):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (NumPy warns that it writes format 3.0)
        np.save(buffer, array)
    return buffer.getvalue()


def test_column_name_outside_latin1_lists_and_reads(tmp_path, mount):
    path = tmp_path / "greek"
    bcolz.ctable([np.arange(50.0), np.arange(50)], names=["δ", "n"], rootdir=str(path),
                 mode="w").flush()
    top = mount(path).mountpoint
    assert sorted(os.listdir(top)) == sorted(["attrs.json", "ctable.json", "n", "n.npy",
                                              "table.npy", "δ", "δ.npy"])
    expected = bcolz.open(str(path))[:]
    shown = (top / "table.npy").read_bytes()
    assert shown == numpy_save_bytes(expected)  # header as NumPy writes it (format 3.0)
    assert np.array_equal(np.load(top / "δ.npy"), np.arange(50.0))


def test_a_column_named_table_keeps_its_file_and_the_rows_move_aside(tmp_path):
    path = tmp_path / "t"
    bcolz.ctable([np.arange(20), np.arange(20.0) / 2], names=["table", "x"],
                 rootdir=str(path), mode="w").flush()
    c = open_container(path)
    assert np.array_equal(np.load(io.BytesIO(whole(c, "table.npy"))), np.arange(20))
    rows = np.load(io.BytesIO(whole(c, "table_.npy")))
    assert np.array_equal(rows, bcolz.open(str(path))[:])
    summary = json.loads(whole(c, "ctable.json"))
    assert summary["rows"] == 20 == len(bcolz.open(str(path)))
    assert summary["table"] == "table_.npy"
    assert [col["name"] for col in summary["columns"]] == ["table", "x"]
    assert c.problems == []


def test_row_count_follows_bcolz_appends(tmp_path):
    path = tmp_path / "grow"
    table = bcolz.ctable([np.arange(10)], names=["a"], rootdir=str(path), mode="w")
    table.flush()
    c = open_container(path)
    assert json.loads(whole(c, "ctable.json"))["rows"] == 10
    table = bcolz.open(str(path), mode="a")
    table.append([np.arange(5)])
    table.flush()
    c.reload_if_changed()
    assert json.loads(whole(c, "ctable.json"))["rows"] == 15


def ndarray_metadata(array, dtype_text=None):
    """The metadata ``pack_ndarray_to_file`` stores (bloscpack numpy_io: the dtype as the
    repr of ``dtype.str``, or of ``dtype.descr`` for a record; shape; order; container)."""
    if dtype_text is None:
        dtype_text = repr(array.dtype.descr) if array.dtype.names else repr(array.dtype.str)
    return {"dtype": dtype_text, "shape": list(array.shape),
            "order": "F" if np.isfortran(array) else "C", "container": "numpy"}


def test_an_array_packed_by_bloscpack_shows_a_npy(tmp_path):
    cases = {
        "plain": np.arange(3000.0).reshape(1000, 3),
        "fortran": np.asfortranarray(np.arange(600.0).reshape(20, 30)),
        "record": np.array([(i, i / 2) for i in range(500)], dtype=[("a", "<i8"), ("b", "<f8")]),
    }
    for name, array in cases.items():
        memory = array.tobytes(order="A")
        path = bloscpack_file(tmp_path / f"{name}.blp", memory, chunk_size=4096,
                              checksum=1, metadata=ndarray_metadata(array))
        c = open_container(path)
        shown = np.load(io.BytesIO(whole(c, "data.npy")))
        assert np.array_equal(shown, array) and shown.dtype == array.dtype, name
        assert np.isfortran(shown) == np.isfortran(array), name
        assert whole(c, "data") == memory
    old = bloscpack_file(tmp_path / "old.blp", np.arange(10.0).tobytes(), chunk_size=32,
                         metadata=ndarray_metadata(np.arange(10.0), "<f8"))  # (before 0.7.2)
    assert np.array_equal(np.load(io.BytesIO(whole(open_container(old), "data.npy"))),
                          np.arange(10.0))
    lying = bloscpack_file(tmp_path / "lying.blp", np.arange(10.0).tobytes(), chunk_size=32,
                           metadata={**ndarray_metadata(np.arange(10.0)), "shape": [11]})
    c = open_container(lying)
    assert "data.npy" not in c.names() and "data" in c.names()
    assert any("no data.npy" in p for p in c.problems)
