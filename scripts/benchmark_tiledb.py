"""The benchmark's optional "tiledb" part: a zstd float64 attribute read through FIELD.npy
and by tiledb-py, and the listing of an array of many fragments."""

import os
import time

import numpy as np

from benchmark_common import Mounted, drop_caches, read_through


def tiledb_figures(tmp, mib, fragment_count=1000):
    """A zstd-compressed float64 attribute read as FIELD.npy through a mount, against
    tiledb-py reading the same fragment into NumPy (caches dropped before each, best of 3
    alternating); and listing fragments/ of an array with ``fragment_count`` fragments."""
    import tiledb

    cells = (mib << 20) // 8
    tile = 1 << 20
    uri = str(tmp / "big_tiledb")
    print(f"writing a {mib} MiB zstd float64 TileDB attribute ...", flush=True)
    schema = tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, cells - 1), tile=tile, dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=np.float64, filters=tiledb.FilterList(
            [tiledb.ZstdFilter(level=1)]))])
    tiledb.Array.create(uri, schema)
    with tiledb.open(uri, "w") as A:  # one write: one fragment, the array tiledb-py reads
        x = np.arange(cells, dtype=np.float64)
        A[:] = np.round(np.sin(x * 1e-4) * 1000 + (x % 17), 3)
        del x
    fragment, = os.listdir(os.path.join(uri, "__fragments"))
    npy = tmp / "mt" / "fragments" / fragment / "v.npy"
    native, mounted = [], []
    for _ in range(3):
        drop_caches()
        start = time.perf_counter()
        with tiledb.open(uri) as A:
            values = A[:]["v"]
        native.append(values.nbytes / (time.perf_counter() - start) / 1e9)
        del values
        with Mounted(["mount.ctdsfs", "-f", uri, str(tmp / "mt")], str(tmp / "mt")):
            drop_caches()
            mounted.append(read_through(npy))
    rows = [("tiledb-py reads the attribute into NumPy, cold (best)", max(native), None, None),
            ("ctdsfs FIELD.npy first read, cold (best, vs tiledb-py)", max(mounted),
             max(native), 0.7)]

    print(f"writing an array of {fragment_count} fragments ...", flush=True)
    many = str(tmp / "many_tiledb")
    tiledb.Array.create(many, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, 999), tile=10, dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=np.int32)], sparse=True))
    for t in range(1, fragment_count + 1):
        with tiledb.open(many, "w", timestamp=t) as A:
            A[np.array([t % 1000])] = np.array([t], dtype=np.int32)
    with Mounted(["mount.ctdsfs", "-f", many, str(tmp / "mf")], str(tmp / "mf")):
        drop_caches()
        start = time.perf_counter()
        listed = [os.lstat(entry.path) for entry in os.scandir(tmp / "mf" / "fragments")]
        list_seconds = time.perf_counter() - start
    return rows, [f"listing fragments/ of an array of {len(listed)} fragments (ls -l, cache "
                  f"dropped): {list_seconds:.2f} s (target < 1 s)"]

