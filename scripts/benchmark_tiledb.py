"""The benchmark's optional "tiledb" part: a BYTESHUFFLE+ZSTD float64 dense array read
whole through dense/ATTR.npy and a fragment's ATTR.npy, beside tiledb-py's ``A[:]`` and
the pyfuse3 floor serving the decoded .npy from memory, and by random slices through ``numpy.load(mmap_mode="r")`` beside ``A[i:j]``; and the
listing of an array of many fragments."""

import os
import resource
import statistics
import time

import numpy as np

from benchmark_common import (
    Mounted,
    drop_caches,
    floor_of_files,
    process_cpu_seconds,
    seconds,
    slice_seconds,
)


def _own_cpu_seconds():
    """User plus system CPU seconds of this process (tiledb-py's threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def smooth_values(mib):
    """``mib`` MiB of float64 that compress as measured data do (a slow wave plus a ramp)."""
    x = np.arange((mib << 20) // 8, dtype=np.float64)
    return np.round(np.sin(x * 1e-4) * 1000 + (x % 17), 3)


def write_dense_array(uri, values):
    """A dense TileDB array of ``values`` in one write (one fragment), BYTESHUFFLE then
    ZSTD as users store float64, tiles of at most 1 Mi cells."""
    import tiledb

    cells = len(values)
    schema = tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, cells - 1),
                                        tile=min(cells, 1 << 20), dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=np.float64, filters=tiledb.FilterList(
            [tiledb.ByteShuffleFilter(), tiledb.ZstdFilter(level=1)]))])
    tiledb.Array.create(uri, schema)
    with tiledb.open(uri, "w") as A:
        A[:] = values


def tiledb_figures(tmp, mib, rounds=3, slices=200, width=1000, fragment_count=1000):
    """``rounds`` alternated rounds, page cache dropped before every read and a fresh mount
    for every ctdsfs or floor read: tiledb-py ``A[:]``, ``np.load`` of dense/v.npy, ``np.load``
    of the fragment's v.npy, ``np.load`` of v.npy through the pyfuse3 floor (pyfuse3_floor.py
    ``files``: ``A[:]`` saved once, served from memory: what any pyfuse3+trio file system
    pays to hand NumPy the decoded bytes); then ``slices`` random ``width``-item slices (cache dropped once)
    through a mapped dense/v.npy and by ``A[i:i+width]``. Medians and their ratios, and the
    CPU seconds of the reader and of the daemon for each whole read."""
    import tiledb

    cells = (mib << 20) // 8
    uri = str(tmp / "big_tiledb")
    print(f"writing a {mib} MiB BYTESHUFFLE+ZSTD float64 dense TileDB array ...", flush=True)
    write_dense_array(uri, smooth_values(mib))
    fragment, = os.listdir(os.path.join(uri, "__fragments"))
    mnt = tmp / "mt"
    files = {"dense": mnt / "dense" / "v.npy", "fragment": mnt / "fragments" / fragment / "v.npy"}
    decoded = tmp / "tiledb-v.npy"  # what the floor serves
    with tiledb.open(uri) as A:
        np.save(decoded, A[:]["v"])
    times = {"tiledb-py": [], "dense": [], "fragment": [], "floor": []}
    cpu = {name: [] for name in times}  # CPU-s of the reading process and of the daemon

    def timed(name, read, daemon=None):
        """Time ``read()``, and the CPU-s it cost this process and the ``daemon`` pid."""
        own, theirs = _own_cpu_seconds(), daemon and process_cpu_seconds(daemon)
        times[name].append(seconds(read))
        cpu[name].append((_own_cpu_seconds() - own,
                          daemon and process_cpu_seconds(daemon) - theirs))

    for _ in range(rounds):
        drop_caches()
        with tiledb.open(uri) as A:
            timed("tiledb-py", lambda: A[:]["v"])
        for name, path in files.items():
            with Mounted(["mount.ctdsfs", "-f", uri, str(mnt)], str(mnt)) as mounted:
                drop_caches()
                timed(name, lambda: np.load(path), mounted.proc.pid)
        with floor_of_files({"v.npy": decoded}, mnt) as mounted:
            drop_caches()
            timed("floor", lambda: np.load(mnt / "v.npy"), mounted.proc.pid)
    decoded.unlink()
    median = {name: statistics.median(values) for name, values in times.items()}
    native = median["tiledb-py"]
    starts = np.random.default_rng(24).integers(0, cells - width, slices)
    with Mounted(["mount.ctdsfs", "-f", uri, str(mnt)], str(mnt)):
        drop_caches()
        mapped = np.load(files["dense"], mmap_mode="r")
        ours = slice_seconds(lambda i, j, m=mapped: m[i:j], starts, width)
        del mapped
    drop_caches()
    with tiledb.open(uri) as A:
        theirs = slice_seconds(lambda i, j: A[i:j]["v"], starts, width)
    gb = cells * 8 / 1e9
    rows = [("tiledb-py A[:], cold (median)", gb / native, None, None),
            ("ctdsfs np.load(dense/v.npy), cold (vs A[:])", gb / median["dense"], gb / native,
             1.0),
            ("ctdsfs np.load(fragment v.npy), cold (vs A[:])", gb / median["fragment"],
             gb / native, 1.0),
            ("pyfuse3 floor np.load(v.npy), cold (vs A[:])", gb / median["floor"], gb / native,
             None)]
    lines = [f"TileDB {mib} MiB dense float64 (BYTESHUFFLE+ZSTD, one fragment), median of "
             f"{rounds} alternated rounds, cache dropped, fresh mount: tiledb-py A[:] "
             f"{native:.2f} s, np.load dense/v.npy {median['dense']:.2f} s "
             f"({median['dense'] / native:.2f}x), fragment v.npy {median['fragment']:.2f} s "
             f"({median['fragment'] / native:.2f}x), pyfuse3 floor v.npy (the decoded bytes "
             f"from memory) {median['floor']:.2f} s ({median['floor'] / native:.2f}x); "
             "all rounds (s): "
             + "; ".join(f"{k} " + " ".join(f"{t:.2f}" for t in v) for k, v in times.items()),
             "TileDB CPU seconds (median; reader + daemon, the load affects them less than "
             "the times): " + "; ".join(
                 f"{k} {statistics.median(r for r, _ in v):.2f}"
                 + (f" + {statistics.median(d for _, d in v):.2f}" if v[0][1] is not None
                    else "") for k, v in cpu.items()),
             f"TileDB {slices} random {width}-item slices, cache dropped once: "
             f"{ours * 1e3:.2f} ms each through a mapped dense/v.npy, {theirs * 1e3:.2f} ms "
             f"by A[i:j] ({ours / theirs:.2f}x, target <= 1.5x)"]

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
    return rows, lines + [f"listing fragments/ of an array of {len(listed)} fragments (ls -l, "
                          f"cache dropped): {list_seconds:.2f} s (target < 1 s)"]
