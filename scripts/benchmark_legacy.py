"""The benchmark's "legacy" part: every column of a MeasurementSet, read by casacore 3.5
through the legacy table view against python-casacore 3.8 reading the MultiFile original."""

import os
import subprocess
import sys

from benchmark_common import MAKE_MS, READ_ALL, Mounted, drop_caches


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

