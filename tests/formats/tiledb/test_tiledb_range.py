"""dense/ and sparse/ against tiledb-py over a range of arrays made here: dimensions of
integer, unsigned, float and datetime types, both tile and cell orders, several
overlapping fragments, duplicates allowed or not, a partial consolidation (read
through it with time travel too), var-sized and nullable attributes."""

import io

import numpy as np
import pytest
import tiledb

from ctdsfs.formats.tiledb.array import open_file

CONSOLIDATE_1_2 = {"sm.consolidation.timestamp_start": 1, "sm.consolidation.timestamp_end": 2,
                   "sm.consolidation.buffer_size": 100000}
SPARSE = {
    "float64 and datetime64[ns], row/col": (
        [("f", (-10.0, 10.0), 2.5, np.float64),
         ("t", (np.datetime64(0, "ns"), np.datetime64(10**12, "ns")), 10**11,
          "datetime64[ns]")], "row-major", "col-major", False),
    "int8, uint16 and float32, col/row": (
        [("i", (-100, 100), 16, np.int8), ("u", (0, 60000), 5000, np.uint16),
         ("g", (0.0, 1.0), 0.25, np.float32)], "col-major", "row-major", False),
    "int64 with duplicates": (
        [("x", (-(10**9), 10**9), 10**7, np.int64)], "row-major", "row-major", True),
}


def load(view, name):
    return np.load(io.BytesIO(bytes(view.read(name, 0, 1 << 30))))


def var_cells(view, name):
    offsets = load(view, f"{name}.offsets.npy")
    data = bytes(view.read(f"{name}.data", 0, 1 << 30))
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def coords_for(rng, dims, n):
    coords = []
    for _, (low, high), _, dtype in dims:
        if np.issubdtype(np.dtype(dtype), np.floating):
            coords.append(np.round(rng.uniform(low, high, n), 1).astype(dtype))
        elif np.issubdtype(np.dtype(dtype), np.datetime64):
            coords.append((rng.integers(0, 20, n) * 5 * 10**10).astype(dtype))
        else:
            coords.append(rng.integers(int(low), int(high) + 1, n).astype(dtype))
    return coords


def unique_cells(coords):
    stacked = np.stack([c.astype(np.float64) for c in coords])
    firsts = np.sort(np.unique(stacked, axis=1, return_index=True)[1])
    return [c[firsts] for c in coords]


def attributes(nullable_strings=True):
    """(tiledb-py 0.36 cannot write a nullable var-sized attribute of a 2-D dense array.)"""
    return [tiledb.Attr("v", dtype=np.float64),
            tiledb.Attr("n", dtype=np.int32, nullable=True),
            tiledb.Attr("s", dtype=str, var=True, nullable=nullable_strings)]


def values(rng, t, n, null_strings=True):
    """tiledb-py writes no None into a dense array's strings: there, every fifth one is
    empty instead."""
    return {"v": rng.random(n) + t,
            "n": np.ma.masked_array(np.arange(n, dtype=np.int32) + 100 * t,
                                    mask=rng.random(n) < 0.3),
            "s": np.array([(None if null_strings else "") if k % 5 == 0
                           else f"{t}-{k}" * (k % 3) for k in range(n)], dtype=object)}


def assert_same_sparse(uri, ts, dims, dups):
    view = open_file(uri, timestamp=None if ts is None else (0, ts)).nested("sparse")
    with tiledb.open(uri, timestamp=ts) as A:
        ref = A.query(order="G")[:]
    names = [d[0] for d in dims]
    for name in names:
        assert np.array_equal(load(view, f"{name}.npy"), ref[name]), (ts, name)
    if dups:  # (libtiledb's order among equal coordinates is its own)
        return
    assert np.array_equal(load(view, "v.npy"), ref["v"]), ts
    valid = load(view, "n.validity.npy") == 1
    assert np.array_equal(valid, ~np.ma.getmaskarray(ref["n"])), ts
    assert np.array_equal(load(view, "n.npy")[valid], np.ma.compressed(ref["n"])), ts
    want = [None if m else w.encode() for w, m in zip(np.ma.getdata(ref["s"]),
                                                       np.ma.getmaskarray(ref["s"]))]
    got = [g if v else None for g, v in zip(var_cells(view, "s"),
                                            load(view, "s.validity.npy"))]
    assert got == want, ts


@pytest.mark.parametrize("kind", list(SPARSE))
def test_sparse_range(tmp_path, kind):
    dims, tile_order, cell_order, dups = SPARSE[kind]
    uri = str(tmp_path / "s")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(*[tiledb.Dim(name, domain=domain, tile=tile, dtype=dtype)
                               for name, domain, tile, dtype in dims]),
        sparse=True, tile_order=tile_order, cell_order=cell_order, capacity=6,
        allows_duplicates=dups, attrs=attributes()))
    rng = np.random.default_rng(7)
    earlier = None
    for t in (1, 2, 3, 4):
        coords = coords_for(rng, dims, 30)
        if earlier is not None:  # (a third of them again: overlapping writes)
            coords = [np.concatenate([c[:20], e[:10]]) for c, e in zip(coords, earlier)]
        coords = coords if dups else unique_cells(coords)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[tuple(coords)] = values(rng, t, len(coords[0]))
        earlier = coords
        if t == 3:
            tiledb.consolidate(uri, config=tiledb.Config(CONSOLIDATE_1_2))
    for ts in (1, 2, 3, None):
        assert_same_sparse(uri, ts, dims, dups)


@pytest.mark.parametrize("orders", [("row-major", "col-major"), ("col-major", "row-major")])
def test_dense_range(tmp_path, orders):
    uri = str(tmp_path / "d")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("r", domain=(0, 15), tile=4, dtype=np.int16),
                             tiledb.Dim("c", domain=(1, 9), tile=3, dtype=np.int16)),
        tile_order=orders[0], cell_order=orders[1], attrs=attributes(False)))
    rng = np.random.default_rng(8)
    for t, (rows, cols) in enumerate([((0, 8), (1, 9)), ((5, 15), (3, 7)), ((3, 6), (2, 2)),
                                      ((2, 13), (5, 9))], 1):
        shape = (rows[1] - rows[0] + 1, cols[1] - cols[0] + 1)
        cells = values(rng, t, shape[0] * shape[1], null_strings=False)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[rows[0]:rows[1] + 1, cols[0]:cols[1] + 1] = {
                k: v.reshape(shape) for k, v in cells.items()}
        if t == 3:
            tiledb.consolidate(uri, config=tiledb.Config(CONSOLIDATE_1_2))
    for ts in (1, 2, 3, None):
        view = open_file(uri, timestamp=None if ts is None else (0, ts)).nested("dense")
        with tiledb.open(uri, timestamp=ts) as A:
            ref = A[:]
        assert np.array_equal(load(view, "v.npy"), ref["v"], equal_nan=True), ts
        valid = load(view, "n.validity.npy") == 1
        assert np.array_equal(valid, ~np.ma.getmaskarray(ref["n"])), ts
        assert np.array_equal(load(view, "n.npy")[valid], np.ma.compressed(ref["n"])), ts
        s = ref["s"].ravel()
        want = [None if m else w.encode() for w, m in zip(np.ma.getdata(s),
                                                           np.ma.getmaskarray(s))]
        # (an unwritten cell holds the fill value, one NUL byte as libtiledb gives it;
        # tiledb-py's conversion to str drops trailing NULs)
        assert [c.rstrip(b"\0") for c in var_cells(view, "s")] == want, ts
        assert var_cells(view, "s")[-1] == b"\0"
