"""Field types as tiledb-py gives them (datetimes and times with their unit, complex,
bool, fixed strings), in fragments/, dense/ and sparse/ alike; metadata as ``A.meta`` shows it."""

import io
import json

import numpy as np
import pytest
import tiledb

from ctdsfs.formats import open_container

TYPED = {  # attribute -> values of the dtype tiledb-py gives back
    "ms": np.arange(20).astype("datetime64[ms]") + 1_700_000_000_000,
    "day": np.arange(20).astype("datetime64[D]"),
    "year": np.arange(20).astype("datetime64[Y]"),
    "ns": (np.arange(20) * 7).astype("timedelta64[ns]"),
    "hr": np.arange(20).astype("timedelta64[h]"),
    "c64": (np.arange(20) * (1 + 2j)).astype(np.complex64),
    "c128": (np.arange(20) * (3 - 1j)).astype(np.complex128),
    "flag": np.arange(20) % 3 == 0,
    "s3": np.array([b"abc", b"de", b"fgh!"[:3]] * 6 + [b"x", b""], dtype="S3"),
}


def load(container, name):
    return np.load(io.BytesIO(bytes(container.read(name, 0, 1 << 30))))


def write_typed(uri, sparse):
    """Every typed attribute; a sparse array's dimension is a DATETIME_MS too."""
    if sparse:
        dim = tiledb.Dim("t", domain=(np.datetime64(0, "ms"), np.datetime64(10_000, "ms")),
                         tile=np.timedelta64(100, "ms"), dtype="datetime64[ms]")
    else:
        dim = tiledb.Dim("x", domain=(0, 19), tile=10, dtype=np.int64)
    attrs = [tiledb.Attr(name, dtype=values.dtype) for name, values in TYPED.items()]
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=tiledb.Domain(dim), sparse=sparse,
                                                attrs=attrs))
    with tiledb.open(uri, "w") as A:
        if sparse:
            A[(np.arange(20) * 3).astype("datetime64[ms]")] = TYPED
        else:
            A[:] = TYPED


@pytest.mark.parametrize("sparse", [False, True])
def test_types_equal_tiledb_py(tmp_path, sparse):
    uri = str(tmp_path / "a")
    write_typed(uri, sparse)
    array = open_container(uri)
    fragments = array.nested("fragments")
    frag = fragments.nested(fragments.names()[0])
    with tiledb.open(uri) as A:
        ref = A[:] if not sparse else A.query(order="G")[:]
    views = [frag, array.nested("sparse" if sparse else "dense")]
    for view in views:
        for name in TYPED:
            got = load(view, f"{name}.npy")
            assert got.dtype == ref[name].dtype, (name, got.dtype, ref[name].dtype)
            assert np.array_equal(got, ref[name]), name
    if sparse:
        for view in views:
            got = load(view, "t.npy")
            assert got.dtype == np.dtype("datetime64[ms]") and np.array_equal(got, ref["t"])


def test_metadata_has_exactly_the_keys_and_values_of_a_meta(tmp_path):
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=5, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom,
                                                attrs=[tiledb.Attr("a", dtype=np.int32)]))
    with tiledb.open(uri, "w") as A:
        A.meta.update({"text": "words", "i": 3, "f": 2.5, "flag": True, "tuple": (1, 2, 3),
                       "matrix": np.arange(6, dtype=np.int16).reshape(2, 3),
                       "cube": np.arange(8.0).reshape(2, 2, 2), "vector": np.array([1.5, 2.5]),
                       "bools": np.array([True, False, True]), "one": np.array([7]),
                       "empty": ""})
    with tiledb.open(uri, "w") as A:
        del A.meta["i"]
    meta = json.loads(open_container(uri).read("metadata.json", 0, 1 << 20))
    with tiledb.open(uri) as A:
        want = {k: v.tolist() if isinstance(v, np.ndarray) else
                list(v) if isinstance(v, tuple) else v for k, v in A.meta.items()}
    assert {k: v["value"] for k, v in meta.items()} == want
    assert meta["bools"]["value"] == [True, False, True]  # (not 1, 0, 1)


def test_group_metadata_and_members(tmp_path, mount):
    """A group shows its own metadata (as ``Group.meta`` gives it) beside its members: an
    array as an array, a nested group as a group."""
    uri = tmp_path / "g"
    tiledb.Group.create(str(uri))
    tiledb.Group.create(str(uri / "inner"))
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=5, dtype=np.int64))
    tiledb.Array.create(str(uri / "arr"), tiledb.ArraySchema(
        domain=dom, attrs=[tiledb.Attr("a", dtype=np.int32)]))
    with tiledb.open(str(uri / "arr"), "w") as A:
        A[:] = np.arange(10, dtype=np.int32)
    with tiledb.Group(str(uri), "w") as g:
        g.meta["title"] = "a group"
        g.meta["sizes"] = np.arange(6).reshape(2, 3)
        g.add("arr", relative=True)
        g.add("inner", relative=True)
    with tiledb.Group(str(uri / "inner"), "w") as g:
        g.meta["depth"] = 2
    group = open_container(str(uri))
    assert group.names() == ["metadata.json", "arr", "inner"]
    with tiledb.Group(str(uri)) as g:
        want = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in g.meta.items()}
    meta = json.loads(group.read("metadata.json", 0, 1 << 20))
    assert {k: v["value"] for k, v in meta.items()} == want
    inner = json.loads(group.nested("inner").read("metadata.json", 0, 1 << 20))
    assert inner == {"depth": {"type": "INT64", "value": 2}}
    m = mount(uri)
    assert np.array_equal(np.load(m.mountpoint / "arr" / "dense" / "a.npy"), np.arange(10))
