"""What every part of scripts/benchmark.py shares: containers built for it, the page cache
dropped, timed reads, mounts that are always unmounted (the pyfuse3 floor of decoded
files among them), a process's memory and CPU, and the MeasurementSet the legacy and
remote parts write and read."""

import contextlib
import os
import struct
import subprocess
import sys
import time

import numpy as np

import pyfuse3_floor  # (beside this script)
from ctdsfs.container import READAHEAD_KB
from ctdsfs.formats.multifile.header import Entry, Header, encode_header_v2
from ctdsfs.io.crc import crc32_bzip2

# ---------------------------------------------------------------- container building

def _layout_header(header, first_cont_block):
    """Logical v2 header and its continuation pieces, continuation set 0 at the end."""
    bs = header.block_size
    count = 0
    while True:
        header.cont_sets = (np.arange(first_cont_block, first_cont_block + count),
                            np.zeros(0, np.int64))
        header.cont_used = (count, 0)
        header.cont_first = first_cont_block if count else 0
        header.nblocks = first_cont_block + count
        raw = encode_header_v2(header)
        needed = max(0, -(-(len(raw) - bs) // (bs - 8)))
        if needed <= count:
            return raw
        count = needed


def write_container(path, files, block_size, use_crc=False, sparse=False):
    """A v2 MultiFile holding ``files`` [(name, size, fill)], laid out contiguously.

    ``fill(offset, size)`` gives the bytes of a file; with ``sparse`` the data
    blocks stay holes (for header-only benchmarks).
    """
    entries, next_block = [], 1
    for name, size, _ in files:
        n = -(-size // block_size)
        entries.append(Entry(name, size, np.arange(next_block, next_block + n)))
        next_block += n
    crcs = np.zeros(next_block if use_crc else 0, np.uint32)
    with open(path, "wb") as f:
        f.truncate(next_block * block_size)
        if not sparse:
            f.seek(block_size)
            block = 1
            for name, size, fill in files:
                chunk = 64 * block_size
                for off in range(0, -(-size // block_size) * block_size, chunk):
                    data = fill(off, min(chunk, size - off)) if off < size else b""
                    data = data.ljust(min(chunk, -(-size // block_size) * block_size - off), b"\0")
                    if use_crc:
                        for i in range(0, len(data), block_size):
                            crcs[block] = crc32_bzip2(data[i:i + block_size])
                            block += 1
                    f.write(data)
        header = Header(version=2, block_size=block_size, counter=1, nblocks=next_block,
                        header_size=0, entries=entries, free_blocks=np.zeros(0, np.int64),
                        use_crc=use_crc, crcs=crcs)
        raw = _layout_header(header, next_block)
        f.seek(0)
        f.write(raw[:block_size].ljust(block_size, b"\0"))
        pieces = [raw[i:i + block_size - 8] for i in range(block_size, len(raw), block_size - 8)]
        conts = header.cont_sets[0].tolist()
        for i, piece in enumerate(pieces):
            nxt = conts[i + 1] if i + 1 < len(pieces) else 0
            f.seek(conts[i] * block_size)
            f.write((struct.pack(">q", nxt) + piece).ljust(block_size, b"\0"))


def filler(pool):
    """``fill(offset, n)`` for write_container: bytes of ``pool``, repeated."""
    def fill(off, n):
        return (pool * (1 + n // len(pool)))[off % 4096:off % 4096 + n]
    return fill


# ---------------------------------------------------------------- measuring

PAGE_REPORTING_WAIT = "/sys/module/page_reporting/parameters/min_free_ms"
WARM_MEMORY_BYTES = 2 << 30


@contextlib.contextmanager
def freed_memory_kept():
    """On a virtual machine whose kernel hands freed memory back to its host (free page
    reporting), hold that off while the benchmark runs, and touch some memory once: a page
    the host took back costs a host fault when it is touched again, which made one cold
    bcolz read take 0.26 s and the next 0.55-0.98 s, whichever reader's buffers (or page
    cache) happened to get such pages. Restored afterwards; elsewhere nothing is changed."""
    try:
        with open(PAGE_REPORTING_WAIT) as f:
            saved = f.read().strip()
        with open(PAGE_REPORTING_WAIT, "w") as f:
            f.write("300000\n")  # five minutes after a page is freed (the most it takes)
    except OSError:
        yield
        return
    try:
        np.ones(WARM_MEMORY_BYTES, np.uint8)  # (freed at once, and now kept)
        yield
    finally:
        with open(PAGE_REPORTING_WAIT, "w") as f:
            f.write(saved + "\n")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_through(path, bufsize=1 << 20):
    """Sequential read of a whole file; returns GB/s."""
    buf = bytearray(bufsize)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    total = 0
    start = time.perf_counter()
    try:
        while n := os.readv(fd, [view]):
            total += n
    finally:
        os.close(fd)
    return total / (time.perf_counter() - start) / 1e9


def seconds(call):
    """Wall-clock seconds ``call()`` takes."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def slice_seconds(read, starts, width):
    """Seconds per slice: ``read(i, i + width)`` for each of ``starts``, made an array."""
    start = time.perf_counter()
    for i in starts:
        np.asarray(read(int(i), int(i) + width)).sum()
    return (time.perf_counter() - start) / len(starts)


def is_mounted(path):
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real for line in f)


class Mounted:
    """A foreground mount process, unmounted (and waited for) on exit."""

    def __init__(self, cmd, mountpoint):
        self.mountpoint = mountpoint
        os.makedirs(mountpoint, exist_ok=True)
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mount failed: {self.proc.stderr.read().decode()}")
            time.sleep(0.005)
        os.stat(mountpoint)  # answered once the file system serves requests
        self.mount_seconds = time.perf_counter() - self.start
        time.sleep(0.2)  # ctdsfs tunes the mount's readahead right after that

    def peak_rss_mb(self):
        return process_memory_mb(self.proc.pid, "VmHWM")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for flag in ("-u", "-uz"):
            if is_mounted(self.mountpoint):
                subprocess.run(["fusermount3", flag, self.mountpoint], stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _readahead_file(mountpoint):
    """Where the kernel keeps the readahead of the file system at ``mountpoint`` (its bdi)."""
    device = os.stat(mountpoint).st_dev
    return f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"


def set_readahead(mountpoint, kb=READAHEAD_KB):
    """Set the kernel's readahead for the file system mounted at ``mountpoint``, in KiB."""
    with open(_readahead_file(mountpoint), "w") as f:
        f.write(f"{kb}\n")


def mount_readahead_kb(mountpoint):
    """The kernel's readahead for the file system mounted at ``mountpoint``, in KiB."""
    with open(_readahead_file(mountpoint)) as f:
        return int(f.read())


def floor_of_files(files, mountpoint, readahead_kb=READAHEAD_KB, hop=False):
    """A ``Mounted`` pyfuse3 floor (pyfuse3_floor.py ``files``) serving ``files`` {name:
    path} from memory, read before the mount (each read answered from a worker thread
    with ``hop``); its readahead set as ctdsfs sets its own (``readahead_kb``), so from the
    first lookup on the two differ only by what they do per request."""
    mounted = Mounted([sys.executable, pyfuse3_floor.__file__, "files", *(["--hop"] * hop),
                       str(mountpoint), *(f"{name}={path}" for name, path in files.items())],
                      str(mountpoint))
    try:
        set_readahead(mountpoint, readahead_kb)
    except BaseException:
        mounted.__exit__(None, None, None)
        raise
    return mounted


def _with_children(pid):
    """``pid`` and its child processes (a ctdsfs mount's worker processes)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *map(int, f.read().split())]
    except OSError:
        return [pid]


def cores_busy():
    """(busy, all) jiffies of every core so far, from /proc/stat: the share of the
    machine's CPU in use between two calls (idle and I/O wait are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_share(before, after):
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` and its children (a ctdsfs mount's
    worker processes) so far."""
    total = 0
    for one in _with_children(pid):
        try:
            with open(f"/proc/{one}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (ended meanwhile)
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def process_memory_mb(pid, field="VmRSS"):
    """A memory figure of process ``pid`` and its children from /proc (VmRSS now, VmHWM its
    peak), in MB: the sum of theirs (pages the children share with it counted in each)."""
    total = 0
    for one in _with_children(pid):
        with open(f"/proc/{one}/status") as f:
            total += next((int(line.split()[1]) for line in f
                           if line.startswith(field + ":")), 0)
    return total / 1024 or float("nan")


def process_cpu_seconds(pid):
    """User plus system CPU seconds process ``pid`` and its children (a mount's workers)
    have used so far (all their threads)."""
    total = 0
    for one in _with_children(pid):
        with open(f"/proc/{one}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


MAKE_MS = """
import sys, numpy as np, casacore.tables as t
rows, chunk = int(sys.argv[1]), 16384
ms = t.default_ms("big.ms")
ms.addcols(t.maketabdesc(t.makearrcoldesc("DATA", 0j, shape=[4, 64])),
           dminfo={"TYPE": "TiledColumnStMan", "NAME": "tiled",
                   "SPEC": {"DEFAULTTILESHAPE": [4, 64, 64]}})
ms.addrows(rows)
for start in range(0, rows, chunk):
    n = min(chunk, rows - start)
    ms.putcol("DATA", np.full((n, 4, 64), 1 + 2j, np.complex64), startrow=start, nrow=n)
    ms.putcol("TIME", np.arange(start, start + n) * 1.5, startrow=start, nrow=n)
ms.close()
"""


READ_ALL = """
import sys, time, casacore.tables as t
table = t.table(sys.argv[1], ack=False)
start = time.perf_counter()
for column in table.colnames():
    try:
        table.getcol(column)
    except RuntimeError:
        pass  # columns without values (FLAG_CATEGORY)
print(time.perf_counter() - start)
"""


READ_RANDOM_ROWS = """
import sys, time, numpy as np, casacore.tables as t
table = t.table(sys.argv[1], ack=False)
count, nrow = int(sys.argv[2]), 16  # 16 rows: within one or two 128 KiB tiles of DATA
starts = np.random.default_rng(2).integers(0, table.nrows() - nrow, count)
start = time.perf_counter()
for row in starts:
    table.getcol("DATA", startrow=int(row), nrow=nrow)
print(time.perf_counter() - start)
"""
