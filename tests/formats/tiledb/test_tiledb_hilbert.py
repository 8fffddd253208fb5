"""sparse/ of Hilbert-ordered arrays (cell order 4): the cells in the order of their
Hilbert values, as ``A.query(order='G')[:]`` reads them, compared with tiledb-py on
arrays it writes here (int, float, unsigned and datetime dimensions, one to three of
them, several overlapping writes, duplicates allowed or not, a delete, time travel)."""

import io

import numpy as np
import pytest
import tiledb

from ctdsfs.formats.tiledb.array import open_file

DATETIME_DOMAIN = (np.datetime64(0, "ms"), np.datetime64(10**9, "ms"))
ARRAYS = {
    "int64 and int32": ([("x", (0, 999), 100, np.int64), ("y", (-50, 49), 10, np.int32)],
                        False),
    "float, float32 and uint8": ([("x", (-1.0, 1.0), 0.5, np.float64),
                                  ("y", (0.0, 10.0), 2.0, np.float32),
                                  ("z", (0, 7), 8, np.uint8)], True),
    "datetime": ([("t", DATETIME_DOMAIN, 10**6, "datetime64[ms]")], False),
}


def load(view, name):
    return np.load(io.BytesIO(bytes(view.read(name, 0, 1 << 30))))


def random_coords(rng, dims, n):
    coords = []
    for _, (low, high), _, dtype in dims:
        if np.issubdtype(np.dtype(dtype), np.floating):
            coords.append(rng.uniform(low, high, n).astype(dtype))
        elif np.issubdtype(np.dtype(dtype), np.datetime64):
            coords.append(rng.integers(0, 10**9, n).astype(dtype))
        else:
            coords.append(rng.integers(int(low), int(high) + 1, n).astype(dtype))
    return coords


@pytest.mark.parametrize("kind", list(ARRAYS))
def test_hilbert_order(tmp_path, kind):
    dims, dups = ARRAYS[kind]
    uri = str(tmp_path / "h")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(*[tiledb.Dim(name, domain=domain, tile=tile, dtype=dtype)
                               for name, domain, tile, dtype in dims]),
        sparse=True, cell_order="hilbert", capacity=7, allows_duplicates=dups,
        attrs=[tiledb.Attr("a", dtype=np.int64)]))
    rng = np.random.default_rng(3)
    first = random_coords(rng, dims, 40)
    writes = [first, random_coords(rng, dims, 40),
              [np.concatenate([c[:20], old[:20]])  # (half of the first write's again)
               for c, old in zip(random_coords(rng, dims, 20), first)]]
    for t, coords in enumerate(writes, 1):
        if not dups:
            stacked = np.stack([c.astype(np.float64) for c in coords])
            firsts = np.sort(np.unique(stacked, axis=1, return_index=True)[1])
            coords = [c[firsts] for c in coords]
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[tuple(coords)] = np.arange(len(coords[0])) + 100 * t
    with tiledb.open(uri, "d", timestamp=4) as A:
        A.query(cond="a < 110").submit()
    for ts in (2, None):
        array = open_file(uri, timestamp=None if ts is None else (0, ts))
        assert array.not_shown() == []
        view = array.nested("sparse")
        with tiledb.open(uri, timestamp=ts) as A:
            ref = A.query(order="G")[:]
        for name, *_ in dims:
            assert np.array_equal(load(view, f"{name}.npy"), ref[name]), (ts, name)
        if not dups:  # (with duplicates, libtiledb's order among equal cells is its own)
            assert np.array_equal(load(view, "a.npy"), ref["a"]), ts
