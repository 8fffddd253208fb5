"""The benchmark's "toolbox" part: pack and unpack of a MeasurementSet-like tree against
cp -r of it, and check's CRC-verified rate."""

import os
import subprocess
import time

from benchmark_common import drop_caches

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

    from ctdsfs.sources.checking import check_path
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

