"""The benchmark's "read" part: a virtual file read through ctdsfs (with and without CRC
checks) against the raw container file and its peer, a minimal pyfuse3 passthrough
(``serve_passthrough``, run by benchmark.py --serve-passthrough)."""

import os
import sys
from pathlib import Path

from benchmark_common import Mounted, drop_caches, filler, read_through, write_container

BENCHMARK = Path(__file__).with_name("benchmark.py")  # (it serves the passthrough)


def read_figures(tmp, pool, size, block_size):
    container = tmp / "big.mf"
    fill = filler(pool)

    print(f"building a {size >> 20} MiB virtual file, block size {block_size}, with CRCs ...",
          flush=True)
    write_container(container, [("big.bin", size, fill)], block_size, use_crc=True)
    drop_caches()
    direct_cold = read_through(container)
    direct_hot = max(read_through(container) for _ in range(3))
    me = [sys.executable, str(BENCHMARK)]
    with Mounted(me + ["--serve-passthrough", str(container), str(tmp / "pt")], str(tmp / "pt")):
        drop_caches()
        passthrough_cold = read_through(tmp / "pt" / "container")
    with Mounted(["mount.ctdsfs", "-f", "-o", "nocrc", str(container), str(tmp / "m1")],
                 str(tmp / "m1")):
        drop_caches()
        ctdsfs_cold = read_through(tmp / "m1" / "big.bin")
        ctdsfs_repeat = max(read_through(tmp / "m1" / "big.bin") for _ in range(3))
    with Mounted(["mount.ctdsfs", "-f", str(container), str(tmp / "m2")], str(tmp / "m2")):
        drop_caches()
        ctdsfs_crc_cold = read_through(tmp / "m2" / "big.bin")
    container.unlink()
    return [
        ("direct read of the container, cold", direct_cold, None, None),
        ("direct read of the container, hot", direct_hot, None, None),
        ("minimal pyfuse3 passthrough, cold", passthrough_cold, None, None),
        ("ctdsfs first read, cold", ctdsfs_cold, passthrough_cold, 0.8),
        ("ctdsfs first read, cold (vs direct cold)", ctdsfs_cold, direct_cold, 0.3),
        ("ctdsfs repeated read (vs direct hot)", ctdsfs_repeat, direct_hot, 0.5),
        ("ctdsfs first read with CRC checks (vs direct cold)", ctdsfs_crc_cold, direct_cold, 0.2),
    ]


def serve_passthrough(source, mountpoint):
    """The reference: a minimal pyfuse3+trio file system exposing one file by os.pread."""
    import stat

    import pyfuse3
    import trio

    fd = os.open(source, os.O_RDONLY)
    size = os.fstat(fd).st_size

    class Passthrough(pyfuse3.Operations):
        def _attr(self, ino):
            a = pyfuse3.EntryAttributes()
            a.st_ino = ino
            a.st_mode = (stat.S_IFDIR | 0o555) if ino == pyfuse3.ROOT_INODE else (stat.S_IFREG | 0o444)
            a.st_size = 0 if ino == pyfuse3.ROOT_INODE else size
            a.entry_timeout = a.attr_timeout = 3600
            return a

        async def lookup(self, parent, name, ctx=None):
            if name != b"container":
                raise pyfuse3.FUSEError(2)
            return self._attr(2)

        async def getattr(self, ino, ctx=None):
            return self._attr(ino)

        async def open(self, ino, flags, ctx):
            return pyfuse3.FileInfo(fh=ino, keep_cache=True)

        async def read(self, fh, off, n):
            return os.pread(fd, n, off)

    pyfuse3.init(Passthrough(), mountpoint, {"ro", "fsname=passthrough"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)

