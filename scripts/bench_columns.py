"""Decode time of every tiled column of a MeasurementSet: ctdsfs's casacore_columns against
python-casacore's getcol on the same files, in one process (page cache warm for both).

    python3 scripts/bench_columns.py [MS] [ROWS]

Without MS, a default_ms with DATA (64 channels x 4 correlations) and ROWS rows (default
45000, about 100 MB) is written into a temporary directory first.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import casacore.tables as ct

from ctdsfs.formats.casacore_base import DirectorySource
from ctdsfs.formats.casacore_columns import open_table

HERE = Path(__file__).resolve().parent


def best_of(n, fn):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    args = sys.argv[1:]
    tmp = None
    if args and os.path.isdir(args[0]):
        path = args[0]
    else:
        tmp = tempfile.TemporaryDirectory()
        path = os.path.join(tmp.name, "bench.ms")
        rows = args[0] if args else "45000"
        subprocess.run([sys.executable, str(HERE.parent / "tests" / "casacore_column_tables.py"),
                        "ms", path, rows], check=True)
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    table = open_table(DirectorySource(path))
    ref = ct.table(path, ack=False)
    print(f"{path}: {table.nrow} rows, {size / 1e6:.0f} MB in the main table's files")
    print(f"{'column':<10}{'manager':<18}{'MB':>7}{'getcol s':>10}{'ctdsfs s':>10}{'ratio':>7}"
          f"{'+open s':>9}")
    for name, col in table.columns.items():
        if not col.manager.startswith("Tiled"):
            continue
        ours = table.read_column(name)
        theirs = ref.getcol(name)
        assert ours.dtype == theirs.dtype and (ours == theirs).all(), name
        t_ref = best_of(5, lambda name=name: ref.getcol(name))
        t_ours = best_of(5, lambda name=name: table.read_column(name))
        t_open = best_of(5, lambda name=name: open_table(DirectorySource(path)).read_column(name))
        print(f"{name:<10}{col.manager:<18}{ours.nbytes / 1e6:>7.1f}{t_ref:>10.3f}"
              f"{t_ours:>10.3f}{t_ref / t_ours:>7.2f}{t_open:>9.3f}")
    ref.close()
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
