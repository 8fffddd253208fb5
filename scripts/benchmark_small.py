"""The benchmark's "small" part: 20,000 small files and a 1 GiB file through ctdsfs and its
peers, the pyfuse3 floor, ratarmount and squashfuse_ll, and directly: find, ls -lR, tar,
fio random reads, mount time and the daemon's memory.

fio's random reads run twice: warm (the file read whole first, so reads come from the
kernel's page cache of the mount and never reach the daemon) and cold (page cache dropped,
a fresh mount, nothing read before: every read reaches the daemon and the disk, as on
casacore's first pass over a MeasurementSet; each job reads its own share of the file,
every block once)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import pyfuse3_floor  # (beside this script)
from benchmark_common import Mounted, drop_caches, process_memory_mb, read_through


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


FIO_CASES = (("4k", 1), ("4k", 4), ("64k", 4))  # (block, jobs)


def fio_iops(path, block, jobs, seconds, cold=False):
    """Random-read IOPS of ``jobs`` fio jobs on ``path`` (page cache as it is) for
    ``seconds``. ``cold``: each job reads its own 1/``jobs`` of the file in random order,
    every block once, until done or ``seconds`` (a warm run loops over the whole file)."""
    import json
    share = [f"--size={100 // jobs}%", f"--offset_increment={100 // jobs}%"] if cold \
        else ["--time_based"]
    out = subprocess.run(
        ["fio", "--name=r", f"--filename={path}", "--rw=randread", f"--bs={block}",
         f"--numjobs={jobs}", "--ioengine=psync", *share, f"--runtime={seconds}",
         "--group_reporting", "--invalidate=0", "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["jobs"][0]["read"]["iops"]


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
    """find, ls -lR, tar and fio (warm and cold) through ctdsfs, the pyfuse3 floor
    (pyfuse3_floor.py), ratarmount and squashfuse_ll, and directly, on the same tree; best
    of 3 fresh mounts with the page cache dropped."""
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
                for block, jobs in FIO_CASES:
                    keep(f"fio randread {block}, {jobs} job(s) (IOPS)", system,
                         fio_iops(mnt / "big.bin", block, jobs, fio_seconds), True)
            for block, jobs in FIO_CASES:
                drop_caches()
                with Mounted(cmd + [str(mnt)], str(mnt)):
                    keep(f"fio randread {block}, {jobs} job(s), cold (IOPS)", system,
                         fio_iops(mnt / "big.bin", block, jobs, fio_seconds, cold=True), True)
        for row, command in SMALL_WORKLOADS:
            drop_caches()
            keep(row, "direct", _shell_seconds(command, tree))
        read_through(tree / "big.bin")
        for block, jobs in FIO_CASES:
            keep(f"fio randread {block}, {jobs} job(s) (IOPS)", "direct",
                 fio_iops(tree / "big.bin", block, jobs, fio_seconds), True)
        for block, jobs in FIO_CASES:
            drop_caches()
            keep(f"fio randread {block}, {jobs} job(s), cold (IOPS)", "direct",
                 fio_iops(tree / "big.bin", block, jobs, fio_seconds, cold=True), True)
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
                 " precomputed, what any pyfuse3+trio file system pays at least;"
                 " fio warm: the file read whole first, its reads never reach the daemon;"
                 " cold: page cache dropped, a fresh mount, each job reads its own share"
                 " once)")
    return lines

