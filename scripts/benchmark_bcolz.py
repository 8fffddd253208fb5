"""The benchmark's optional "bcolz" part: a float64 carray read through array.npy and by
bcolz itself, whole and by random single items."""

import time

import numpy as np

from benchmark_common import Mounted, drop_caches, read_through


def bcolz_figures(tmp, size, reads=2000):
    """Issue 13: a float64 carray of ``size`` bytes (lz4, shuffle; a random walk, as prices
    are) read whole through ctdsfs's array.npy and by bcolz's own ``carr[:]``, page cache
    dropped before each; then random single items through ``numpy.load(mmap_mode="r")``
    on the mount against ``carr[i]``, each after the cache was dropped once."""
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
    drop_caches()
    start = time.perf_counter()
    bcolz.open(str(root))[:]
    native = size / (time.perf_counter() - start) / 1e9
    indices = rng.integers(0, count, reads)
    with Mounted(["mount.ctdsfs", "-f", str(root), str(mnt)], str(mnt)):
        drop_caches()
        through = read_through(mnt / "array.npy")
        drop_caches()
        mapped = np.load(mnt / "array.npy", mmap_mode="r")
        start = time.perf_counter()
        for i in indices:
            float(mapped[i])
        ours = (time.perf_counter() - start) / reads
        del mapped
    drop_caches()
    carr = bcolz.open(str(root))
    start = time.perf_counter()
    for i in indices:
        float(carr[i])
    theirs = (time.perf_counter() - start) / reads
    rows = [(f"bcolz carray {size >> 20} MiB through array.npy / bcolz carr[:], cold",
             through, native, 0.8)]
    lines = [f"bcolz carray: chunklen {chunklen}, {stored / size:.2f} of its size stored; "
             f"bcolz carr[:] {native:.2f} GB/s; {reads} random single items, cache dropped "
             f"once: {ours * 1e6:.0f} us each through numpy.load(mmap_mode='r'), "
             f"{theirs * 1e6:.0f} us each by bcolz carr[i]"]
    return rows, lines

