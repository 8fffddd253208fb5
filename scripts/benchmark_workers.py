"""The benchmark's "workers" part: ctdsfs served by one worker process (``-o workers=1``)
and by the default number, beside squashfuse_ll and the pyfuse3 floor.

- cold 4 KiB random reads of a large file with 1, 4 and 16 fio jobs (page cache dropped,
  a fresh mount, each job reading its own share once);
- a cold sequential read of that file; ``find`` and ``tar`` of a tree of small files;
- decoded views (a TileDB ``dense/v.npy``, a bcolz ``array.npy``, ``columns/DATA.npy`` of a
  MeasurementSet): the whole file read by 1, 2 and 4 readers in parallel, each its own
  share in 1 MiB reads (page cache dropped, a fresh mount each time; timed from the
  moment every reader has started), with the mount's CPU seconds and the share of the
  cores busy, beside the view's source files read cold as they are (the disk's part of
  the floor). The section runs alone with ``--views`` (see ``main``).

Best of ``rounds`` for each figure. The target: with the default, cold 4 KiB random reads
at least 0.9x squashfuse_ll at every job count, one reader no slower than with one
worker, parallel readers of a decoded view faster than one.

Run alone with ``--walks``, it times only the walks (``find`` and ``tar``: 1 worker, the
default, squashfuse_ll, alternated within each round) with the CPU seconds of the
mount's processes; with ``--views``, only the decoded views (``--workers 1,2,default``
compared in one run)."""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyfuse3_floor  # (beside this script)
from benchmark_common import Mounted, busy_share, cores_busy, cpu_seconds, drop_caches, read_through
from benchmark_small import _shell_seconds, fio_iops, installed_command, make_small_tree
from benchmark_tiledb import smooth_values, write_dense_array

JOBS = (1, 4, 16)
WALKS = (("find, cold (s)", "find . -type f"),
         ("tar to a pipe, cold (s)", "tar cf - . | cat > /dev/null"))
READERS = (1, 2, 4)
SHARE_READER = r"""
import os, sys
part, parts, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
files = [(os.open(p, os.O_RDONLY), os.path.getsize(p)) for p in paths]
total = sum(size for _, size in files)
start, end = total * part // parts, total * (part + 1) // parts
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.readline()  # (the start: every reader is ready)
at = 0
for fd, size in files:  # (the files one after another; this reader's bytes of them)
    lo, hi = max(start, at) - at, min(end, at + size) - at
    while lo < hi:
        got = os.pread(fd, min(1 << 20, hi - lo), lo)
        if not got:
            break
        lo += len(got)
    at += size
"""


def _parallel_seconds(paths, readers):
    """Seconds for ``readers`` processes to read ``paths`` whole (one after another), each
    its own share of their bytes, from the moment all of them are started and have the
    files open (Python's start, which several readers pay side by side on the same cores,
    is not the file system's), and the share of all the cores busy meanwhile (near 1: the
    machine, not the mount, is the floor)."""
    procs = [subprocess.Popen([sys.executable, "-c", SHARE_READER, str(i), str(readers)]
                              + [str(p) for p in paths], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(readers)]
    for proc in procs:
        if proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"a reader of {paths[0]} failed to start")
    busy = cores_busy()
    began = time.perf_counter()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        if proc.wait():
            raise RuntimeError(f"a reader of {paths[0]} failed")
    return time.perf_counter() - began, busy_share(busy, cores_busy())


def _source_files(source):
    """Every regular file of a view's source (a directory), largest first."""
    found = [Path(top) / name for top, _, names in os.walk(source) for name in names]
    return sorted((p for p in found if p.is_file() and not p.is_symlink()),
                  key=lambda p: -p.stat().st_size)


def _decoded_views(tmp, mib):
    """{name: (source to mount, options, the view's path in the mount)}."""
    import bcolz

    values = smooth_values(mib)
    uri = str(tmp / "w_tiledb")
    if not os.path.exists(uri):  # (a directory kept from an earlier run has them all)
        write_dense_array(uri, values)
        carr = bcolz.carray(values, rootdir=str(tmp / "w_bcolz"), mode="w",
                            cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=1))
        carr.flush()
        subprocess.run([sys.executable, os.path.join(
            os.path.dirname(__file__), os.pardir, "tests", "formats", "casacore",
            "casacore_column_tables.py"), "ms", str(tmp / "w_columns.ms"),
            str(max(256, (mib << 20) // 2163))], check=True)
    ms = tmp / "w_columns.ms"
    return {"TileDB dense/v.npy": (uri, [], "dense/v.npy"),
            "bcolz array.npy": (str(tmp / "w_bcolz"), [], "array.npy"),
            "columns/DATA.npy": (str(ms), ["columns"], "columns/DATA.npy")}


def _small_tree_systems(tmp, pool, files, dirs, big):
    """The tree of small files (and a big one) packed and squashed: {system: mount command
    without its mount point}."""
    tree = tmp / "w_small"
    make_small_tree(tree, pool, files, dirs, big)
    subprocess.run(["ctdsfs", "pack", "--quiet", str(tree), str(tmp / "w_small.mf")],
                   check=True, capture_output=True)
    subprocess.run(["mksquashfs", str(tree), str(tmp / "w_small.sqfs"), "-noappend", "-quiet",
                    "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    mount_ctdsfs = installed_command("mount.ctdsfs")
    return tree, {
        "ctdsfs, 1 worker": [mount_ctdsfs, "-f", "-o", "workers=1", str(tmp / "w_small.mf")],
        "ctdsfs, default": [mount_ctdsfs, "-f", str(tmp / "w_small.mf")],
        "squashfuse_ll": ["squashfuse_ll", "-f", str(tmp / "w_small.sqfs")],
    }


def _walk(cmd, mnt, command):
    """(seconds, CPU seconds of the mount's processes) of ``command`` in a fresh mount,
    page cache dropped."""
    drop_caches()
    with Mounted(cmd + [str(mnt)], str(mnt)) as mounted:
        before = cpu_seconds(mounted.proc.pid)
        seconds = _shell_seconds(command, mnt)
        return seconds, cpu_seconds(mounted.proc.pid) - before


def walks_figures(tmp, pool, files=20_000, dirs=200, big=512 << 20, rounds=3):
    """The walks alone (``--walks``): best and median seconds, median CPU seconds of the
    mount's processes, each system in turn within a round. One walk of each ctdsfs mount
    before the rounds fills the index of plain files, as any mount after the first finds it."""
    _, systems = _small_tree_systems(tmp, pool, files, dirs, big)
    mnt = tmp / "w_mnt"
    for system in ("ctdsfs, 1 worker", "ctdsfs, default"):
        _walk(systems[system], mnt, WALKS[0][1])
    times = {}
    for _ in range(rounds):
        for row, command in WALKS:
            for system, cmd in systems.items():
                times.setdefault((row, system), []).append(_walk(cmd, mnt, command))
    lines = [f"walks ({os.cpu_count()} cores; the default: {_default_workers()} workers; "
             f"{files} files in {dirs} directories and a {big >> 20} MiB file), {rounds} "
             "rounds: best / median seconds [median CPU seconds of the mount's processes]"]
    for row, _ in WALKS:
        cells = []
        for system in systems:
            seconds = [t for t, _ in times[row, system]]
            cpu = statistics.median(c for _, c in times[row, system])
            cells.append(f"{system}: {min(seconds):.3f} / {statistics.median(seconds):.3f} "
                         f"[{cpu:.2f}]")
        one, default = (statistics.median(t for t, _ in times[row, s])
                        for s in ("ctdsfs, 1 worker", "ctdsfs, default"))
        lines.append(f"  {row:<24} " + "   ".join(cells)
                     + f"   1 worker/default (medians): {one / default:.2f}")
    return lines


def workers_figures(tmp, pool, quick=False, rounds=2):
    """The lines of the part (see the module docstring)."""
    files, dirs, big, view_mib = (2000, 20, 128 << 20, 32) if quick \
        else (20_000, 200, 512 << 20, 128)
    rounds = 1 if quick else rounds
    fio_seconds = 5 if quick else 20
    print(f"workers: {files} small files and a {big >> 20} MiB file; decoded views of "
          f"{view_mib} MiB ...", flush=True)
    tree, systems = _small_tree_systems(tmp, pool, files, dirs, big)
    mount_ctdsfs = systems["ctdsfs, 1 worker"][0]
    pyfuse3_floor.save_listing(tree, tmp / "w_small.listing")
    systems["pyfuse3 floor"] = [sys.executable, pyfuse3_floor.__file__,
                                str(tmp / "w_small.listing"), str(tree)]
    best = {}

    def keep(row, system, value, larger_is_better):
        old = best.get((row, system))
        best[row, system] = value if old is None or (value > old) == larger_is_better \
            else old

    mnt = tmp / "w_mnt"
    for _ in range(rounds):
        for system, cmd in systems.items():
            for jobs in JOBS:
                drop_caches()
                with Mounted(cmd + [str(mnt)], str(mnt)):
                    keep(f"fio randread 4k, {jobs} job(s), cold (IOPS)", system,
                         fio_iops(mnt / "big.bin", "4k", jobs, fio_seconds, cold=True), True)
            drop_caches()
            with Mounted(cmd + [str(mnt)], str(mnt)):
                keep("sequential read, cold (GB/s)", system,
                     read_through(mnt / "big.bin"), True)
            for row, command in WALKS:
                keep(row, system, _walk(cmd, mnt, command)[0], False)
    lines = [f"workers ({os.cpu_count()} cores; the default: "
             f"{_default_workers()} workers), best of {rounds}",
             f"{'workload':<44}" + "".join(f"{s:>18}" for s in systems)
             + f"{'default/squash':>16}{'default/1':>11}"]
    for row in dict.fromkeys(r for r, _ in best):
        values = [best.get((row, s)) for s in systems]
        one, default, squash = values[0], values[1], values[2]
        faster = not row.endswith("(s)")
        lines.append(f"{row:<44}" + "".join(f"{v:18.3f}" for v in values)
                     + f"{(default / squash if faster else squash / default):16.2f}"
                     + f"{(default / one if faster else one / default):11.2f}")
    lines += _view_lines(tmp, view_mib, mount_ctdsfs, rounds)
    return lines


def _default_workers(decoded=False):
    from ctdsfs.mount import default_workers

    return default_workers(remote=False, decoded=decoded)


def _daemon_cpu_seconds(pid):
    """CPU seconds the mount's daemon and its live workers have spent so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in [pid] + _children(pid):
        try:
            with open(f"/proc/{proc}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(v) for v in fields[11:15 if proc == pid else 13])
    return total / ticks


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _view_lines(tmp, mib, mount_ctdsfs, rounds, settings=("workers=1", None), only=None):
    """Seconds to read each decoded view whole by 1, 2, 4 readers with each of the worker
    ``settings`` (an ``-o`` item, None: the default), and the CPU seconds the mount's
    processes spent meanwhile (less sensitive to other load than the time). The rounds
    alternate the settings, so that load from elsewhere falls on each alike."""
    views = {name: view for name, view in _decoded_views(tmp, mib).items()
             if only is None or any(o.lower() in name.lower() for o in only.split(","))}
    names = [s or f"default ({_default_workers(True)})" for s in settings]
    lines = [f"decoded views ({mib} MiB of float64 each): seconds to read the view whole by "
             f"{', '.join(map(str, READERS))} readers in parallel (each its share), "
             f"best of {rounds}, with {' / '.join(names)}; in [] the CPU seconds of the "
             f"mount's processes (daemon and workers), least of the rounds; cores busy: the "
             f"share of all {os.cpu_count()} cores in use during the best round"]
    mnt = tmp / "w_view"
    for name, (source, options, inside) in views.items():
        times, cpus, busy = {}, {}, {}
        files = _source_files(source)
        for _ in range(rounds):
            for readers in READERS:  # (the floor: the source's files read, no decoding)
                drop_caches()
                seconds, share = _parallel_seconds(files, readers)
                if seconds < times.get(("raw", readers), float("inf")):
                    times["raw", readers], busy["raw", readers] = seconds, share
            for setting in settings:
                opts = ",".join(options + ([setting] if setting else []))
                cmd = [mount_ctdsfs, "-f", source] + (["-o", opts] if opts else [])
                for readers in READERS:
                    with Mounted(cmd + [str(mnt)], str(mnt)) as mounted:
                        drop_caches()
                        before = _daemon_cpu_seconds(mounted.proc.pid)
                        seconds, share = _parallel_seconds([mnt / inside], readers)
                        cpu = _daemon_cpu_seconds(mounted.proc.pid) - before
                    key = setting, readers
                    if seconds < times.get(key, float("inf")):
                        times[key], busy[key] = seconds, share
                    cpus[key] = min(cpus.get(key, cpu), cpu)
        mib = sum(f.stat().st_size for f in files) / (1 << 20)
        lines.append(f"  {name:<22} {'source files':<13}" + " ".join(
            f"{times['raw', r]:6.2f}" for r in READERS) + f"   ({mib:.0f} MiB read as they "
            "are, cold: the disk's part of the floor)   cores busy [" + " ".join(
            f"{busy['raw', r]:4.0%}" for r in READERS) + "]")
        for setting, label in zip(settings, names):
            lines.append(f"  {name:<22} {label:<13}" + " ".join(
                f"{times[setting, r]:6.2f}" for r in READERS) + "   CPU [" + " ".join(
                f"{cpus[setting, r]:5.2f}" for r in READERS) + "]   cores busy [" + " ".join(
                f"{busy[setting, r]:4.0%}" for r in READERS) + "]"
                + f"   ({READERS[-1]} readers vs 1: "
                f"{times[setting, READERS[0]] / times[setting, READERS[-1]]:.2f}x)")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    part = parser.add_mutually_exclusive_group(required=True)
    part.add_argument("--walks", action="store_true", help="time only the walks (find, tar)")
    part.add_argument("--views", action="store_true", help="the decoded views' section only")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--files", type=int, default=20_000, help="--walks: small files")
    parser.add_argument("--mib", type=int, default=32, help="--views: size of each view (MiB)")
    parser.add_argument("--workers", default="1,default",
                        help="--views: worker counts to compare, in one run (e.g. 1,2,default)")
    parser.add_argument("--only", help="--views: only the views whose name has one of these "
                        "(e.g. tiledb,bcolz)")
    parser.add_argument("--keep", help="--views: a directory for the views, made once and "
                        "reused")
    parser.add_argument("--dir", default="/var/tmp", help="scratch directory")
    args = parser.parse_args()
    if args.walks:
        import numpy as np

        pool = np.random.default_rng(0).bytes(1 << 24)
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="ctdsfs-walks.") as tmp:
            for line in walks_figures(Path(tmp), pool, files=args.files,
                                      dirs=max(1, args.files // 100), rounds=args.rounds):
                print(line, flush=True)
        return
    settings = tuple(None if w == "default" else f"workers={int(w)}"
                     for w in args.workers.split(","))
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(
            tempfile.TemporaryDirectory(dir=args.dir, prefix="ctdsfs-bench."))
        print("\n".join(_view_lines(Path(tmp), args.mib, installed_command("mount.ctdsfs"),
                                     args.rounds, settings, args.only)))


if __name__ == "__main__":
    main()
