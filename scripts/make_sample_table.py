"""Write a small casacore table with python-casacore (storage option from ~/.casarc).

Columns cover the storage managers casacore uses: scalars and strings
(StandardStMan), a fixed-shape array in a TiledColumnStMan (table.f*_TSM*
files) and a variable-shape array. Usage: python3 make_sample_table.py NAME [ROWS]
"""

import sys

import casacore.tables as ct
import numpy as np


def make_table(name, rows=50):
    desc = ct.maketabdesc([
        ct.makescacoldesc("ANTENNA", 0),
        ct.makescacoldesc("NAME", ""),
        ct.makearrcoldesc("DATA", 0j, shape=[4, 2]),
        ct.makearrcoldesc("FLAGS", False),
    ])
    dminfo = {"*1": {"TYPE": "TiledColumnStMan", "NAME": "tiled",
                     "SPEC": {"DEFAULTTILESHAPE": [4, 2, 16]}, "COLUMNS": ["DATA"]}}
    table = ct.table(name, desc, dminfo=dminfo, nrow=rows, ack=False)
    table.putcol("ANTENNA", np.arange(rows, dtype=np.int32))
    table.putcol("NAME", [f"antenna-{r}" for r in range(rows)])
    table.putcol("DATA", (np.arange(rows * 8) * (1 + 1j)).reshape(rows, 4, 2))
    for r in range(rows):
        table.putcell("FLAGS", r, np.arange(r % 7 + 1) % 2 == 0)
    table.putkeyword("TELESCOPE", "ctdsfs-demo")
    table.close()


if __name__ == "__main__":
    make_table(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50)
