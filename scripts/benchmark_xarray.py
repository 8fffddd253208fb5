"""The xarray part of the benchmark: open an MS as a DataTree and load VISIBILITY and FLAG,
with the ``ctdsfs`` engine and with xarray-ms (``xarray-ms:msv2``) on the same files.

The MS (tests/xarray_backend/ms_writer.py, python-casacore): 64 antennas without autocorrelations (2016
baselines), 64 channels x 4 correlations, DATA and FLAG in TiledShapeStMan, one spectral
window; ``--mib`` sets its DATA size through the number of times. Beside it the open cost:
an MS of 1M rows (1 channel x 1 correlation) opened alone. Each round opens the MS
in a fresh process (its imports done before the clock starts) with the MS's files evicted
from the page cache first (``posix_fadvise(DONTNEED)``: only these files, not the shared
machine's whole cache), so every read comes from disk; the engines alternate, and the
median and best of the rounds are reported. The machine is shared: figures are indicative.

    python3 scripts/benchmark_xarray.py [--mib 250] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES, CELL_BYTES = 2016, 64 * 4 * 8

# dask.array is imported before the clock too: xarray imports it when it makes the first
# Variable of either engine, a second or more that would only add noise to both
CHILD = """
import sys, time, warnings
import dask.array
import xarray as xr
engine = sys.argv[2]
if engine == "ctdsfs":
    from ctdsfs.xarray_backend import CtdsfsBackendEntrypoint as engine
else:
    import xarray_ms  # noqa: F401 (imported before the clock starts)
warnings.simplefilter("ignore")
start = time.perf_counter()
tree = xr.open_datatree(sys.argv[1], engine=engine)
opened = time.perf_counter() - start
if sys.argv[3] == "load":
    for name in tree.children:
        tree[name].VISIBILITY.values, tree[name].FLAG.values
print(opened, time.perf_counter() - start)
"""
ENGINES = ("ctdsfs", "xarray-ms:msv2")


def evict(path):
    """The MS's files out of the page cache (cold reads), leaving other files alone."""
    for folder, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_round(ms, engine, what):
    evict(ms)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", CHILD, ms, engine, what], check=True,
                         env=env, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def write_ms(ms, nant, ntime, nchan, corrs):
    spec = {"nant": nant, "ntime": ntime, "spws": [nchan], "pols": [corrs],
            "ddids": [[0, 0]], "autocorrs": False, "reversed": False, "missing": False,
            "fields": 1, "states": ["OBSERVE_TARGET#ON_SOURCE"], "weight_spectrum": False,
            "corrected": False}
    subprocess.run([sys.executable, str(ROOT / "tests" / "xarray_backend" / "ms_writer.py"), ms,
                    json.dumps(spec)], check=True)
    return sum(f.stat().st_size for f in Path(ms).rglob("*") if f.is_file()) / 2**20


def alternated(ms, rounds, what):
    """{engine: [(open seconds, total seconds)]} of ``rounds`` alternated cold rounds."""
    times = {engine: [] for engine in ENGINES}
    for _ in range(rounds):
        for engine in ENGINES:
            times[engine].append(one_round(ms, engine, what))
    return times


def xarray_figures(where, mib, rounds, open_rows=1_000_000):
    ntime = max(1, (mib << 20) // (BASELINES * CELL_BYTES))
    ms = str(Path(where) / "bench.ms")
    size = write_ms(ms, 64, ntime, 64, [9, 10, 11, 12])
    times = alternated(ms, rounds, "load")
    lines = [f"xarray: open_datatree + load VISIBILITY and FLAG, cold, {size:.0f} MiB MS "
             f"({ntime * BASELINES} rows), {rounds} rounds (median / best, open alone):"]
    for engine, got in times.items():
        total = [t for _, t in got]
        opened = [o for o, _ in got]
        lines.append(f"  {engine:15} {statistics.median(total):6.2f} s / {min(total):6.2f} s"
                     f"   (open {statistics.median(opened):.2f} s)")
    ratio = statistics.median(t for _, t in times["ctdsfs"]) / \
        statistics.median(t for _, t in times["xarray-ms:msv2"])
    lines.append(f"  ctdsfs / xarray-ms: {ratio:.2f}")
    many = str(Path(where) / "rows.ms")
    ntime = -(-open_rows // BASELINES)
    size = write_ms(many, 64, ntime, 1, [9])
    times = alternated(many, rounds, "open")
    lines.append(f"xarray: open_datatree alone, cold, {ntime * BASELINES} rows "
                 f"({size:.0f} MiB MS, 1 channel x 1 correlation), median / best:")
    for engine, got in times.items():
        opened = [o for o, _ in got]
        lines.append(f"  {engine:15} {statistics.median(opened):6.2f} s / {min(opened):6.2f} s")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=250, help="DATA size of the MS (MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as where:
        print("\n".join(xarray_figures(where, args.mib, args.rounds)))


if __name__ == "__main__":
    main()
