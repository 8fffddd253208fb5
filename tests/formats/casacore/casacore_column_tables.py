"""Tables python-casacore writes for the column decoder's tests (run in a subprocess so a
``.casarc`` can choose MultiFile storage)."""

import sys

import casacore.tables as ct
import numpy as np

TYPES = {"bool": np.bool_, "uchar": np.uint8, "short": np.int16,
         "int": np.int32, "uint": np.uint32, "int64": np.int64, "float": np.float32,
         "double": np.float64, "complex": np.complex64, "dcomplex": np.complex128}
NROW = 37


def values(vtype, shape, seed):
    rng = np.random.default_rng(seed)
    if vtype == "bool":
        return rng.random(shape) < 0.5
    dtype = np.dtype(TYPES[vtype])
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def strings(n, seed):
    words = ["", "a", "eight ch", "nine char", "Ångström", "日本語のテキスト", "x" * 300, "ß"]
    return [words[(i * 7 + seed) % len(words)] + str(i % 3) * (i % 5) for i in range(n)]


def scalar_and_fixed(path, manager):
    """Every type as a scalar (SSM/ISM) and as a fixed-shape array, in ``manager``."""
    tiled = manager.startswith("Tiled")
    cols = []
    for vtype, numpy_type in TYPES.items():
        if not tiled:
            cols.append(ct.makescacoldesc(f"s_{vtype}", numpy_type(0).item(),
                                          manager, valuetype=vtype))
        cols.append(ct.makearrcoldesc(f"a_{vtype}", numpy_type(0).item(), shape=[3, 5],
                                      datamanagertype=manager, datamanagergroup=f"g_{vtype}",
                                      valuetype=vtype, options=5))
    if not tiled:
        cols.append(ct.makescacoldesc("s_string", "", manager))
        cols.append(ct.makearrcoldesc("a_string", "", shape=[2, 2], datamanagertype=manager,
                                      options=5))
        cols.append(ct.makescacoldesc("s_fixstring", "", manager, maxlen=6))
    t = ct.table(path, ct.maketabdesc(cols), nrow=NROW, ack=False)
    for i, vtype in enumerate(TYPES):
        if not tiled:
            v = values(vtype, NROW, i)
            if manager == "IncrementalStMan":
                v = np.repeat(v[::4], 4)[:NROW]  # runs of equal values
            t.putcol(f"s_{vtype}", v)
        t.putcol(f"a_{vtype}", values(vtype, (NROW, 3, 5), 100 + i))
    if not tiled:
        t.putcol("s_string", strings(NROW, 1))
        t.putcol("a_string", np.array(strings(NROW * 4, 2)).reshape(NROW, 2, 2))
        t.putcol("s_fixstring", ["abcdefgh"[:i % 7] for i in range(NROW)])
    t.putcolkeyword("a_double", "QuantumUnits", ["m", "m"])
    t.putkeyword("TELESCOPE", "ÅLMA")
    t.close()


def varshape(path, manager):
    """Variable-shape arrays with undefined cells; in TiledShapeStMan several hypercubes."""
    tiled = manager.startswith("Tiled")
    kinds = ["bool", "int", "float", "dcomplex"] + ([] if tiled else ["string"])
    cols = [ct.makearrcoldesc(f"v_{k}", "" if k == "string" else TYPES[k](0).item(), ndim=2,
                              datamanagertype=manager, datamanagergroup=f"h_{k}",
                              valuetype=k) for k in kinds]
    t = ct.table(path, ct.maketabdesc(cols), nrow=NROW, ack=False)
    for j, k in enumerate(kinds):
        for row in range(NROW):
            if row % 5 == 3 and manager != "TiledCellStMan":
                continue  # left undefined
            shape = (1 + row % 3, 2 + (row // 7) % 2)
            if k == "string":
                v = np.array(strings(shape[0] * shape[1], row)).reshape(shape)
            else:
                v = values(k, shape, row * 10 + j)
            t.putcell(f"v_{k}", row, v)
    t.close()


def shared_tiles(path, manager):
    """Bool, Complex and Short cells (3 x 5) in the tiles of one hypercolumn: 7 rows of a
    tile hold 5 x 2 pixels each (Bools not on byte boundaries), two tiles across a row."""
    kinds = ["bool", "complex", "short"]
    cols = [ct.makearrcoldesc(f"a_{k}", TYPES[k](0).item(), shape=[3, 5], valuetype=k,
                              options=5) for k in kinds]
    dminfo = {"*1": {"TYPE": manager, "NAME": "shared", "COLUMNS": [f"a_{k}" for k in kinds],
                     "SPEC": {"DEFAULTTILESHAPE": np.array([5, 2, 7], np.int32)}}}
    t = ct.table(path, ct.maketabdesc(cols), dminfo=dminfo, nrow=NROW, ack=False)
    for i, k in enumerate(kinds):
        t.putcol(f"a_{k}", values(k, (NROW, 3, 5), 200 + i))
    t.close()


COORDINATE_TYPES = ["int", "uint", "float", "double", "complex", "dcomplex"]


def coordinates(path, manager, endian="little", nrow=11):
    """A hypercolumn per coordinate type in ``manager``, each: a Float data column
    ``d_T`` and coordinate columns, vectors ``x_T`` (axis 0, length 2 + row % 3 in
    TiledCellStMan, 3 + row % 2 in TiledShapeStMan, 3 in TiledColumnStMan) and ``y_T``
    (axis 1, length 2), and but in TiledCellStMan (no row axis) the scalar ``t_T`` (the
    rows' axis); each row puts its own vectors (the last put to a cube is its value) and
    scalar. In TiledShapeStMan rows 3 and 7 of the Double hypercolumn get no cell (they
    stay in casacore's cube 0, and casacore cannot read their coordinates; nor copy them)."""
    cell_only = manager == "TiledCellStMan"
    fixed = manager == "TiledColumnStMan"
    cols = []
    for k in COORDINATE_TYPES:
        zero = TYPES[k](0).item()
        cols += [ct.makearrcoldesc(f"d_{k}", 0.0, ndim=2, valuetype="float",
                                   **({"shape": [2, 3], "options": 5} if fixed else {})),
                 ct.makearrcoldesc(f"x_{k}", zero, ndim=1, valuetype=k),
                 ct.makearrcoldesc(f"y_{k}", zero, ndim=1, valuetype=k)]
        if not cell_only:
            cols.append(ct.makescacoldesc(f"t_{k}", zero, valuetype=k))
    desc = ct.maketabdesc(cols)
    dminfo = {}
    for i, k in enumerate(COORDINATE_TYPES):
        coords = [f"x_{k}", f"y_{k}"] + ([] if cell_only else [f"t_{k}"])
        ct.tabledefinehypercolumn(desc, f"H_{k}", len(coords), [f"d_{k}"],
                                  coordcolumns=coords)
        tile = [2, 2] + ([] if cell_only else [4])
        dminfo[f"*{i + 1}"] = {"TYPE": manager, "NAME": f"H_{k}",
                               "COLUMNS": [f"d_{k}"] + coords,
                               "SPEC": {"DEFAULTTILESHAPE": np.array(tile, np.int32)}}
    t = ct.table(path, desc, dminfo=dminfo, nrow=nrow, ack=False, endian=endian)
    for j, k in enumerate(COORDINATE_TYPES):
        for row in range(nrow):
            if manager == "TiledShapeStMan" and k == "double" and row in (3, 7):
                continue
            nx = 3 if fixed else 2 + row % 3 if cell_only else 3 + row % 2
            if not fixed:
                t.putcell(f"d_{k}", row, values("float", (2, nx), row))
            t.putcell(f"x_{k}", row, values(k, nx, 10 * row + j))
            t.putcell(f"y_{k}", row, values(k, 2, 10 * row + j + 500))
            if not cell_only:
                t.putcell(f"t_{k}", row, values(k, 1, 10 * row + j + 900)[0])
    t.close()


def measurement_set(path, nrow):
    """casacore's default MS (every subtable) with a DATA column and ``nrow`` rows filled."""
    desc = ct.maketabdesc([ct.makearrcoldesc("DATA", 0j, ndim=2, valuetype="complex")])
    dminfo = {"*1": {"TYPE": "TiledShapeStMan", "NAME": "TiledData", "COLUMNS": ["DATA"],
                     "SPEC": {"DEFAULTTILESHAPE": np.array([4, 16, 64], np.int32)}},
              "*2": {"TYPE": "TiledShapeStMan", "NAME": "TiledFlag", "COLUMNS": ["FLAG"],
                     "SPEC": {"DEFAULTTILESHAPE": np.array([4, 64, 256], np.int32)}},
              "*3": {"TYPE": "TiledColumnStMan", "NAME": "TiledUVW", "COLUMNS": ["UVW"],
                     "SPEC": {"DEFAULTTILESHAPE": np.array([3, 1024], np.int32)}}}
    t = ct.default_ms(path, desc, dminfo)
    nrow = int(nrow)
    t.addrows(nrow)
    nchan = 64
    t.putcol("DATA", values("complex", (nrow, nchan, 4), 1))
    t.putcol("FLAG", values("bool", (nrow, nchan, 4), 2))
    t.putcol("UVW", values("double", (nrow, 3), 3))
    t.putcol("TIME", 4.8e9 + np.arange(nrow) // 10)
    t.putcol("ANTENNA1", np.arange(nrow, dtype=np.int32) % 7)
    t.putcol("WEIGHT", values("float", (nrow, 4), 4))
    t.putcol("SIGMA", values("float", (nrow, 4), 5))
    t.close()
    ant = ct.table(path + "/ANTENNA", readonly=False, ack=False)
    ant.addrows(3)
    ant.putcol("NAME", ["ant-α", "ant-β", "ant-γ"])
    ant.putcol("POSITION", values("double", (3, 3), 6))
    ant.close()


if __name__ == "__main__":
    what, path, manager = sys.argv[1:4]
    {"fixed": scalar_and_fixed, "var": varshape, "ms": measurement_set,
     "shared": shared_tiles, "coordinates": coordinates,
     "coordinates-big": lambda p, m: coordinates(p, m, "big")}[what](path, manager)
