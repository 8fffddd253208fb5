"""MeasurementSets in casacore 3.8's alternate storage managers, written by python-casacore
(run as a script: ``altman_tables.py KIND PATH``; the caller's HOME/.casarc chooses
separate files or MultiFile)."""

import sys

import casacore.tables as ct
import numpy as np

SISCO_LEVELS = (-1, 0, 1, 2, 3, 10, 11, 12, 21)


def _pairs(antennas, autos, by_antenna2=False):
    pairs = [(a, b) for a in antennas for b in antennas if (a <= b if autos else a < b)]
    return [(b, a) for a, b in pairs] if by_antenna2 else pairs


def _filled(path, columns, dminfo, pairs, times, channels):
    """A MeasurementSet of ``times`` time steps of ``pairs``: ANTENNA1/ANTENNA2 written row
    by row (AntennaPairStMan needs each row's pair whole before the next), UVW from
    per-antenna positions (UvwStMan needs them consistent per time step)."""
    t = ct.default_ms(path, ct.maketabdesc(columns), dminfo)
    nrow = len(pairs) * times
    t.addrows(nrow)
    a1 = np.array([p[0] for p in pairs] * times, np.int32)
    a2 = np.array([p[1] for p in pairs] * times, np.int32)
    for row in range(nrow):
        t.putcell("ANTENNA1", row, int(a1[row]))
        t.putcell("ANTENNA2", row, int(a2[row]))
    rng = np.random.default_rng(7)
    positions = rng.normal(size=(times, max(max(p) for p in pairs) + 1, 3)) * 3000
    step = np.arange(nrow) // len(pairs)
    t.putcol("UVW", positions[step, a2] - positions[step, a1])
    t.putcol("FIELD_ID", (step // 3).astype(np.int32))
    return t, nrow, a1, a2, step


def stokes_i_set(path, antennas=range(5), times=4, channels=6, autos=True, by_antenna2=False):
    """AntennaPairStMan, UvwStMan, and StokesIStMan for DATA, WEIGHT_SPECTRUM and FLAG."""
    columns = [ct.makearrcoldesc("DATA", 0j, valuetype="complex", shape=[channels, 4],
                                 options=5),
               ct.makearrcoldesc("WEIGHT_SPECTRUM", 0.0, valuetype="float",
                                 shape=[channels, 4], options=5),
               ct.makearrcoldesc("FLAG", False, shape=[channels, 4], options=5)]
    dminfo = {"*1": {"TYPE": "AntennaPairStMan", "NAME": "pairs", "SPEC": {},
                     "COLUMNS": ["ANTENNA1", "ANTENNA2"]},
              "*2": {"TYPE": "UvwStMan", "NAME": "uvw", "SPEC": {}, "COLUMNS": ["UVW"]},
              "*3": {"TYPE": "StokesIStMan", "NAME": "stokes", "SPEC": {},
                     "COLUMNS": ["DATA", "WEIGHT_SPECTRUM", "FLAG"]}}
    pairs = _pairs(list(antennas), autos, by_antenna2)
    t, nrow, _, _, _ = _filled(path, columns, dminfo, pairs, times, channels)
    rng = np.random.default_rng(8)
    data = (rng.normal(size=(nrow, channels)) + 1j * rng.normal(size=(nrow, channels)))
    cells = np.zeros((nrow, channels, 4), np.complex64)
    cells[..., 0] = cells[..., 3] = data
    t.putcol("DATA", cells)
    weights = np.repeat(rng.uniform(0, 2, (nrow, channels, 1)), 4, axis=2)
    weights[..., 1:3] = 0
    t.putcol("WEIGHT_SPECTRUM", weights.astype(np.float32))
    t.close()
    # casacore 3.8 keeps a Bool cell written with the other columns in its row buffer
    # and writes that buffer back over it: FLAG goes in alone, after a reopen
    t = ct.table(path, readonly=False, ack=False)
    t.putcol("FLAG", np.repeat(rng.uniform(size=(nrow, channels, 1)) < 0.3, 4, axis=2))
    t.close()


def sisco_set(path, structured, antennas=range(3), times=5, channels=6,
              levels=SISCO_LEVELS, modes=True):
    """One SiscoStMan column a prediction level (``L<level>``, 4 correlations), and (with
    ``modes``) DATA_I / DATA_DIAG stored as Stokes I and diagonal and DATA_2 of 2
    correlations; NaN, infinities, zeros, negative zero and a subnormal among the values."""
    names = {f"L{abs(level)}{'m' if level < 0 else ''}": {"predict_level": level}
             for level in levels}
    if modes:
        names.update({"DATA_I": {"stokes_i": True}, "DATA_DIAG": {"diagonal": True},
                      "DATA_2": {}})
    columns = [ct.makearrcoldesc(name, 0j, valuetype="complex",
                                 shape=[channels, 2 if name == "DATA_2" else 4], options=4)
               for name in names]
    dminfo = {f"*{i + 1}": {"TYPE": "SiscoStMan", "NAME": f"sisco{i}", "SPEC": spec,
                            "COLUMNS": [name]} for i, (name, spec) in enumerate(names.items())}
    pairs = _pairs(list(antennas), True)
    t, nrow, a1, a2, step = _filled(path, columns, dminfo, pairs, times, channels)
    rng = np.random.default_rng(9)
    for name in names:
        shape = (nrow, channels, 2 if name == "DATA_2" else 4)
        if structured:
            phase = 0.1 * step[:, None, None] + 0.05 * np.arange(channels)[None, :, None]
            values = np.exp(1j * (phase + a1[:, None, None])) * (5 + a2[:, None, None])
            values = values + 0.01 * rng.normal(size=shape)
        else:
            values = (rng.normal(size=shape) + 1j * rng.normal(size=shape)) * \
                10.0 ** rng.integers(-4, 5, size=shape)
        values = values.astype(np.complex64)
        values[2, 1, 0], values[3, 2, 0], values[4] = np.nan, np.inf - 1j * np.inf, 0
        values[5, 0, 0], values[5, 1, 0] = -0.0, 1e-40
        if name == "DATA_I":
            values[..., 1:3], values[..., 3] = 0, values[..., 0]
        elif name == "DATA_DIAG":
            values[..., 1:3] = 0
        t.putcol(name, values)
    t.close()


if __name__ == "__main__":
    kind, path = sys.argv[1:3]
    {"stokes": lambda: stokes_i_set(path),
     "stokes-large": lambda: stokes_i_set(path, range(12), 30, 24),
     "stokes-by-antenna2": lambda: stokes_i_set(path, range(1, 5), 1, 3, autos=False,
                                                by_antenna2=True),
     "sisco-random": lambda: sisco_set(path, False),
     "sisco-structured": lambda: sisco_set(path, True),
     "sisco-large": lambda: sisco_set(path, True, range(8), 40, 32, (2, 12), False)}[kind]()
