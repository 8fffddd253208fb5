"""Write a small casacore table with python-casacore (storage option from ~/.casarc).

Columns cover the storage managers casacore uses: scalars and strings
(StandardStMan), a fixed-shape array in a TiledColumnStMan (table.f*_TSM*
files) and a variable-shape array, plus a subtable ANTENNA (a table keyword, as in a
MeasurementSet). Usage: python3 make_sample_table.py NAME [ROWS]
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
    sub_desc = ct.maketabdesc([ct.makescacoldesc("STATION", ""),
                               ct.makearrcoldesc("POSITION", 0.0, shape=[3])])
    sub = ct.table(f"{name}/ANTENNA", sub_desc, nrow=rows // 5 + 1, ack=False)
    sub.putcol("STATION", [f"station-{r}" for r in range(sub.nrows())])
    sub.putcol("POSITION", np.arange(sub.nrows() * 3.0).reshape(-1, 3))
    table.putkeyword("ANTENNA", sub)  # a subtable, as in a MeasurementSet
    sub.close()
    table.close()


def read_table(name):
    """Every column (and the subtable's) as Python values, for comparisons."""
    def plain(values):
        values = np.asarray(values)
        if np.iscomplexobj(values):  # JSON has no complex numbers: [re, im] pairs
            values = np.stack([values.real, values.imag], axis=-1)
        return values.tolist()

    def columns(t):
        out = {}
        for col in t.colnames():
            if t.isvarcol(col):  # an undefined cell (a row added without it) is None
                out[col] = [plain(t.getcell(col, r)) if t.iscelldefined(col, r) else None
                            for r in range(t.nrows())]
            else:
                out[col] = plain(t.getcol(col))
        return out
    table = ct.table(name, ack=False)
    try:
        sub = ct.table(table.getkeyword("ANTENNA"), ack=False)
        try:
            keywords = {k: str(v) for k, v in table.getkeywords().items()
                        if not str(v).startswith("Table: ")}
            return {"main": columns(table), "ANTENNA": columns(sub), "keywords": keywords}
        finally:
            sub.close()
    finally:
        table.close()


if __name__ == "__main__":
    if sys.argv[1] == "--dump":  # print the values of an existing table as JSON
        import json
        print(json.dumps(read_table(sys.argv[2]), sort_keys=True))
    else:
        make_table(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50)
