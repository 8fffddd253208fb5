"""The benchmark's "remote" part: SeaweedFS on loopback; a cold read through an s3:// mount
against the raw GETs of the object by botocore, obstore and s3fs, and the pyfuse3 floors
of that read; every column of a MeasurementSet through s3:// and a local mount."""

import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyfuse3_floor  # (beside this script)
from benchmark_common import (
    MAKE_MS,
    READ_ALL,
    Mounted,
    drop_caches,
    filler,
    process_cpu_seconds,
    read_through,
    set_readahead,
    write_container,
)

REMOTE_CONCURRENCY = 8  # GETs in flight: the mount's default, and the baselines'

REMOTE_CHUNK = 8 << 20
RANDOM_READS = 64  # 4 KiB reads at random places of the file through a fresh s3:// mount


def random_read_seconds(path, count, seed):
    """Seconds for ``count`` 4 KiB preads at random page-aligned places of ``path``, the
    kernel's readahead off (POSIX_FADV_RANDOM): what a reader jumping about pays."""
    rng = random.Random(seed)
    size = path.stat().st_size
    places = [rng.randrange(0, size - 4096) // 4096 * 4096 for _ in range(count)]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        start = time.perf_counter()
        for place in places:
            if len(os.pread(fd, 4096, place)) != 4096:
                raise RuntimeError(f"{path}: a short read at {place}")
        return time.perf_counter() - start
    finally:
        os.close(fd)


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
    """The remote section: SeaweedFS on loopback (as in tests/remote/test_remote.py). The cold
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

        command, path, _ = readers["s3:// mount"]
        jumps = []
        for round_ in range(rounds):  # each a fresh mount, cache dropped
            with Mounted(command, str(tmp / "r1")):
                drop_caches()
                jumps.append(random_read_seconds(path, RANDOM_READS, round_))
        lines.append(f"s3:// mount: {RANDOM_READS} random 4 KiB reads of the {size >> 20} MiB "
                     f"file (a fresh mount, cache dropped, POSIX_FADV_RANDOM), {rounds} "
                     f"rounds: median {statistics.median(jumps):.2f} s (best {min(jumps):.2f}); "
                     f"each GETs its own bytes, or its chunk at the chunk's second")

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

