"""Benchmark: ctdsfs against the raw container file, a minimal pyfuse3 passthrough and cp -r.

Everything is measured in one run on this machine and printed as ratios with
the targets of the read-only milestone:

  first read through ctdsfs, cache dropped   / minimal passthrough, cache dropped  >= 0.8
  first read through ctdsfs, cache dropped   / direct read, cache dropped          >= 0.3
  repeated read through ctdsfs (kernel cache)/ direct read, hot                    >= 0.5
  first read with CRC checks, cache dropped  / direct read, cache dropped          >= 0.2
  mount of 100,000 files / 1,000,000 blocks: time to live < 2 s, peak RSS < 300 MB
  sequential write through a read-write mount / the same bytes to a plain file >= 0.6
  commit of a container with 100,000 files < 1 s; small writes write no header
  every column of a >= 500 MB MeasurementSet: casacore 3.5 through the legacy
    table view / python-casacore 3.8 reading the MultiFile original >= 0.8
  pack and unpack of a >= 1 GiB tree / cp -r of the same tree >= 0.7
  check: CRC-verified blocks >= 1 GB/s
  small files (20,000 of 1-16 KiB in 200 directories and a 1 GiB file), the same
    bytes through ctdsfs (a packed container), ratarmount (a tar), squashfuse_ll
    (a squashfs image) and directly: find, ls -lR, tar of every file and fio random
    reads at least as fast as ratarmount and within 2x of squashfuse_ll (4 KiB
    reads >= 0.5x its IOPS), mount < 0.2 s, daemon RSS after the tar < 40 MB; beside
    them the "pyfuse3 floor", the thinnest pyfuse3+trio file system serving the
    same tree, everything precomputed: the least any pyfuse3+trio file system pays
  remote (a SeaweedFS on loopback): cold sequential read of a 1 GiB virtual file
    through an s3:// mount / the best raw GET throughput of the object >= 0.8,
    beside it pyfuse3 floors for that read (the thinnest pyfuse3+trio file system
    serving the object by the raw botocore or obstore GETs, or from memory) and the CPU
    each pays per GiB;
    every column of a MeasurementSet through an s3:// mount / a local mount
  optional part "bcolz" (only when named in --parts): a float64 carray (lz4,
    shuffle) read through array.npy, cache dropped / bcolz's own carr[:] >= 0.8,
    and random single items through numpy.load(mmap_mode="r") against carr[i]
  optional part "tiledb": a 1 GiB zstd float64 TileDB attribute through FIELD.npy, cache
    dropped / tiledb-py reading the same fragment into NumPy >= 0.7; listing an
    array of 1,000 fragments < 1 s

Needs root (drop_caches, mounting). Usage:
  python3 scripts/benchmark.py [--size-mib 1024] [--block-size 65536] [--dir DIR] [--quick]
                               [--parts read,write,many,legacy,toolbox,small,remote[,bcolz,tiledb]]
"""

import argparse
import compileall
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ctdsfs
import pyfuse3_floor  # (beside this script)
from ctdsfs.formats.crc import crc32_bzip2
from ctdsfs.fuse_adapter import READAHEAD_KB
from ctdsfs.formats.multifile_header import Entry, Header, encode_header_v2


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


# ---------------------------------------------------------------- measuring

def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def set_readahead(mountpoint, kb=READAHEAD_KB):
    """The kernel's readahead for the file system mounted at ``mountpoint`` (its bdi)."""
    device = os.stat(mountpoint).st_dev
    with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb", "w") as f:
        f.write(f"{kb}\n")


def evict(path):
    """Drop one file's pages from the page cache (everything else stays warm)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def installed_command(name):
    """The installed script ``name`` itself: the one beside this Python if there is one
    (a pyenv shim, a bash script that runs pyenv first, adds about 0.1 s to every start;
    a system install has none), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name) or name


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


def header_counter(path):
    with open(path, "rb") as f:
        f.seek(16)
        return int.from_bytes(f.read(8), "big")


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


def legacy_view_ratio(tmp, size_mb, rounds=3):
    """Seconds for python-casacore 3.8 (native) and casacore 3.5 (through the view)."""
    rows = size_mb * 2 ** 20 // 2048  # DATA is 4 x 64 complex64 = 2 KiB per row
    home = tmp / "home"
    home.mkdir()
    (home / ".casarc").write_text("table.storage.option: multifile\n"
                                  "table.storage.blocksize: 1048576\n")
    data = tmp / "legacy"
    data.mkdir()
    env = dict(os.environ, HOME=str(home))
    subprocess.run([sys.executable, "-c", MAKE_MS, str(rows)], check=True, cwd=data, env=env)
    native, legacy = [], []
    with Mounted(["mount.ctdsfs", "-f", str(data), str(tmp / "m6")], str(tmp / "m6")):
        for _ in range(rounds):  # best of alternating runs, as for writes
            drop_caches()
            native.append(float(subprocess.run(
                [sys.executable, "-c", READ_ALL, str(data / "big.ms")], check=True, env=env,
                capture_output=True, text=True).stdout))
            drop_caches()
            legacy.append(float(subprocess.run(
                ["/usr/bin/python3", "-c", READ_ALL, str(tmp / "m6" / "big.ms")], check=True,
                env=env, capture_output=True, text=True).stdout))
    return min(native), min(legacy)


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


TREE = [  # a MeasurementSet-like tree: (relative path, MiB or bytes, how many)
    ("table.f{}", 200 << 20, 4), ("SUB{}/table.f0", 2 << 20, 10), ("SUB0/table.f{}", 100_000, 200),
    ("SUB1/SUBSUB/f{}", 4096, 300), ("table.f1{}_TSM0", 30 << 20, 4)]


def make_tree(root, pool, mib):
    """About ``mib`` MiB in big, medium and small files over nested directories."""
    scale = mib / 1024
    total = 0
    for pattern, size, count in TREE:
        size = int(size * scale) if size > 1 << 20 else size
        for i in range(count):
            path = root / pattern.format(i)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                left = size
                while left:
                    f.write(pool[:min(left, len(pool))])
                    left -= min(left, len(pool))
            total += size
    return total


def timed(func):
    """Seconds for ``func()`` from a dropped page cache to the data on disk (``sync``)."""
    drop_caches()
    start = time.perf_counter()
    func()
    os.sync()
    return time.perf_counter() - start


def toolbox_figures(tmp, pool, mib, rounds=2):
    """pack / unpack against cp -r of the same tree (best of ``rounds`` alternating runs
    each, as for writes), and check's CRC-verified rate."""
    import shutil

    from ctdsfs.formats.check import check_path
    from ctdsfs.toolbox import pack, unpack

    tree = tmp / "tree"
    total = make_tree(tree, pool, mib)
    seconds = {}  # measurement -> best time

    def best(key, func, cleanup):
        took = timed(func)
        seconds[key] = min(seconds.get(key, took), took)
        cleanup()

    for _ in range(rounds):
        best("cp", lambda: subprocess.run(["cp", "-r", str(tree), str(tmp / "copy")],
                                          check=True),
             lambda: shutil.rmtree(tmp / "copy"))
        for fmt, name in (("mf2", "tree.mf"), ("hdf5", "tree.mfh5")):
            packed = tmp / name
            best(("pack", fmt), lambda: pack(str(tree), str(packed), format=fmt,
                                             block_size=65536, use_crc=fmt == "mf2",
                                             quiet=True), lambda: None)
            best(("unpack", fmt), lambda: unpack(str(packed), str(tmp / "back"), quiet=True),
                 lambda: shutil.rmtree(tmp / "back"))
            best(("command", fmt), lambda: subprocess.run(
                ["ctdsfs", "unpack", "--quiet", str(packed), str(tmp / "back")], check=True),
                lambda: shutil.rmtree(tmp / "back"))
            if fmt == "mf2":
                size = packed.stat().st_size
                drop_caches()
                start = time.perf_counter()
                problems, _ = check_path(packed)
                seconds["check cold"] = min(seconds.get("check cold", 1e9),
                                            time.perf_counter() - start)
                assert not problems, problems
                start = time.perf_counter()
                check_path(packed)
                seconds["check hot"] = min(seconds.get("check hot", 1e9),
                                           time.perf_counter() - start)
            packed.unlink()
    shutil.rmtree(tree)
    copy_rate = total / seconds["cp"] / 1e9
    rows = [(f"cp -r of a {total / 2**30:.2f} GiB tree ({sum(c for *_, c in TREE)} files)",
             copy_rate, None, None)]
    for fmt in ("mf2", "hdf5"):
        target = 0.7 if fmt == "mf2" else None
        crc = ", CRCs" if fmt == "mf2" else ""
        rows += [(f"pack --format {fmt}{crc} (vs cp -r)", total / seconds["pack", fmt] / 1e9,
                  copy_rate, target),
                 ("unpack of it (vs cp -r)", total / seconds["unpack", fmt] / 1e9, copy_rate,
                  target),
                 ("  the same as a command (interpreter start included)",
                  total / seconds["command", fmt] / 1e9, copy_rate, None)]
        if fmt == "mf2":
            rows += [("check, every block CRC-verified, cold", size / seconds["check cold"] / 1e9,
                      None, 1.0),
                     ("check, every block CRC-verified, in page cache",
                      size / seconds["check hot"] / 1e9, None, 1.0)]
    return rows


def print_rows(rows):
    print(f"\n{'measurement':<56} {'GB/s':>6} {'ratio':>6} {'target':>7}")
    for name, value, base, target in rows:
        ratio = f"{value / base:6.2f}" if base else ""
        goal = f">= {target}" if target else ""
        print(f"{name:<56} {value:6.2f} {ratio:>6} {goal:>7}")


PARTS = ("read", "write", "many", "legacy", "toolbox", "small", "remote")
OPTIONAL_PARTS = ("bcolz", "tiledb")  # run only when --parts names them


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="virtual file size (MiB)")
    parser.add_argument("--block-size", type=int, default=65536, help="container block size")
    parser.add_argument("--dir", default=None, help="scratch directory (default: /var/tmp)")
    parser.add_argument("--ms-mib", type=int, default=512,
                        help="MeasurementSet size for the legacy view measurement (MiB)")
    parser.add_argument("--tree-mib", type=int, default=1100,
                        help="directory tree size for pack/unpack (MiB)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS + OPTIONAL_PARTS)} "
                             f"(default: {','.join(PARTS)})")
    parser.add_argument("--tiledb-mib", type=int, default=1024,
                        help="zstd-compressed float64 TileDB attribute size (MiB)")
    parser.add_argument("--quick", action="store_true",
                        help="small-files part only, reduced (2,000 files, 64 MiB file, "
                             "one round): under 2 minutes")
    parser.add_argument("--serve-passthrough", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.parts = "small"
    if args.serve_passthrough:
        return serve_passthrough(*args.serve_passthrough)
    parts = set(args.parts.split(","))
    if parts - set(PARTS + OPTIONAL_PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(parts - set(PARTS + OPTIONAL_PARTS)))}")

    # The daemon as pip installs it, byte-compiled: an editable checkout run with
    # PYTHONDONTWRITEBYTECODE set would compile ctdsfs at every mount.
    compileall.compile_dir(Path(ctdsfs.__file__).parent, quiet=1)
    rows, lines = [], []
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="ctdsfs-bench.") as tmp:
        tmp = Path(tmp)
        size = args.size_mib << 20
        rng = np.random.default_rng(0)
        pool = rng.bytes(1 << 24)
        if "read" in parts:
            rows += read_figures(tmp, pool, size, args.block_size)
        if "write" in parts:
            rows += write_figures(tmp, pool, size, args.block_size)
        if "many" in parts:
            lines += many_files_figures(tmp)
        if "legacy" in parts:
            print(f"writing a {args.ms_mib} MiB MeasurementSet and reading every column ...",
                  flush=True)
            native_seconds, legacy_seconds = legacy_view_ratio(tmp, args.ms_mib)
            lines.append(f"every column of a {args.ms_mib} MiB MeasurementSet, cache dropped, "
                         "best of 3: "
                         f"python-casacore 3.8 natively {native_seconds:.2f} s, casacore 3.5 "
                         f"through the view {legacy_seconds:.2f} s, ratio "
                         f"{native_seconds / legacy_seconds:.2f} (target >= 0.8)")
        if "small" in parts:
            lines += small_files_figures(tmp, pool, quick=args.quick)
        if "toolbox" in parts:
            print(f"pack / unpack / check of a {args.tree_mib} MiB tree (2 rounds each, "
                  "alternating) ...", flush=True)
            rows += toolbox_figures(tmp, pool, args.tree_mib)
        if "remote" in parts:
            remote_rows, remote_lines = remote_figures(tmp, pool, size, args.ms_mib)
            rows += remote_rows
            lines += remote_lines
        if "bcolz" in parts:
            more_rows, more_lines = bcolz_figures(tmp, size)
            rows += more_rows
            lines += more_lines
        if "tiledb" in parts:
            tiledb_rows, tiledb_lines = tiledb_figures(tmp, args.tiledb_mib)
            rows += tiledb_rows
            lines += tiledb_lines
    print_rows(rows)
    if lines:
        print("\n" + "\n".join(lines))


def filler(pool):
    """``fill(offset, n)`` for write_container: bytes of ``pool``, repeated."""
    def fill(off, n):
        return (pool * (1 + n // len(pool)))[off % 4096:off % 4096 + n]
    return fill


def read_figures(tmp, pool, size, block_size):
    container = tmp / "big.mf"
    fill = filler(pool)

    print(f"building a {size >> 20} MiB virtual file, block size {block_size}, with CRCs ...",
          flush=True)
    write_container(container, [("big.bin", size, fill)], block_size, use_crc=True)
    drop_caches()
    direct_cold = read_through(container)
    direct_hot = max(read_through(container) for _ in range(3))
    me = [sys.executable, os.path.abspath(__file__)]
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


# ---------------------------------------------------------------- remote (S3) sources

REMOTE_CONCURRENCY = 8  # GETs in flight: the mount's default, and the baselines'
REMOTE_CHUNK = 8 << 20


def raw_get_figures(client, bucket, key, size):
    """GB/s of the object read whole, cache dropped before each, each client at its best
    with the mount's concurrency: ranged GETs in parallel threads with botocore and with
    obstore, s3fs's ``cat_ranges`` with as many in flight, and obstore's ``get_ranges``."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    import s3fs
    from obstore.store import S3Store

    starts = list(range(0, size, REMOTE_CHUNK))
    ends = [min(start + REMOTE_CHUNK, size) for start in starts]

    def parallel(get):
        with ThreadPoolExecutor(REMOTE_CONCURRENCY) as pool:
            return sum(pool.map(get, starts, ends))

    def botocore_get(start, end):
        return len(client.get_object(Bucket=bucket, Key=key,
                                     Range=f"bytes={start}-{end - 1}")["Body"].read())

    endpoint = client.meta.endpoint_url
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, max_concurrency=REMOTE_CONCURRENCY,
                           skip_instance_cache=True)
    store = S3Store(bucket, endpoint=endpoint, region="us-east-1",
                    access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                    secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                    client_options={"allow_http": True})
    mib, n = REMOTE_CHUNK >> 20, REMOTE_CONCURRENCY
    ways = {
        f"botocore, {n} ranged GETs of {mib} MiB in parallel":
            lambda: parallel(botocore_get),
        f"obstore, {n} ranged GETs of {mib} MiB in parallel": lambda: parallel(
            lambda start, end: len(obstore.get_range(store, key, start=start, end=end))),
        f"obstore get_ranges ({mib} MiB ranges)": lambda: sum(
            len(b) for b in obstore.get_ranges(store, key, starts=starts, ends=ends)),
        f"s3fs cat_ranges ({mib} MiB ranges, {n} in flight)": lambda: sum(
            len(b) for b in fs.cat_ranges([f"{bucket}/{key}"] * len(starts), starts, ends,
                                          batch_size=n)),
    }
    out = {}
    for name, read in ways.items():
        drop_caches()
        start = time.perf_counter()
        assert read() == size
        out[name] = size / (time.perf_counter() - start) / 1e9
    return out


def remote_figures(tmp, pool, size, ms_mib, rounds=3, read_rounds=8):
    """The remote section: SeaweedFS on loopback (as in tests/test_remote.py). The cold
    read is measured in ``read_rounds`` rounds, each the raw GETs then, at once, the mount
    and the pyfuse3 floors, in an order that turns each round (so each takes every
    place equally often), since a shared machine's load moves them all; the median
    round's ratio is reported."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.servers import CREDENTIALS, Seaweed

    os.environ.update(CREDENTIALS)
    (tmp / "weed").mkdir()
    server = Seaweed(tmp / "weed", volume_limit_mb=4096)
    rows, lines = [], []
    try:
        client = server.make_bucket("bench")
        print(f"remote: a {size >> 20} MiB virtual file on SeaweedFS ...", flush=True)
        container = tmp / "remote.mf"
        write_container(container, [("big.bin", size, filler(pool))], 4 << 20)
        with open(container, "rb") as f:
            client.put_object(Bucket="bench", Key="big.mf", Body=f)
        object_size = container.stat().st_size
        container.unlink()
        readers = {  # what reads the object through FUSE: command, file read, target
            "s3:// mount": (["mount.ctdsfs", "-f", "s3://bench/big.mf", str(tmp / "r1"), "-o",
                             f"endpoint_url={server.endpoint}"], tmp / "r1" / "big.bin", 0.8),
            **{f"pyfuse3 floor ({label})": (
                [sys.executable, pyfuse3_floor.__file__, "s3", library, server.endpoint,
                 "bench", "big.mf", str(tmp / "r1")], tmp / "r1" / "object", None)
               for library, label in (("botocore", "botocore GETs"), ("obstore", "obstore GETs"),
                                      ("memory", "the object in memory, no GETs"))}}
        # (GB/s, its round's best raw GB/s, CPU s per GiB of the daemon, SeaweedFS, the reader)
        seen = {name: [] for name in readers}
        best_raw = {}
        names = list(readers)
        for round_ in range(read_rounds):
            raw = raw_get_figures(client, "bench", "big.mf", object_size)
            for name, value in raw.items():
                best_raw[name] = max(best_raw.get(name, 0), value)
            turn = round_ % len(names)  # each reader takes each place in turn
            for name in names[turn:] + names[:turn]:
                command, path, _ = readers[name]
                with Mounted(command, str(tmp / "r1")) as m:
                    set_readahead(tmp / "r1")  # (ctdsfs sets its own; the floor gets the same)
                    drop_caches()
                    pids = (m.proc.pid, server.proc.pid, os.getpid())  # (this one reads)
                    before = [process_cpu_seconds(pid) for pid in pids]
                    speed = read_through(path)
                    used = [process_cpu_seconds(pid) - b for pid, b in zip(pids, before)]
                    gib = path.stat().st_size / 2 ** 30
                seen[name].append((speed, max(raw.values()), *(u / gib for u in used)))
        rows += [(f"raw GET: {name} (best round)", value, None, None)
                 for name, value in best_raw.items()]
        for name, (_, _, target) in readers.items():
            ordered = sorted(seen[name], key=lambda r: r[0] / r[1])
            median = ordered[read_rounds // 2]
            rows.append((f"{name}, first read, cold (median round, vs its raw)", *median[:2],
                         target))
            lines.append(f"{name}: cold read of the {size >> 20} MiB file, {read_rounds} rounds "
                         f"(raw GETs, then the mount and the floors in turn): ratios "
                         f"{', '.join(f'{r[0] / r[1]:.2f}' for r in ordered)}; CPU per GiB "
                         f"read: the daemon {', '.join(f'{r[2]:.2f}' for r in seen[name])} s, "
                         f"SeaweedFS {', '.join(f'{r[3]:.2f}' for r in seen[name])} s, "
                         f"the reader {', '.join(f'{r[4]:.2f}' for r in seen[name])} s")

        print(f"remote: every column of a {ms_mib} MiB MeasurementSet, s3:// vs local ...",
              flush=True)
        rows_ms = ms_mib * 2 ** 20 // 2048
        data = tmp / "ms-remote"
        data.mkdir()
        subprocess.run([sys.executable, "-c", MAKE_MS, str(rows_ms)], check=True, cwd=data)
        subprocess.run(["ctdsfs", "pack", "--quiet", str(data / "big.ms"), str(tmp / "ms.mf")],
                       check=True)
        with open(tmp / "ms.mf", "rb") as f:
            client.put_object(Bucket="bench", Key="ms.mf", Body=f)
        read_all = [sys.executable, "-c", READ_ALL]

        def seconds(path):
            drop_caches()
            return float(subprocess.run(read_all + [str(path)], check=True,
                                        capture_output=True, text=True).stdout)
        local_mount = ["mount.ctdsfs", "-f", str(tmp / "ms.mf"), str(tmp / "r2")]
        s3_mount = ["mount.ctdsfs", "-f", "s3://bench/ms.mf", str(tmp / "r3"), "-o",
                    f"endpoint_url={server.endpoint},cache_dir={tmp / 'chunks'},"
                    "cache_dir_size=2G"]
        with Mounted(s3_mount, str(tmp / "r3")):
            cold = seconds(tmp / "r3")  # the chunk directory starts empty
        local, warm = [], []  # alternated, each a new mount: the machine's mood hits both
        for _ in range(rounds):
            with Mounted(local_mount, str(tmp / "r2")):
                local.append(seconds(tmp / "r2"))
            with Mounted(s3_mount, str(tmp / "r3")):  # chunks from the directory
                warm.append(seconds(tmp / "r3"))
        local, warm = min(local), min(warm)
        lines.append(f"every column of a {ms_mib} MiB MeasurementSet (python-casacore 3.8), "
                     f"page cache dropped: local mount {local:.2f} s, s3:// mount cold "
                     f"{cold:.2f} s (ratio {local / cold:.2f}), a new s3:// mount with the "
                     f"cache_dir warm {warm:.2f} s (ratio {local / warm:.2f}; target >= 0.8; "
                     f"local and warm alternated, best of {rounds} each)")
    finally:
        server.close()
    return rows, lines


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



# ---------------------------------------------------------------- small files

def make_small_tree(root, pool, files, dirs, big_bytes):
    """``files`` files of 1-16 KiB spread over ``dirs`` directories, and one big file."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(1024, 16 * 1024 + 1, files)
    for d in range(dirs):
        (root / f"d{d:03}").mkdir(parents=True)
    for i, size in enumerate(sizes):
        start = int(rng.integers(0, len(pool) - size))
        (root / f"d{i % dirs:03}" / f"f{i:05}.bin").write_bytes(pool[start:start + size])
    with open(root / "big.bin", "wb") as f:
        for off in range(0, big_bytes, len(pool)):
            f.write(pool[:min(len(pool), big_bytes - off)])
    return int(sizes.sum()) + big_bytes


def fio_iops(path, block, jobs, seconds):
    """Random-read IOPS of ``jobs`` fio jobs on ``path`` (page cache as it is)."""
    import json
    out = subprocess.run(
        ["fio", "--name=r", f"--filename={path}", "--rw=randread", f"--bs={block}",
         f"--numjobs={jobs}", "--ioengine=psync", "--time_based", f"--runtime={seconds}",
         "--group_reporting", "--invalidate=0", "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["jobs"][0]["read"]["iops"]


def process_memory_mb(pid, field="VmRSS"):
    """A memory figure of process ``pid`` from /proc (VmRSS now, VmHWM its peak), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def process_cpu_seconds(pid):
    """User plus system CPU seconds process ``pid`` has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _shell_seconds(command, cwd):
    start = time.perf_counter()
    subprocess.run(command, shell=True, check=True, cwd=cwd, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


SMALL_WORKLOADS = (  # (row, shell command run inside the mount, cache dropped first)
    ("find MNT -type f (cold mount)", "find . -type f"),
    ("ls -lR MNT", "ls -lR ."),
    ("tar of every file to a pipe", "tar cf - . | cat > /dev/null"),
)


def small_files_figures(tmp, pool, quick=False):
    """find, ls -lR, tar and fio through ctdsfs, the pyfuse3 floor (pyfuse3_floor.py),
    ratarmount and squashfuse_ll, and directly, on the same tree; best of 3 fresh mounts
    with the page cache dropped."""
    files, dirs, big = (2000, 20, 64 << 20) if quick else (20_000, 200, 1 << 30)
    rounds, fio_seconds = (1, 2) if quick else (3, 5)
    tree = tmp / "small"
    print(f"building {files} files of 1-16 KiB in {dirs} directories and a "
          f"{big >> 20} MiB file; packing, tar, mksquashfs ...", flush=True)
    total = make_small_tree(tree, pool, files, dirs, big)
    packed = subprocess.run(["ctdsfs", "pack", "--quiet", str(tree), str(tmp / "small.mf")],
                            check=True, capture_output=True, text=True)
    subprocess.run(["tar", "cf", str(tmp / "small.tar"), "-C", str(tree), "."], check=True)
    subprocess.run(["mksquashfs", str(tree), str(tmp / "small.sqfs"), "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    pyfuse3_floor.save_listing(tree, tmp / "small.listing")  # the floor's "index"
    systems = {  # name -> (command without the mount point, container or None)
        "ctdsfs": ([installed_command("mount.ctdsfs"), "-f", str(tmp / "small.mf")],
                   tmp / "small.mf"),
        "pyfuse3 floor": ([sys.executable, pyfuse3_floor.__file__, str(tmp / "small.listing"),
                           str(tree)], None),
        "ratarmount": ([installed_command("ratarmount"), "-f", str(tmp / "small.tar")],
                       tmp / "small.tar"),
        "squashfuse_ll": (["squashfuse_ll", "-f", str(tmp / "small.sqfs")], tmp / "small.sqfs"),
    }
    with Mounted(systems["ratarmount"][0] + [str(tmp / "mr")], str(tmp / "mr")):
        pass  # ratarmount writes its index on the first mount: not part of the figures
    with Mounted(systems["ctdsfs"][0] + [str(tmp / "mc")], str(tmp / "mc")):
        _shell_seconds("find . -type f", tmp / "mc")  # ctdsfs's index (-o no_index: none)
    best = {}  # (row, system) -> best value

    def keep(row, system, value, larger_is_better=False):
        old = best.get((row, system))
        better = old is None or (value > old if larger_is_better else value < old)
        best[row, system] = value if better else old

    for _ in range(rounds):
        for system, (cmd, image) in systems.items():
            mnt = tmp / f"m-{system.replace(' ', '-')}"
            for row, command in SMALL_WORKLOADS:
                drop_caches()
                with Mounted(cmd + [str(mnt)], str(mnt)) as m:
                    keep("mount of the tree's container, cold", system, m.mount_seconds)
                    keep(row, system, _shell_seconds(command, mnt))
                    if command.startswith("tar"):
                        keep("daemon RSS after the tar (MB)", system, process_memory_mb(m.proc.pid))
            if image:  # the container unread; the program's own files (and index) warm
                evict(image)
            with Mounted(cmd + [str(mnt)], str(mnt)) as m:
                keep("mount of the tree's container, Python's files warm", system,
                     m.mount_seconds)
            with Mounted(cmd + [str(mnt)], str(mnt)):
                read_through(mnt / "big.bin")  # random reads from the page cache, as direct
                for block, jobs in (("4k", 1), ("4k", 4), ("64k", 4)):
                    keep(f"fio randread {block}, {jobs} job(s) (IOPS)", system,
                         fio_iops(mnt / "big.bin", block, jobs, fio_seconds), True)
        for row, command in SMALL_WORKLOADS:
            drop_caches()
            keep(row, "direct", _shell_seconds(command, tree))
        read_through(tree / "big.bin")
        for block, jobs in (("4k", 1), ("4k", 4), ("64k", 4)):
            keep(f"fio randread {block}, {jobs} job(s) (IOPS)", "direct",
                 fio_iops(tree / "big.bin", block, jobs, fio_seconds), True)
    for system, (_, image) in systems.items():  # the floor serves the plain tree
        best["container size (MB)", system] = (image.stat().st_size if image else total) / 1e6
    best["container size (MB)", "direct"] = total / 1e6
    columns = ("ctdsfs", "pyfuse3 floor", "ratarmount", "squashfuse_ll", "direct")
    rows = dict.fromkeys(row for row, _ in best)
    rows = {**dict.fromkeys(row for row in rows if row.startswith("mount")), **rows}
    width = max(42, *map(len, rows))
    lines = [f"small files: {files} files of 1-16 KiB in {dirs} directories and a "
             f"{big >> 20} MiB file, best of {rounds}; {packed.stdout.strip()}",
             f"{'workload':<{width}}" + "".join(f"{c:>14}" for c in columns)
             + f"{'vs ratar':>10}{'vs squash':>10}{'vs floor':>10}"]
    for row in rows:
        values = [best.get((row, c)) for c in columns]
        cells = "".join(f"{v:14.3f}" if v is not None else f"{'':>14}" for v in values)
        ours, floor, ratar, squash = values[:4]
        faster = "IOPS" in row  # larger is better: ours / theirs, else theirs / ours
        ratios = "".join(f"{(ours / v if faster else v / ours):10.2f}"
                         for v in (ratar, squash, floor))
        lines.append(f"{row:<{width}}{cells}{ratios}")
    lines.append("(ratios > 1: ctdsfs better; goals: >= 1 vs ratarmount, >= 0.5 vs squashfuse_ll;"
                 " the pyfuse3 floor: the thinnest pyfuse3+trio file system, everything"
                 " precomputed, what any pyfuse3+trio file system pays at least)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
