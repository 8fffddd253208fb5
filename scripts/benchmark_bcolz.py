"""The benchmark's optional "bcolz" part: a float64 carray read whole through array.npy and
by bcolz itself, and by random slices through ``numpy.load(mmap_mode="r")`` and
``carr[i:j]``; beside them the floors of both reads, and both reads at the 1 MiB readahead
of other mounts (where a mapped fault's read-around takes two chunks)."""

import concurrent.futures
import os
import statistics
import time

import numpy as np

from benchmark_common import (
    READAHEAD_KB,
    Mounted,
    drop_caches,
    floor_of_files,
    mount_readahead_kb,
    seconds,
    set_readahead,
    slice_seconds,
)

PAGE = os.sysconf("SC_PAGE_SIZE")


def _write_carray(root, size, rng):
    """A float64 carray of ``size`` bytes, lz4 and shuffle, a random walk rounded to cents
    (as prices are); returns (chunklen, stored bytes)."""
    import bcolz

    count = size // 8
    print(f"writing a {size >> 20} MiB float64 carray with bcolz (lz4, shuffle) ...", flush=True)
    carr = bcolz.carray(np.zeros(0), rootdir=str(root), mode="w", expectedlen=count,
                        cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=1))
    for start in range(0, count, 1 << 24):
        carr.append(np.cumsum(rng.normal(size=min(1 << 24, count - start))).round(2))
    carr.flush()
    return carr.chunklen, carr.cbytes


def _read_around_chunks(start, header, chunk_bytes, data_bytes, readahead_kb):
    """The chunks whose items the kernel asks for when a mapped reader first touches item
    ``start`` of a float64 array.npy: its mmap read-around, ``readahead_kb`` centred on the
    faulting page (mm/filemap.c, do_sync_mmap_readahead)."""
    pages = readahead_kb * 1024 // PAGE
    first_page = max(0, (header + start * 8) // PAGE - pages // 2)
    begin = max(0, first_page * PAGE - header)
    end = min(data_bytes, (first_page + pages) * PAGE - header)
    return range(begin // chunk_bytes, (end - 1) // chunk_bytes + 1)


def _read_around_floor(root, starts, header, chunk_bytes, data_bytes, readahead_kb):
    """Seconds per slice that a decoder of whole chunks pays at least at that readahead:
    the superchunk files of the chunks each fault's read-around covers, read whole from
    disk side by side (two threads, as the mount decodes them; headers first, then the
    rest, as bcolz and the mount read them), nothing decoded, no FUSE; superchunks read
    for an earlier slice come from the page cache, as the mount's do."""
    spares = [bytearray(chunk_bytes + 64) for _ in range(2)]

    def read(job):
        spare, number = job
        fd = os.open(os.path.join(root, "data", f"__{number}.blp"), os.O_RDONLY)
        try:
            size = min(os.fstat(fd).st_size, len(spare))
            return os.preadv(fd, [memoryview(spare)[:32]], 0) + \
                os.preadv(fd, [memoryview(spare)[32:size]], 32)
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        drop_caches()
        began = time.perf_counter()
        for start in starts:
            list(pool.map(read, zip(spares, _read_around_chunks(
                int(start), header, chunk_bytes, data_bytes, readahead_kb))))
        return (time.perf_counter() - began) / len(starts)


def bcolz_figures(tmp, size, rounds=3, slices=200, width=1000):
    """Issue 13/24: a float64 carray of ``size`` bytes read whole by ``np.load`` of
    array.npy through a fresh mount (at the readahead ctdsfs sets for it and at
    READAHEAD_KB, every other mount's), through the pyfuse3 floor (the decoded array from
    memory) and by ``bcolz.open()[:]``, page cache dropped before each, ``rounds``
    alternated rounds; then ``slices`` random ``width``-item slices (cache dropped once per
    reader) through a mapped array.npy at both readaheads, by ``carr[i:i+width]``, by the
    read-around floor at both, and through the pyfuse3 floor (each read answered at once,
    and from a worker thread), again ``rounds`` alternated rounds. Medians, ratios."""
    import bcolz

    root, mnt = tmp / "carray", tmp / "m-bcolz"
    rng = np.random.default_rng(13)
    chunklen, stored = _write_carray(root, size, rng)
    count = size // 8
    decoded = tmp / "bcolz-array.npy"  # what the floor serves
    np.save(decoded, bcolz.open(str(root))[:])
    header = decoded.stat().st_size - count * 8
    mount = ["mount.ctdsfs", "-f", str(root), str(mnt)]
    with Mounted(mount, str(mnt)):
        own_kb = mount_readahead_kb(mnt)
    wide = f"ctdsfs at {READAHEAD_KB} KiB readahead"
    whole = {"bcolz": [], "ctdsfs": [], wide: [], "pyfuse3 floor": []}
    sliced = {"bcolz": [], "ctdsfs": [], wide: [], "read-around floor": [],
              f"read-around floor at {READAHEAD_KB} KiB": [], "pyfuse3 floor": [],
              "pyfuse3 floor read in a thread": []}
    starts = rng.integers(0, count - width, slices)

    def through_mount(read, readahead_kb=None):
        with Mounted(mount, str(mnt)):
            if readahead_kb:
                set_readahead(mnt, readahead_kb)
            drop_caches()
            return read()

    def mapped_slices():
        array = np.load(mnt / "array.npy", mmap_mode="r")
        return slice_seconds(lambda i, j: array[i:j], starts, width)

    def native_slices():
        drop_caches()
        carr = bcolz.open(str(root))
        return slice_seconds(lambda i, j: carr[i:j], starts, width)

    for _ in range(rounds):
        drop_caches()
        whole["bcolz"].append(seconds(lambda: bcolz.open(str(root))[:]))
        for name, readahead_kb in (("ctdsfs", None), (wide, READAHEAD_KB)):
            whole[name].append(through_mount(
                lambda: seconds(lambda: np.load(mnt / "array.npy")), readahead_kb))
        with floor_of_files({"array.npy": decoded}, mnt, own_kb):
            drop_caches()
            whole["pyfuse3 floor"].append(seconds(lambda: np.load(mnt / "array.npy")))
        sliced["bcolz"].append(native_slices())
        sliced["ctdsfs"].append(through_mount(mapped_slices))
        sliced[wide].append(through_mount(mapped_slices, READAHEAD_KB))
        for name, hop in (("pyfuse3 floor", False), ("pyfuse3 floor read in a thread", True)):
            with floor_of_files({"array.npy": decoded}, mnt, own_kb, hop):
                drop_caches()
                sliced[name].append(mapped_slices())
        for name, readahead_kb in (("read-around floor", own_kb),
                                   (f"read-around floor at {READAHEAD_KB} KiB", READAHEAD_KB)):
            sliced[name].append(_read_around_floor(root, starts, header, chunklen * 8,
                                                   count * 8, readahead_kb))
    whole = {name: statistics.median(times) for name, times in whole.items()}
    sliced = {name: statistics.median(times) for name, times in sliced.items()}
    # a fault of a chunk not in memory: its disk reads, then the FUSE reply (a lone
    # reader's is answered on the loop; from a thread where readers share the mount)
    sliced["sum of both floors"] = sliced["read-around floor"] + sliced["pyfuse3 floor"]
    gb = size / 1e9
    rows = [("bcolz.open()[:], cold (median)", gb / whole["bcolz"], None, None),
            ("ctdsfs np.load(array.npy), cold (vs bcolz)", gb / whole["ctdsfs"],
             gb / whole["bcolz"], 1.0),
            ("pyfuse3 floor np.load(array.npy), cold (vs bcolz)", gb / whole["pyfuse3 floor"],
             gb / whole["bcolz"], None)]
    native, native_slice = whole["bcolz"], sliced["bcolz"]
    lines = [
        f"bcolz carray {size >> 20} MiB (chunklen {chunklen}, {stored / size:.2f} of its size "
        f"stored), medians of {rounds} alternated rounds, cache dropped, fresh mounts "
        f"(ctdsfs sets its readahead to {own_kb} KiB for it). Whole read: " + ", ".join(
            f"{name} {t:.2f} s ({t / native:.2f}x)" for name, t in whole.items())
        + " (target: ctdsfs <= 1x).",
        f"bcolz {slices} random {width}-item slices, cache dropped once per reader, ms each "
        "(through a mapped array.npy for ctdsfs): " + ", ".join(
            f"{name} {t * 1e3:.2f} ({t / native_slice:.2f}x)" for name, t in sliced.items())
        + " (target: ctdsfs <= 1.5x)."]
    return rows, lines
