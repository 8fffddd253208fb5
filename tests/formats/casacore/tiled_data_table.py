"""Tables with TiledDataStMan columns, written by casacore itself: python-casacore cannot
add that manager's hypercubes, so tests/formats/casacore/tools/make_tiled_data_table.cc (casacore's
TiledDataStManAccessor) is compiled once per test process against Debian's casacore-dev."""

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "tools" / "make_tiled_data_table.cc"


@functools.cache
def _writer():
    where = Path(tempfile.mkdtemp(prefix="ctdsfs-tds-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    binary = where / "make_tiled_data_table"
    subprocess.run(["g++", "-O0", "-std=c++17", "-o", str(binary), str(SOURCE),
                    "-I/usr/include/casacore", "-lcasa_tables", "-lcasa_casa"], check=True)
    return binary


def write_tiled_data_table(path, variant="uniform", endian="little", multifile=False):
    """``variant``: "uniform" (Complex DATA and FLAG, cells [4, 6] in three hypercubes,
    45 rows) or "mixed" (Float DATA and FLAG of two cell shapes, cubes of rank 4: two row
    axes, 26 rows, then 2 rows in no cube); see the C++ source for each cube's rows."""
    subprocess.run([str(_writer()), str(path), variant, endian,
                    "multifile" if multifile else "plain"], check=True)
    return str(path)
