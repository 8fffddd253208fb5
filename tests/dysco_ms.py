"""MeasurementSets whose DATA-like columns python-casacore 3.8 stores with DyscoStMan, for
the Dysco decoder's tests (run in a subprocess so a ``.casarc`` can choose MultiFile
storage): ``python3 dysco_ms.py PATH JSON`` with the settings of :func:`write`."""

import json
import sys

import casacore.tables as ct
import numpy as np

SETTINGS = {"data_bits": 10, "weight_bits": 12, "distribution": "TruncatedGaussian",
            "normalization": "AF", "nu": 0.0, "truncation": 2.5, "antennas": 4, "times": 3,
            "channels": 5, "pols": 4, "columns": ["DATA"], "specials": False, "cut": 0,
            "seed": 1, "values": None}


def visibilities(rng, shape, specials, pairs):
    """Noise with strong autocorrelations; with ``specials`` also a row of zeros, a channel
    of zeros, NaN and infinite values, a flagged row of huge values and tiny ones."""
    data = (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    data *= rng.uniform(0.5, 20, size=(shape[0], 1, 1)).astype(np.float32)
    autos = np.array([a == b for a, b in pairs] * (shape[0] // len(pairs) + 1))[:shape[0]]
    data[autos] = (np.abs(data[autos]) * 30).astype(np.complex64)
    if specials:
        data[1] = 0
        data[:, 2, :] = 0
        data[3, 1, 0] = np.nan
        data[4, 0, 1] = complex(np.inf, 1)
        data[5, 3, 2] = complex(1, -np.inf)
        data[6] = complex(np.nan, np.nan)
        data[7] *= np.float32(1e6)
        data[8] *= np.float32(1e-6)
    return data


def write(path, settings):
    s = dict(SETTINGS, **settings)
    columns = []
    for name in s["columns"]:
        weight = name == "WEIGHT_SPECTRUM"
        columns.append(ct.makearrcoldesc(name, 0.0 if weight else 0j,
                                         valuetype="float" if weight else "complex",
                                         shape=[s["channels"], s["pols"]], options=5))
    spec = {"dataBitCount": s["data_bits"], "weightBitCount": s["weight_bits"],
            "distribution": s["distribution"], "normalization": s["normalization"],
            "studentTNu": s["nu"], "distributionTruncation": s["truncation"]}
    dminfo = {"*1": {"TYPE": "DyscoStMan", "NAME": "Dysco", "SPEC": spec,
                     "COLUMNS": list(s["columns"])}}
    t = ct.default_ms(path, ct.maketabdesc(columns), dminfo)
    pairs = [(a, b) for a in range(s["antennas"]) for b in range(a, s["antennas"])]
    nrow = s["times"] * len(pairs) - s["cut"]
    t.addrows(nrow)
    t.putcol("ANTENNA1", np.array([p[0] for p in pairs] * s["times"], np.int32)[:nrow])
    t.putcol("ANTENNA2", np.array([p[1] for p in pairs] * s["times"], np.int32)[:nrow])
    t.putcol("TIME", np.repeat(np.arange(s["times"], dtype=float) * 10, len(pairs))[:nrow])
    rng = np.random.default_rng(s["seed"])
    shape = (nrow, s["channels"], s["pols"])
    flags = np.zeros(shape, bool)
    if s["specials"]:
        flags[7] = True
    t.putcol("FLAG", flags)
    for name in s["columns"]:
        if name == "WEIGHT_SPECTRUM":
            weights = rng.uniform(0, 5, size=shape).astype(np.float32)
            if s["specials"]:
                weights[1] = 0
                weights[7] = 0
            t.putcol(name, weights)
        elif s["values"] is not None:  # exact values: each a table entry (see the tests)
            t.putcol(name, np.array(s["values"], np.float32).view(np.complex64).reshape(shape))
        else:
            t.putcol(name, visibilities(rng, shape, s["specials"], pairs))
    t.close()


if __name__ == "__main__":
    write(sys.argv[1], json.loads(sys.argv[2]))
