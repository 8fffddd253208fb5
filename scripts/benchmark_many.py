"""The benchmark's "many" part: a container of 100,000 files and 1,000,000 blocks mounted,
committed after a change, and written to in small pieces."""

import os
import time

from benchmark_common import Mounted, drop_caches, write_container


def header_counter(path):
    with open(path, "rb") as f:
        f.seek(16)
        return int.from_bytes(f.read(8), "big")


def many_files_figures(tmp):
    print("building a sparse container with 100,000 files and 1,000,000 blocks ...", flush=True)
    many = tmp / "many.mf"
    write_container(many, [(f"table.f{i}", 10 * 4096, None) for i in range(100_000)], 4096,
                    sparse=True)
    drop_caches()
    with Mounted(["mount.ctdsfs", "-f", str(many), str(tmp / "m3")], str(tmp / "m3")) as m:
        mount_seconds = m.mount_seconds
        listed = len(os.listdir(tmp / "m3"))
        rss = m.peak_rss_mb()

    from ctdsfs.formats import open_container
    big = open_container(many, writable=True)
    big.write("table.f0", 100, b"changed")
    start = time.perf_counter()
    big.commit()
    commit_seconds = time.perf_counter() - start
    big.close()

    counter = header_counter(many)
    with Mounted(["mount.ctdsfs", "-f", "-o", "rw,commit=3600", str(many), str(tmp / "m5")],
                 str(tmp / "m5")):
        fd = os.open(tmp / "m5" / "table.f7", os.O_WRONLY)
        start = time.perf_counter()
        for i in range(1000):
            os.pwrite(fd, b"small write", (i * 7919) % 40000)
        small_write_us = (time.perf_counter() - start) * 1e3
        header_writes = header_counter(many) - counter
        os.close(fd)
    many.unlink()
    return [f"mount with 100,000 files / 1,000,000 blocks: live after {mount_seconds:.2f} s "
            f"(target < 2 s), peak RSS {rss:.0f} MB after listing {listed} files "
            "(target < 300 MB)",
            f"commit of that container after a change: {commit_seconds:.2f} s (target < 1 s)",
            f"1000 small random writes through a read-write mount: {small_write_us:.0f} us each, "
            f"{header_writes} header writes (target: none before the commit)"]

