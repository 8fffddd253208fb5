"""The xarray part of the benchmark: open an MS as a DataTree and load VISIBILITY and FLAG,
with the ``ctdsfs`` engine and with xarray-ms (``xarray-ms:msv2``) on the same files.

The MS (tests/xarray_backend/ms_writer.py, python-casacore): 64 antennas without autocorrelations (2016
baselines), 64 channels x 4 correlations, DATA and FLAG in TiledShapeStMan, one spectral
window; ``--mib`` sets its DATA size through the number of times. Beside it the open cost:
an MS of 1M rows (1 channel x 1 correlation) opened alone; and the object storage line: the
MS packed by ``ctdsfs pack`` into ``obs.mf`` on a SeaweedFS on loopback, opened through
``s3://`` with ``chunks=`` and its VISIBILITY and FLAG loaded on a ``distributed``
LocalCluster of 2 single-threaded workers (a new one each round), against xarray-ms on
the local MS (it reads local paths only) on the same kind of cluster; the values are
checked equal once. Each round opens the MS in a fresh process (its imports done before the clock starts) with the MS's files evicted
from the page cache first (``posix_fadvise(DONTNEED)``: only these files, not the shared
machine's whole cache), so every read comes from disk; the engines alternate, and the
median and best of the rounds are reported. The machine is shared: figures are indicative.

    python3 scripts/benchmark_xarray.py [--mib 250] [--rounds 3] [--parts local,rows,s3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
PARTS = ("local", "rows", "s3")
S3_CHUNKS = {"time": 8}

# a round on a LocalCluster: open with chunks= in this (fresh) process, load VISIBILITY and
# FLAG through the workers; the values' digest is taken after the clock stops
DASK_CHILD = """
import hashlib, json, sys, time, warnings
import dask, dask.array, numpy
import xarray as xr
from distributed import Client
address, source, engine, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if engine == "ctdsfs":
    from ctdsfs.xarray_backend import CtdsfsBackendEntrypoint as engine
    import s3fs  # noqa: F401 (imported before the clock starts)
else:
    import xarray_ms  # noqa: F401
warnings.simplefilter("ignore")
def ready():  # what every task needs, imported in the workers before the clock starts
    import warnings, xarray, dask.array, s3fs, xarray_ms, ctdsfs.xarray_backend  # noqa: F401
    warnings.simplefilter("ignore")
with Client(address) as client:
    client.run(ready)
    start = time.perf_counter()
    tree = xr.open_datatree(source, engine=engine, chunks=json.loads(sys.argv[5]), **options)
    opened = time.perf_counter() - start
    arrays = [tree[n][v].data for n in tree.children for v in ("VISIBILITY", "FLAG")]
    values = dask.compute(*arrays)
    total = time.perf_counter() - start
digest = hashlib.sha256()
for v in values:
    digest.update(numpy.ascontiguousarray(v).tobytes())
print(opened, total, digest.hexdigest())
"""


def evict(path):
    """The MS's files out of the page cache (cold reads), leaving other files alone."""
    for folder, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def child_env():
    return dict(os.environ, PYTHONPATH=str(ROOT / "src"))


def one_round(ms, engine, what):
    evict(ms)
    env = child_env()
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


def cluster_round(source, engine, options, evicted):
    """(open seconds, total seconds, values' digest) of one round on a new LocalCluster."""
    from distributed import LocalCluster

    for path in evicted:
        evict(path)
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None, host="127.0.0.1") as cluster:
        out = subprocess.run([sys.executable, "-c", DASK_CHILD, cluster.scheduler_address,
                              source, engine, json.dumps(options), json.dumps(S3_CHUNKS)],
                             check=True, env=child_env(), capture_output=True,
                             text=True).stdout.split()
    return float(out[0]), float(out[1]), out[2]


def raw_get_seconds(endpoint, credentials, size, half, step=8 << 20):
    """Seconds to GET one half of the object in ``step`` ranges, one after the other (on a
    worker: the transfer floor of its share, nothing decoded)."""
    import botocore.session

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"])
    start = time.perf_counter()
    for at in range(half * size // 2, (half + 1) * size // 2, step):
        end = min(at + step, (half + 1) * size // 2)
        client.get_object(Bucket="bench", Key="obs.mf",
                          Range=f"bytes={at}-{end - 1}")["Body"].read()
    return time.perf_counter() - start


def raw_gets(server, credentials, size, evicted):
    """The two workers' GET floors (seconds each) for the whole object, at once."""
    from distributed import Client, LocalCluster

    evict(evicted)
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None, host="127.0.0.1") as cluster, \
            Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        futures = [client.submit(raw_get_seconds, server.endpoint, credentials, size, half,
                                 workers=[workers[half]], pure=False) for half in (0, 1)]
        return [f.result() for f in futures]


def s3_figures(where, ms, rounds):
    """The object storage lines: ``ms`` packed on SeaweedFS, ctdsfs through s3:// against
    xarray-ms on the local MS, both on 2 Dask workers, rounds alternated. A LocalCluster's
    scheduler runs in this process and unpickles the graphs it is sent: both engines'
    modules are imported here first (from this tree), or the first round would pay them."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    import dask.array  # noqa: F401
    import xarray_ms  # noqa: F401
    from tests.servers import CREDENTIALS, Seaweed

    import ctdsfs.xarray_backend  # noqa: F401

    packed = Path(where) / "obs.mf"
    subprocess.run(["ctdsfs", "pack", "--quiet", ms, str(packed)],
                   check=True, env=child_env())
    (Path(where) / "weed").mkdir()
    server = Seaweed(Path(where) / "weed")
    try:
        client = server.make_bucket("bench")
        with open(packed, "rb") as f:
            client.put_object(Bucket="bench", Key="obs.mf", Body=f)
        options = {"storage_options": {"endpoint_url": server.endpoint,
                                       "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                       "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}}
        got = {engine: [] for engine in ENGINES}
        for _ in range(rounds):
            got["ctdsfs"].append(cluster_round("s3://bench/obs.mf", "ctdsfs", options,
                                               [Path(where) / "weed"]))
            got["xarray-ms:msv2"].append(cluster_round(ms, "xarray-ms:msv2", {}, [ms]))
        floor = raw_gets(server, CREDENTIALS, packed.stat().st_size, Path(where) / "weed")
    finally:
        server.close()
    if got["ctdsfs"][0][2] != got["xarray-ms:msv2"][0][2]:
        raise AssertionError("s3: the values ctdsfs loaded differ from xarray-ms's local ones")
    lines = [f"xarray: the same packed (obs.mf) on SeaweedFS through s3://, chunks="
             f"{S3_CHUNKS}, loaded on a LocalCluster of 2 single-threaded workers (a new one "
             f"each round), against xarray-ms on the local MS on the same kind of cluster, "
             f"{rounds} rounds (median / best, open alone), values equal:"]
    lines += _engine_lines({e: [r[:2] for r in results] for e, results in got.items()})
    lines.append(f"  the floor: GETs of the whole object in 8 MiB ranges, half on each worker, "
                 f"nothing decoded: {max(floor):.2f} s")
    return lines


def _engine_lines(times):
    """Median / best totals and median open per engine, and the ratio of the medians."""
    lines = []
    for engine, got in times.items():
        total = [t for _, t in got]
        opened = [o for o, _ in got]
        lines.append(f"  {engine:15} {statistics.median(total):6.2f} s / {min(total):6.2f} s"
                     f"   (open {statistics.median(opened):.2f} s)")
    ratio = statistics.median(t for _, t in times["ctdsfs"]) / \
        statistics.median(t for _, t in times["xarray-ms:msv2"])
    lines.append(f"  ctdsfs / xarray-ms: {ratio:.2f}")
    return lines


def xarray_figures(where, mib, rounds, parts=PARTS, open_rows=1_000_000):
    ntime = max(1, (mib << 20) // (BASELINES * CELL_BYTES))
    ms = str(Path(where) / "bench.ms")
    size = write_ms(ms, 64, ntime, 64, [9, 10, 11, 12])
    lines = []
    if "local" in parts:
        lines += [f"xarray: open_datatree + load VISIBILITY and FLAG, cold, {size:.0f} MiB MS "
                  f"({ntime * BASELINES} rows), {rounds} rounds (median / best, open alone):"]
        lines += _engine_lines(alternated(ms, rounds, "load"))
    if "s3" in parts:
        lines += s3_figures(where, ms, rounds)
    if "rows" in parts:
        lines += rows_figures(where, rounds, open_rows)
    return lines


def rows_figures(where, rounds, open_rows):
    many = str(Path(where) / "rows.ms")
    ntime = -(-open_rows // BASELINES)
    size = write_ms(many, 64, ntime, 1, [9])
    times = alternated(many, rounds, "open")
    lines = [f"xarray: open_datatree alone, cold, {ntime * BASELINES} rows "
             f"({size:.0f} MiB MS, 1 channel x 1 correlation), median / best:"]
    for engine, got in times.items():
        opened = [o for o, _ in got]
        lines.append(f"  {engine:15} {statistics.median(opened):6.2f} s / {min(opened):6.2f} s")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=250, help="DATA size of the MS (MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which lines: local, rows (the 1M-row open), s3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as where:
        print("\n".join(xarray_figures(where, args.mib, args.rounds,
                                        args.parts.split(","))))


if __name__ == "__main__":
    main()
