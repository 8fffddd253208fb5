"""TileDB arrays that changed after they were written: commits consolidated and vacuumed,
schemas evolved (attributes added and dropped), enumerations. Each view is compared with
what tiledb-py reads of an array it wrote here."""

import io
import json

import numpy as np
import tiledb

from ctdsfs.formats import open_container

from .tiledb_arrays import fragment_read


def load(container, name):
    return np.load(io.BytesIO(bytes(container.read(name, 0, 1 << 30))), allow_pickle=False)


def test_consolidated_and_vacuumed_commits_list_every_fragment(tmp_path):
    """Commits consolidated into one ``.con`` (lines ``__commits/NAME.wrt``) and the
    ``.wrt`` files vacuumed: every fragment is still listed, with libtiledb's cells."""
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9999), tile=100, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    for t in range(4):
        with tiledb.open(uri, "w", timestamp=t + 1) as A:
            A[np.arange(t * 600, (t + 1) * 600)] = {"a": np.arange(600) + t * 1000}
    config = tiledb.Config({"sm.consolidation.mode": "commits",
                            "sm.vacuum.mode": "commits"})
    tiledb.consolidate(uri, config=config)
    tiledb.vacuum(uri, config=config)
    commits = sorted((tmp_path / "a" / "__commits").iterdir())
    assert [c.suffix for c in commits] == [".con"]  # (what this test is about)
    fragments = open_container(uri).nested("fragments")
    names = fragments.names()
    assert len(names) == 4
    cells = 0
    for name in names:
        frag = fragments.nested(name)
        meta = json.loads(frag.read("fragment.json", 0, 1 << 20))
        ref = fragment_read(uri, name, meta["non_empty_domain"])
        assert np.array_equal(load(frag, "a.npy"), ref["a"])
        assert np.array_equal(load(frag, "x.npy"), ref["x"])
        cells += len(ref["a"])
    with tiledb.open(uri) as A:
        assert cells == len(A[:]["a"]) == 2400


def test_dense_view_after_schema_evolution_equals_libtiledb(tmp_path):
    """Dense a, b; all written; c added (fill 7); A[5:12] written with c = 0..6; b dropped;
    A[20:25] written: dense/a.npy and dense/c.npy equal ``A[:]``."""
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 29), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, attrs=[tiledb.Attr("a", dtype=np.int32), tiledb.Attr("b", dtype=np.float64)]))
    with tiledb.open(uri, "w", timestamp=1) as A:
        A[:] = {"a": np.arange(30, dtype=np.int32), "b": np.arange(30) / 2}
    evolution = tiledb.ArraySchemaEvolution()
    evolution.add_attribute(tiledb.Attr("c", dtype=np.int64, fill=7))
    evolution.array_evolve(uri)
    with tiledb.open(uri, "w", timestamp=3) as A:
        A[5:12] = {"a": np.full(7, -1, np.int32), "b": np.zeros(7),
                   "c": np.arange(7, dtype=np.int64)}
    evolution = tiledb.ArraySchemaEvolution()
    evolution.drop_attribute("b")
    evolution.array_evolve(uri)
    with tiledb.open(uri, "w", timestamp=5) as A:
        A[20:25] = {"a": np.full(5, -2, np.int32), "c": np.full(5, 100, np.int64)}
    dense = open_container(uri).nested("dense")
    assert sorted(dense.names()) == ["a.npy", "c.npy"]
    with tiledb.open(uri) as A:
        ref = A[:]
    assert np.array_equal(load(dense, "c.npy"), ref["c"])
    assert np.array_equal(load(dense, "a.npy"), ref["a"])
    assert load(dense, "c.npy")[5:12].tolist() == list(range(7))  # (not the fill, 7)


def test_enumerations_are_listed_with_their_labels(tmp_path):
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=10, dtype=np.int64))
    enums = [tiledb.Enumeration("colors", True, ["red", "green", "", "blue"]),
             tiledb.Enumeration("sizes", False, np.array([10, 20, 30], dtype=np.int32)),
             tiledb.Enumeration("ascii", False, np.array([b"lo", b"hi"], dtype="S"))]
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, enums=enums,
        attrs=[tiledb.Attr("c", dtype=np.uint8, enum_label="colors"),
               tiledb.Attr("s", dtype=np.int8, enum_label="sizes"),
               tiledb.Attr("h", dtype=np.int16, enum_label="ascii"),
               tiledb.Attr("plain", dtype=np.int32)]))
    schema = json.loads(open_container(uri).read("schema.json", 0, 1 << 20))
    shown = {e["name"]: e for e in schema["enumerations"]}
    with tiledb.open(uri) as A:
        assert set(shown) == {"colors", "sizes", "ascii"}
        for name, enum in shown.items():
            want = A.enum(name)
            values = [v.decode() if isinstance(v, bytes) else v for v in want.values().tolist()]
            assert enum["values"] == values, name
            assert enum["ordered"] == want.ordered
        labels = {a["name"]: a.get("enumeration") for a in schema["attributes"]}
        assert labels == {a.name: a.enum_label for a in A.schema}
