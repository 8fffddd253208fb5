"""The benchmark's "columns" part: every tiled column of a MeasurementSet as NumPy arrays.

The MS is the tests' (tests/formats/casacore/casacore_column_tables.py ``ms``): DATA (64 channels x 4
correlations, complex64) and FLAG in two TiledShapeStMan hypercolumns, UVW in
TiledColumnStMan, the rest in StandardStMan. Each figure is a median of alternated
rounds (the machine is shared: its load moves every reader) with the best beside it:

* local: ``numpy.load(columns/NAME.npy)`` of every tiled column through a fresh
  ``mount.ctdsfs -o columns`` of the MS directory (from the first lookup on, the mount's
  own start apart), against python-casacore's ``getcol`` of the same columns from the
  same files (from opening the table on), each in a fresh process, page cache warm;
  beside them the pyfuse3 floor: ``numpy.load`` of the same columns' .npy files (saved
  from ``getcol`` once) served from memory by pyfuse3_floor.py ``files`` (a fresh mount
  each round, timed as the mount is): what any pyfuse3+trio file system pays to hand
  NumPy the decoded columns; beside both, the CPU their daemons spent meanwhile (the
  machine's load moves it less than it moves wall times);
* remote: the same columns of the MS packed by ``ctdsfs pack`` and put on a SeaweedFS on
  loopback, read through the fsspec filesystem (``columns=True``) as ``dask.array``s by
  the two worker processes of a ``distributed.LocalCluster`` (a new one each round:
  nothing cached; the modules a task needs imported before the clock starts;
  the clock runs from making the arrays, which lists the view, to their values in the
  client), against ``getcol`` from local disk;
* the bytes a range of 100 rows of DATA fetches from SeaweedFS, with the remote reader's
  defaults and with 64 KiB chunks, beside the size of one tile row (the tiles across a
  cell that hold a band of rows);
* Dysco: a MeasurementSet whose DATA (64 channels x 4 correlations) python-casacore
  stores with DyscoStMan (10 bits, TruncatedGaussian, AF normalisation: LOFAR's
  pipelines' choice), written by tests/formats/casacore/dysco_ms.py: ``numpy.load(columns/DATA.npy)``
  through a fresh mount against ``getcol`` and the floor, as for the local figures;
* Sisco: the same for a column python-casacore stores with SiscoStMan (prediction
  level 2, 64 channels x 4 correlations of smooth values with a little noise), written
  by tests/formats/casacore/altman_tables.py ``sisco_set``;
* for both, the CPU seconds of one process: ``getcol`` of the column against the decoder
  reading it 1 MiB of rows at a time, as the mount's reads ask (the machine's load
  moves CPU time less than wall time). ``--parts compressed`` runs these two lines only.
"""

import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmark_common import Mounted, floor_of_files

HERE = Path(__file__).resolve().parent
TEST_TABLES = HERE.parent / "tests" / "formats" / "casacore"  # the writers of the tables
ROW_BYTES = 2163  # of the MS's files per row (DATA 2 KiB, FLAG, UVW, scalars, WEIGHT, SIGMA)

GETCOL = """
import sys, time, casacore.tables as ct
start = time.perf_counter()
table = ct.table(sys.argv[1], ack=False)
for name in sys.argv[2:]:
    table.getcol(name)
print(time.perf_counter() - start)
"""

NPY_LOAD = """
import sys, time, numpy as np
start = time.perf_counter()
for name in sys.argv[2:]:
    np.load(f"{sys.argv[1]}/{name}.npy")
print(time.perf_counter() - start)
"""

SAVE_NPY = """
import sys, numpy as np, casacore.tables as ct
table = ct.table(sys.argv[1], ack=False)
for name in sys.argv[3:]:
    np.save(f"{sys.argv[2]}/{name}.npy", table.getcol(name))
"""

DASK_READ = """
import sys, time, json
from distributed import Client
from ctdsfs.dask_columns import column_array
address, url, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def ready():  # what every task needs, imported before the clock starts
    import ctdsfs.dask_columns, ctdsfs.formats.casacore.columns_view, s3fs  # noqa: F401
with Client(address) as client:
    client.run(ready)
    start = time.perf_counter()
    arrays = [column_array(url, name, **options) for name in sys.argv[4:]]
    client.compute(arrays, sync=True)  # one graph: both workers busy from the start
    print(time.perf_counter() - start)
"""


def seconds(script, *args, env=None):
    return float(subprocess.run([sys.executable, "-c", script, *map(str, args)], check=True,
                                capture_output=True, text=True, env=env).stdout)


def summary(values):
    return f"median {statistics.median(values):.3f} s (best {min(values):.3f})"


def tiled_columns(path):
    from ctdsfs.formats.casacore.base import TableDirectory
    from ctdsfs.formats.casacore.columns import open_table

    table = open_table(TableDirectory(path))
    return table, [name for name, col in table.columns.items() if col.manager.startswith("Tiled")]


def daemon_cpu_seconds(pid):
    """CPU seconds the threads of process ``pid`` have run so far (their schedstat:
    nanoseconds, where /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def timed_load(mounted, directory, names, cpu):
    """``numpy.load`` seconds of ``names`` under ``directory``; the daemon's CPU seconds
    meanwhile appended to ``cpu``."""
    before = daemon_cpu_seconds(mounted.proc.pid)
    wall = seconds(NPY_LOAD, directory, *names)
    cpu.append(daemon_cpu_seconds(mounted.proc.pid) - before)
    return wall


def local_figures(tmp, ms, names, rounds):
    """(getcol seconds, mount seconds, floor seconds), ``rounds`` each, alternated, and the
    daemons' CPU seconds meanwhile: (the mount's, the floor's)."""
    mountpoint = tmp / "columns-mnt"
    decoded = tmp / "columns-npy"  # what the floor serves
    decoded.mkdir(exist_ok=True)  # (one for each line of the part)
    subprocess.run([sys.executable, "-c", SAVE_NPY, ms, decoded, *names], check=True)
    npy_files = {f"{name}.npy": decoded / f"{name}.npy" for name in names}
    ours, theirs, floor, cpu = [], [], [], ([], [])
    for _ in range(rounds):
        theirs.append(seconds(GETCOL, ms, *names))
        with Mounted(["mount.ctdsfs", "-f", "-o", "columns", str(ms), str(mountpoint)],
                     str(mountpoint)) as mounted:
            ours.append(timed_load(mounted, mountpoint / "columns", names, cpu[0]))
        with floor_of_files(npy_files, mountpoint) as mounted:
            floor.append(timed_load(mounted, mountpoint, names, cpu[1]))
    for path in npy_files.values():
        path.unlink()
    return theirs, ours, floor, cpu


def extra_bytes(url, s3, table, nrow, options):
    """(bytes fetched for rows ``nrow // 2 .. + 100`` of DATA.npy, those rows' bytes)."""
    import fsspec

    from ctdsfs.remote import store as remote

    fetched = []
    original = remote.RemoteStore._get

    def counted(self, start, end, version):
        fetched.append(end - start)
        return original(self, start, end, version)
    remote.RemoteStore._get = counted
    try:
        fs = fsspec.filesystem("ctdsfs", fo=url, columns=True, skip_instance_cache=True,
                               target_options=dict(s3, **options))
        path = "columns/DATA.npy"
        row = table.columns["DATA"].dtype.itemsize * 64 * 4
        header = fs.size(path) - nrow * row
        fs.cat_file(path, 0, header)  # the view listed: table.dat, the managers' headers
        fetched.clear()
        first = nrow // 2
        rows = min(100, nrow - first)
        fs.cat_file(path, header + first * row, header + (first + rows) * row)
        return sum(fetched), rows * row
    finally:
        remote.RemoteStore._get = original


def remote_figures(tmp, ms, table, names, rounds):
    """(dask seconds per round, extra bytes with the defaults, with 64 KiB chunks)."""
    import json

    from distributed import LocalCluster

    sys.path.insert(0, str(HERE.parent))
    from tests.servers import CREDENTIALS, Seaweed

    packed = tmp / "columns-ms.mf"
    subprocess.run(["ctdsfs", "pack", "--quiet", str(ms), str(packed)], check=True)
    (tmp / "columns-weed").mkdir()
    server = Seaweed(tmp / "columns-weed")
    try:
        client = server.make_bucket("columns")
        with open(packed, "rb") as f:
            client.put_object(Bucket="columns", Key="ms.mf", Body=f)
        url = "s3://columns/ms.mf"
        s3 = {"endpoint_url": server.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
              "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
        env = dict(os.environ, **CREDENTIALS)
        dask = []
        for _ in range(rounds):  # a new cluster each round: nothing cached in its workers
            with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                              dashboard_address=None, host="127.0.0.1") as cluster:
                dask.append(seconds(DASK_READ, cluster.scheduler_address, url,
                                    json.dumps(s3), *names, env=env))
        cube = table._reader(table.columns["DATA"].seqnr).cubes[-1]
        tile_row = cube.n_tiles // cube.grid[-1] * cube.tile_bytes
        extras = [extra_bytes(url, s3, table, table.nrow, options)
                  for options in ({}, {"chunk_size": 64 << 10, "readahead": 1})]
        return dask, extras, tile_row
    finally:
        server.close()


GETCOL_CPU = """
import sys, time, casacore.tables as ct
start = time.process_time()
ct.table(sys.argv[1], ack=False).getcol(sys.argv[2])
print(time.process_time() - start)
"""

DECODER_CPU = """
import sys, time
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
start = time.process_time()
table = open_table(TableDirectory(sys.argv[1]))
step = int(sys.argv[3])
for first in range(0, table.nrow, step):
    table.read_column(sys.argv[2], first, first + step)
print(time.process_time() - start)
"""


def compressed_line(tmp, ms, name, what, rounds):
    """The line of one compressed column ``name`` of ``ms`` (see the module docstring)."""
    table, _ = tiled_columns(ms)
    stored = (ms / table.manager_files(name)[0]).stat().st_size
    row_bytes = table.columns[name].dtype.itemsize * int(np.prod(table.columns[name].cell_shape))
    decoded = table.nrow * row_bytes
    getcol, mounted, floor, (cpu, _) = local_figures(tmp, ms, [name], rounds)
    getcol_cpu, decoder_cpu = [], []
    for _ in range(rounds):
        getcol_cpu.append(seconds(GETCOL_CPU, ms, name))
        decoder_cpu.append(seconds(DECODER_CPU, ms, name, max(1, (1 << 20) // row_bytes)))
    return (f"columns: {what} ({decoded / 2 ** 20:.0f} MiB decoded, {stored / 2 ** 20:.0f} "
            f"MiB stored), {rounds} alternated rounds, page cache warm: python-casacore getcol "
            f"{summary(getcol)}, numpy.load through a fresh -o columns mount "
            f"{summary(mounted)}, ratio of medians "
            f"{statistics.median(getcol) / statistics.median(mounted):.2f} (target >= 1); the "
            f"pyfuse3 floor {summary(floor)}; the mount's CPU median "
            f"{statistics.median(cpu):.3f} s; in one process, CPU: getcol "
            f"{summary(getcol_cpu)}, the decoder reading 1 MiB of rows at a time "
            f"{summary(decoder_cpu)}")


def dysco_figures(tmp, data_mib, rounds):
    """The Dysco line: DATA of about ``data_mib`` MiB decoded (see the module docstring)."""
    import json

    ms = tmp / "dysco.ms"
    antennas = 28  # 406 rows a time step, autocorrelations included
    times = max(2, data_mib * 2 ** 20 // (2048 * antennas * (antennas + 1) // 2))
    spec = {"dataBitCount": 10, "weightBitCount": 12, "distribution": "TruncatedGaussian",
            "normalization": "AF", "studentTNu": 0.0, "distributionTruncation": 2.5}
    settings = {"managers": [{"name": "Dysco", "columns": ["DATA"], "spec": spec}],
                "antennas": antennas, "times": times, "channels": 64, "pols": 4}
    print(f"columns: a Dysco DATA column of {data_mib} MiB ...", flush=True)
    subprocess.run([sys.executable, str(TEST_TABLES / "dysco_ms.py"), str(ms),
                    json.dumps(settings)], check=True, stdout=subprocess.DEVNULL)
    return compressed_line(tmp, ms, "DATA", "Dysco DATA (10 bits, TruncatedGaussian, AF)",
                           rounds)


SISCO_MS = """
import sys
sys.path.insert(0, sys.argv[1])
import altman_tables
altman_tables.sisco_set(sys.argv[2], True, range(28), int(sys.argv[3]), 64, (2,), False)
"""


def sisco_figures(tmp, data_mib, rounds):
    """The Sisco line: a column of about ``data_mib`` MiB decoded (see the module
    docstring)."""
    ms = tmp / "sisco.ms"
    times = max(2, data_mib * 2 ** 20 // (2048 * 28 * 29 // 2))
    print(f"columns: a Sisco column of {data_mib} MiB ...", flush=True)
    subprocess.run([sys.executable, "-c", SISCO_MS, str(TEST_TABLES), str(ms),
                    str(times)], check=True, stdout=subprocess.DEVNULL)
    return compressed_line(tmp, ms, "L2", "Sisco L2 (prediction level 2, structured "
                           "values)", rounds)


def compressed_figures(tmp, rounds=5):
    """The Dysco and the Sisco lines (see the module docstring)."""
    return [dysco_figures(tmp, 200, rounds), sisco_figures(tmp, 50, rounds)]


def columns_figures(tmp, ms_mib, rounds=5):
    """The lines of the part (see the module docstring)."""
    ms = tmp / "columns.ms"
    nrow = max(256, ms_mib * 2 ** 20 // ROW_BYTES)
    print(f"columns: a {ms_mib} MiB MeasurementSet ({nrow} rows) as NumPy arrays ...",
          flush=True)
    subprocess.run([sys.executable, str(TEST_TABLES / "casacore_column_tables.py"),
                    "ms", str(ms), str(nrow)], check=True)
    table, names = tiled_columns(ms)
    size = sum(f.stat().st_size for f in ms.iterdir() if f.is_file()) / 2 ** 20
    getcol, mounted, floor, (cpu, floor_cpu) = local_figures(tmp, ms, names, rounds)
    dask, ((moved, wanted), (moved_small, _)), tile_row = remote_figures(tmp, ms, table,
                                                                        names, rounds)
    ratio = statistics.median(getcol) / statistics.median(mounted)
    dask_ratio = statistics.median(getcol) / statistics.median(dask)
    return [
        f"columns: every tiled column ({', '.join(names)}) of a {size:.0f} MiB MeasurementSet, "
        f"{rounds} alternated rounds, page cache warm: python-casacore getcol {summary(getcol)}, "
        f"numpy.load through a fresh -o columns mount {summary(mounted)}, ratio of medians "
        f"{ratio:.2f} (target >= 1); the pyfuse3 floor (the same columns' .npy from memory, "
        f"numpy.load through a fresh mount) {summary(floor)}, ratio of medians to getcol "
        f"{statistics.median(getcol) / statistics.median(floor):.2f}; the daemons' CPU meanwhile "
        f"(all threads): the mount's median {statistics.median(cpu):.3f} s, the floor's "
        f"{statistics.median(floor_cpu):.3f} s",
        f"columns: the same through fsspec from SeaweedFS, dask.array on 2 worker processes "
        f"(a new cluster each round) {summary(dask)}, ratio to getcol from local disk "
        f"{dask_ratio:.2f}",
        f"columns: 100 rows of DATA ({wanted / 1024:.0f} KiB) through fsspec from SeaweedFS, "
        f"the view listed: {moved / 1024:.0f} KiB fetched with the default chunks (what "
        f"the listing fetched is not fetched again), {moved_small / 1024:.0f} KiB with "
        f"64 KiB chunks; a tile row of DATA is {tile_row / 1024:.0f} KiB",
        *compressed_figures(tmp, rounds),
    ]
