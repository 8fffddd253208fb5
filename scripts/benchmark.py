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
    table view / python-casacore 3.8 reading the MultiFile original >= 0.8; beside
    it casacore's cold random reads (getcol of random 16-row ranges of the tiled
    column, page cache dropped, a fresh mount) through ctdsfs / on local disk
  pack and unpack of a >= 1 GiB tree / cp -r of the same tree >= 0.7
  check: CRC-verified blocks >= 1 GB/s
  small files (20,000 of 1-16 KiB in 200 directories and a 1 GiB file), the same
    bytes through ctdsfs (a packed container), ratarmount (a tar), squashfuse_ll
    (a squashfs image) and directly: find, ls -lR, tar of every file and fio random
    reads at least as fast as ratarmount and within 2x of squashfuse_ll (4 KiB
    reads >= 0.5x its IOPS), mount < 0.2 s, daemon RSS after the tar < 40 MB; beside
    them the "pyfuse3 floor", the thinnest pyfuse3+trio file system serving the
    same tree, everything precomputed: the least any pyfuse3+trio file system pays;
    fio runs warm (the file read whole first: the kernel's page cache answers) and
    cold (page cache dropped, a fresh mount, each job reads its own share once:
    every read reaches the daemon), 4 KiB with 1 and 4 jobs and 64 KiB with 4 jobs;
    cold 4 KiB >= 0.5x squashfuse_ll, cold 64 KiB >= the best peer
  remote (a SeaweedFS on loopback): cold sequential read of a 1 GiB virtual file
    through an s3:// mount / the best raw GET throughput of the object >= 0.8,
    beside it pyfuse3 floors for that read (the thinnest pyfuse3+trio file system
    serving the object by the raw botocore or obstore GETs, or from memory) and the CPU
    each pays per GiB;
    every column of a MeasurementSet through an s3:// mount / a local mount
  columns: every tiled column of a ~120 MB MeasurementSet (--columns-ms-mib) as NumPy:
    numpy.load of columns/NAME.npy through a fresh -o columns mount / python-casacore
    getcol of the same files >= 1 (medians of alternated rounds), beside them the pyfuse3
    floor: the same columns' .npy (saved from getcol) served from memory by the thinnest
    pyfuse3+trio file system, numpy.load through it / getcol; the same through fsspec
    from SeaweedFS by 2 Dask worker processes / getcol from local disk; the bytes a
    100-row read of DATA fetches beyond its rows
  xarray: a ~250 MB MeasurementSet (--xarray-ms-mib, DATA and FLAG in TiledShapeStMan)
    opened as a DataTree and VISIBILITY and FLAG loaded, cold, in a fresh process: the
    ctdsfs engine / xarray-ms 0.5 on the same files <= 1 (medians of --rounds alternated
    rounds); beside it opening an MS of 1M rows with both, and the MS packed on SeaweedFS
    through s3:// on 2 Dask workers against xarray-ms on the local MS (the ratio)
  optional part "bcolz" (only when named in --parts): a float64 carray (lz4, shuffle,
    --bcolz-mib) by np.load of array.npy through a fresh mount, cache dropped / bcolz.open()[:]
    >= 1, and random 1000-item slices through numpy.load(mmap_mode="r") within 1.5x of
    carr[i:j] (medians of --rounds alternated rounds); beside them both at the 1 MiB
    readahead of other mounts, the pyfuse3 floor of both (the decoded array from memory;
    for slices also answered from a thread), and the read-around floor of the slices
    (the superchunks each fault's readahead window covers, read from disk)
  optional part "workers": ctdsfs with one worker process and with the default, beside
    squashfuse_ll and the pyfuse3 floor: cold 4 KiB random reads with 1, 4 and 16 fio jobs
    (with the default >= 0.9x squashfuse_ll), a cold sequential read, find and tar of a
    small tree; 1, 2 and 4 parallel readers of decoded views (TileDB dense/, bcolz
    array.npy, columns/DATA.npy): more readers faster than one (scripts/benchmark_workers.py)
  optional part "tiledb": a BYTESHUFFLE+ZSTD float64 dense TileDB array of one fragment
    (--tiledb-mib) by np.load of dense/v.npy and of the fragment's v.npy through a fresh
    mount, cache dropped / tiledb-py A[:] >= 1, beside them the pyfuse3 floor (A[:] saved
    as .npy, served from memory by the thinnest pyfuse3+trio file system); random
    1000-item slices through numpy.load(mmap_mode="r") within 1.5x of A[i:j] (medians of
    --rounds alternated rounds); listing an array of 1,000 fragments < 1 s

Needs root (drop_caches, mounting). On a VM whose kernel hands freed memory back to its
host (free page reporting), that is held off while it runs (see freed_memory_kept).
Usage:
  python3 scripts/benchmark.py [--size-mib 1024] [--block-size 65536] [--dir DIR] [--quick]
                               [--parts read,write,many,legacy,toolbox,small,remote,columns,xarray[,bcolz,tiledb,workers,compressed]]
"""

import argparse
import compileall
import sys
import tempfile
from pathlib import Path

import numpy as np

import ctdsfs
from benchmark_bcolz import bcolz_figures
from benchmark_columns import columns_figures, compressed_figures
from benchmark_common import freed_memory_kept
from benchmark_legacy import RANDOM_RANGES, legacy_view_ratio
from benchmark_many import many_files_figures
from benchmark_read import read_figures, serve_passthrough
from benchmark_remote import remote_figures
from benchmark_small import small_files_figures
from benchmark_tiledb import tiledb_figures
from benchmark_toolbox import toolbox_figures
from benchmark_workers import workers_figures
from benchmark_write import write_figures
from benchmark_xarray import xarray_figures


def print_rows(rows):
    print(f"\n{'measurement':<56} {'GB/s':>6} {'ratio':>6} {'target':>7}")
    for name, value, base, target in rows:
        ratio = f"{value / base:6.2f}" if base else ""
        goal = f">= {target}" if target else ""
        print(f"{name:<56} {value:6.2f} {ratio:>6} {goal:>7}")


PARTS = ("read", "write", "many", "legacy", "toolbox", "small", "remote", "columns",
         "xarray")

# run only when --parts names them; "compressed": the columns part's Dysco and Sisco lines
OPTIONAL_PARTS = ("bcolz", "tiledb", "workers", "compressed")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="virtual file size (MiB)")
    parser.add_argument("--block-size", type=int, default=65536, help="container block size")
    parser.add_argument("--dir", default=None, help="scratch directory (default: /var/tmp)")
    parser.add_argument("--ms-mib", type=int, default=512,
                        help="MeasurementSet size for the legacy view measurement (MiB)")
    parser.add_argument("--columns-ms-mib", type=int, default=120,
                        help="MeasurementSet size for the columns part (MiB)")
    parser.add_argument("--columns-rounds", type=int, default=5,
                        help="alternated rounds of each reader in the columns part")
    parser.add_argument("--tree-mib", type=int, default=1100,
                        help="directory tree size for pack/unpack (MiB)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS + OPTIONAL_PARTS)} "
                             f"(default: {','.join(PARTS)})")
    parser.add_argument("--xarray-ms-mib", type=int, default=250,
                        help="DATA size of the MeasurementSet of the xarray part (MiB)")
    parser.add_argument("--tiledb-mib", type=int, default=200,
                        help="BYTESHUFFLE+ZSTD float64 dense TileDB array size (MiB)")
    parser.add_argument("--bcolz-mib", type=int, default=300,
                        help="lz4 float64 bcolz carray size (MiB)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternated rounds of the bcolz, tiledb and xarray parts "
                             "(medians)")
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
    with freed_memory_kept(), \
            tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="ctdsfs-bench.") as tmp:
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
            native_seconds, legacy_seconds, native_random, mounted_random = \
                legacy_view_ratio(tmp, args.ms_mib)
            lines.append(f"every column of a {args.ms_mib} MiB MeasurementSet, cache dropped, "
                         "best of 3: "
                         f"python-casacore 3.8 natively {native_seconds:.2f} s, casacore 3.5 "
                         f"through the view {legacy_seconds:.2f} s, ratio "
                         f"{native_seconds / legacy_seconds:.2f} (target >= 0.8)")
            lines.append(f"casacore's cold random reads: getcol of {RANDOM_RANGES} random "
                         "16-row ranges of the tiled DATA column, cache dropped, best of 3: "
                         f"the MultiFile on local disk {native_random:.2f} s, through a fresh "
                         f"ctdsfs mount {mounted_random:.2f} s, ratio "
                         f"{native_random / mounted_random:.2f}")
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
        if "columns" in parts:
            lines += columns_figures(tmp, args.columns_ms_mib, args.columns_rounds)
        elif "compressed" in parts:
            lines += compressed_figures(tmp, args.columns_rounds)
        if "xarray" in parts:
            lines += xarray_figures(tmp, args.xarray_ms_mib, args.rounds)
        if "bcolz" in parts:
            more_rows, more_lines = bcolz_figures(tmp, args.bcolz_mib << 20, args.rounds)
            rows += more_rows
            lines += more_lines
        if "tiledb" in parts:
            tiledb_rows, tiledb_lines = tiledb_figures(tmp, args.tiledb_mib, args.rounds)
            rows += tiledb_rows
            lines += tiledb_lines
        if "workers" in parts:
            lines += workers_figures(tmp, pool, quick=args.quick)
    print_rows(rows)
    if lines:
        print("\n" + "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
