"""Compiles the decoders' numba kernels once (Dysco's, Sisco's) into numba's cache, so that
neither the first mount of such a table nor the tests pay the compiling: decodes every
column of a tiny Dysco MeasurementSet and of a tiny Sisco one, which python-casacore
writes with the tests' writers. ``python3 scripts/warm_kernels.py`` (run by setup.sh
after the install; prints the seconds it took)."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table

TEST_TABLES = Path(__file__).resolve().parent.parent / "tests" / "formats" / "casacore"
DYSCO = {"managers": [{"name": "D", "columns": ["DATA", "WEIGHT_SPECTRUM"], "spec": {
    "dataBitCount": 10, "weightBitCount": 12, "distribution": "TruncatedGaussian",
    "normalization": "AF", "studentTNu": 0.0, "distributionTruncation": 2.5}}]}
SISCO = f"""
import sys
sys.path.insert(0, {str(TEST_TABLES)!r})
import altman_tables
altman_tables.sisco_set(sys.argv[1], True, range(2), 2, 4, (2,), False)
"""


def main():
    with tempfile.TemporaryDirectory(prefix="ctdsfs-warm.") as tmp:
        dysco, sisco = Path(tmp, "dysco.ms"), Path(tmp, "sisco.ms")
        subprocess.run([sys.executable, str(TEST_TABLES / "dysco_ms.py"), str(dysco),
                        json.dumps(DYSCO)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-c", SISCO, str(sisco)], check=True,
                       stdout=subprocess.DEVNULL)
        start = time.perf_counter()
        for path, names in ((dysco, ("DATA", "WEIGHT_SPECTRUM")), (sisco, ("L2",))):
            table = open_table(TableDirectory(str(path)))
            for name in names:
                table.read_column(name)
        print(f"warm_kernels: Dysco's and Sisco's kernels ready "
              f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
