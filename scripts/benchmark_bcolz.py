"""The benchmark's optional "bcolz" part: a float64 carray read whole through array.npy and
by bcolz itself, and by random slices through ``numpy.load(mmap_mode="r")`` and
``carr[i:j]``."""

import statistics

import numpy as np

from benchmark_common import Mounted, drop_caches, seconds, slice_seconds


def bcolz_figures(tmp, size, rounds=3, slices=200, width=1000):
    """Issue 13/24: a float64 carray of ``size`` bytes (lz4, shuffle; a random walk, as prices
    are) read whole by ``np.load`` of array.npy through a fresh mount and by
    ``bcolz.open()[:]``, page cache dropped before each, ``rounds`` alternated rounds; then
    ``slices`` random ``width``-item slices (cache dropped once) through a mapped array.npy
    and by ``carr[i:i+width]``. Medians and their ratios."""
    import bcolz

    root, mnt = tmp / "carray", tmp / "m-bcolz"
    count = size // 8
    rng = np.random.default_rng(13)
    print(f"writing a {size >> 20} MiB float64 carray with bcolz (lz4, shuffle) ...", flush=True)
    carr = bcolz.carray(np.zeros(0), rootdir=str(root), mode="w", expectedlen=count,
                        cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=1))
    for start in range(0, count, 1 << 24):
        carr.append(np.cumsum(rng.normal(size=min(1 << 24, count - start))).round(2))
    carr.flush()
    chunklen, stored = carr.chunklen, carr.cbytes
    del carr
    native, ours = [], []
    for _ in range(rounds):
        drop_caches()
        native.append(seconds(lambda: bcolz.open(str(root))[:]))
        with Mounted(["mount.ctdsfs", "-f", str(root), str(mnt)], str(mnt)):
            drop_caches()
            ours.append(seconds(lambda: np.load(mnt / "array.npy")))
    starts = rng.integers(0, count - width, slices)
    with Mounted(["mount.ctdsfs", "-f", str(root), str(mnt)], str(mnt)):
        drop_caches()
        mapped = np.load(mnt / "array.npy", mmap_mode="r")
        mapped_slice = slice_seconds(lambda i, j, m=mapped: m[i:j], starts, width)
        del mapped
    drop_caches()
    carr = bcolz.open(str(root))
    their_slice = slice_seconds(lambda i, j: carr[i:j], starts, width)
    native, ours = statistics.median(native), statistics.median(ours)
    rows = [("bcolz.open()[:], cold (median)", size / native / 1e9, None, None),
            ("ctdsfs np.load(array.npy), cold (vs bcolz)", size / ours / 1e9,
             size / native / 1e9, 1.0)]
    lines = [f"bcolz carray {size >> 20} MiB (chunklen {chunklen}, {stored / size:.2f} of its "
             f"size stored), median of {rounds} alternated rounds, cache dropped, fresh mount: "
             f"bcolz.open()[:] {native:.2f} s, np.load array.npy {ours:.2f} s "
             f"({ours / native:.2f}x); {slices} random {width}-item slices, cache dropped "
             f"once: {mapped_slice * 1e3:.2f} ms each through a mapped array.npy, "
             f"{their_slice * 1e3:.2f} ms by carr[i:j] ({mapped_slice / their_slice:.2f}x, "
             f"target <= 1.5x)"]
    return rows, lines
