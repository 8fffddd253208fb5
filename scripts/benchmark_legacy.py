"""The benchmark's "legacy" part: every column of a MeasurementSet, read by casacore 3.5
through the legacy table view against python-casacore 3.8 reading the MultiFile original;
and casacore's cold random reads (``getcol`` of random row ranges of the tiled DATA column,
page cache dropped, a fresh mount), python-casacore 3.8 through the mount against the same
reads of the MultiFile original on local disk."""

import os
import subprocess
import sys

from benchmark_common import MAKE_MS, READ_ALL, READ_RANDOM_ROWS, Mounted, drop_caches

RANDOM_RANGES = 400  # getcol calls of 16 rows each at random rows


def legacy_view_ratio(tmp, size_mb, rounds=3):
    """Seconds for python-casacore 3.8 (native) and casacore 3.5 (through the view), and
    for the cold random row ranges natively and through a fresh mount (all best of
    ``rounds``)."""
    rows = size_mb * 2 ** 20 // 2048  # DATA is 4 x 64 complex64 = 2 KiB per row
    home = tmp / "home"
    home.mkdir()
    (home / ".casarc").write_text("table.storage.option: multifile\n"
                                  "table.storage.blocksize: 1048576\n")
    data = tmp / "legacy"
    data.mkdir()
    env = dict(os.environ, HOME=str(home))
    subprocess.run([sys.executable, "-c", MAKE_MS, str(rows)], check=True, cwd=data, env=env)

    def seconds(python, script, *args):
        return float(subprocess.run([python, "-c", script, *map(str, args)], check=True,
                                    env=env, capture_output=True, text=True).stdout)

    mount = ["mount.ctdsfs", "-f", str(data), str(tmp / "m6")]
    native, legacy, native_random, mounted_random = [], [], [], []
    with Mounted(mount, str(tmp / "m6")):
        for _ in range(rounds):  # best of alternating runs, as for writes
            drop_caches()
            native.append(seconds(sys.executable, READ_ALL, data / "big.ms"))
            drop_caches()
            legacy.append(seconds("/usr/bin/python3", READ_ALL, tmp / "m6" / "big.ms"))
    for _ in range(rounds):
        drop_caches()
        native_random.append(seconds(sys.executable, READ_RANDOM_ROWS, data / "big.ms",
                                     RANDOM_RANGES))
        drop_caches()
        with Mounted(mount, str(tmp / "m6")):
            mounted_random.append(seconds(sys.executable, READ_RANDOM_ROWS,
                                          tmp / "m6" / "big.ms", RANDOM_RANGES))
    return min(native), min(legacy), min(native_random), min(mounted_random)
