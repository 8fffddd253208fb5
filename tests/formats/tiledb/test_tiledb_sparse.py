"""sparse/: every cell of a sparse array as ``A.query(order='G')[:]`` reads it, compared
with tiledb-py on arrays it writes here (several fragments, overlapping writes,
duplicates, var-sized and nullable fields, consolidation, evolved schemas)."""

import io

import numpy as np
import pytest
import tiledb

from ctdsfs.formats import open_container


def load(container, name):
    return np.load(io.BytesIO(bytes(container.read(name, 0, 1 << 30))))


def var_cells(view, name):
    offsets = load(view, f"{name}.offsets.npy")
    data = bytes(view.read(f"{name}.data", 0, 1 << 30))
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def assert_sparse_equal(uri, exact=True):
    view = open_container(uri).nested("sparse")
    with tiledb.open(uri) as A:
        ref = A.query(order="G")[:]
        schema = A.schema
    fixed = [d.name for d in schema.domain] + [a.name for a in schema if not a.isvar]
    if exact:
        for name in fixed:
            got = load(view, f"{name}.npy")
            assert got.dtype == ref[name].dtype and np.array_equal(got, ref[name]), name
        for a in schema:
            if a.isvar:
                want = [v.encode() if isinstance(v, str) else bytes(v) for v in ref[a.name]]
                assert var_cells(view, a.name) == want, a.name
            if a.isnullable:
                valid = ~np.ma.getmaskarray(ref[a.name]) if np.ma.isMaskedArray(ref[a.name]) \
                    else None
                if valid is not None:
                    assert np.array_equal(load(view, f"{a.name}.validity.npy") == 1, valid)
    else:  # duplicates: libtiledb's order among equal coordinates is its own
        rows = sorted(zip(*(load(view, f"{n}.npy").tolist() for n in fixed)))
        assert rows == sorted(zip(*(ref[n].tolist() for n in fixed)))
    return view


@pytest.mark.parametrize("orders", [("row-major", "row-major"), ("col-major", "row-major"),
                                    ("row-major", "col-major")])
def test_overlapping_writes_newest_wins(tmp_path, orders):
    uri = str(tmp_path / "a")
    tile_order, cell_order = orders
    dom = tiledb.Domain(tiledb.Dim("r", domain=(0, 99), tile=10, dtype=np.int64),
                        tiledb.Dim("c", domain=(-50, 49), tile=7, dtype=np.int32))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, tile_order=tile_order, cell_order=cell_order, capacity=16,
        attrs=[tiledb.Attr("v", dtype=np.float64),
               tiledb.Attr("s", dtype=str, var=True),
               tiledb.Attr("m", dtype=np.int16, nullable=True)]))
    rng = np.random.default_rng(5)
    for t in range(1, 5):
        n = 120
        cells = rng.choice(10_000, n, replace=False)  # (unique within one write)
        r, c = cells // 100, (cells % 100 - 50).astype(np.int32)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[r, c] = {"v": rng.random(n) + t, "s": np.array([f"t{t}-{i}" for i in range(n)],
                                                             dtype=object),
                       "m": np.ma.masked_array(np.arange(n, dtype=np.int16),
                                               mask=np.arange(n) % 5 == 0)}
    assert_sparse_equal(uri)


def test_duplicates_kept_where_allowed(tmp_path):
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 999), tile=50, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True, allows_duplicates=True,
                                                attrs=[tiledb.Attr("a", dtype=np.int32)]))
    for t in (1, 2):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[np.arange(0, 300, 3)] = {"a": np.arange(100, dtype=np.int32) * t}
    view = assert_sparse_equal(uri, exact=False)
    assert len(load(view, "x.npy")) == 200


def test_consolidated_and_evolved(tmp_path):
    """Fragments consolidated (with per-cell timestamps), an attribute added later:
    older cells give its fill."""
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 999), tile=100, dtype=np.uint64))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True,
                                                attrs=[tiledb.Attr("a", dtype=np.int64)]))
    for t in (1, 2, 3):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[np.arange(t * 10, t * 10 + 200, dtype=np.uint64)] = {"a": np.full(200, t)}
    tiledb.consolidate(uri)
    evolution = tiledb.ArraySchemaEvolution()
    evolution.add_attribute(tiledb.Attr("b", dtype=np.float32, fill=-1.5))
    evolution.array_evolve(uri)
    with tiledb.open(uri, "w", timestamp=9) as A:
        A[np.arange(100, 110, dtype=np.uint64)] = {"a": np.zeros(10, np.int64),
                                                   "b": np.ones(10, np.float32)}
    assert_sparse_equal(uri)


def test_string_dimension(tmp_path):
    uri = str(tmp_path / "a")
    dom = tiledb.Domain(tiledb.Dim("k", dtype="ascii"))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True,
                                                attrs=[tiledb.Attr("a", dtype=np.int32)]))
    for t, words in ((1, ["pear", "apple", "fig"]), (2, ["apple", "kiwi", ""])):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[np.array(words, dtype="S")] = {"a": np.arange(3, dtype=np.int32) + 10 * t}
    view = open_container(uri).nested("sparse")
    with tiledb.open(uri) as A:
        ref = A.query(order="G")[:]
    assert var_cells(view, "k") == list(ref["k"])
    assert np.array_equal(load(view, "a.npy"), ref["a"])

