"""The benchmark's "write" part: a sequential write through a read-write mount against
the same bytes written to a plain file."""

import os
import subprocess
import time

from benchmark_common import Mounted


def write_through(path, size, chunk):
    """Sequential write of ``size`` bytes in ``chunk``-sized writes, fsync, close; GB/s."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    try:
        for _ in range(size // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size / (time.perf_counter() - start) / 1e9


def write_figures(tmp, pool, size, block_size, rounds=3):
    """Best of ``rounds`` alternating runs each: this disk's write speed moves by a
    factor of two from one minute to the next, and alternating shares that out."""
    print("writing the same bytes to a plain file and through a read-write mount "
          f"({rounds} rounds each, alternating) ...", flush=True)
    chunk = pool[:1 << 20]
    plain, mounted = [], []
    for _ in range(rounds):
        plain.append(write_through(tmp / "plain.bin", size, chunk))
        (tmp / "plain.bin").unlink()
        written = tmp / "written.mf"
        subprocess.run(["ctdsfs", "new", str(written), "--block-size", str(block_size)],
                       check=True)
        with Mounted(["mount.ctdsfs", "-f", "-o", "rw,commit=3600", str(written),
                      str(tmp / "m4")], str(tmp / "m4")):
            mounted.append(write_through(tmp / "m4" / "big.bin", size, chunk))
        written.unlink()
    return [("plain file sequential write + fsync (best)", max(plain), None, None),
            ("ctdsfs sequential write + fsync (best, vs plain)", max(mounted), max(plain), 0.6)]

