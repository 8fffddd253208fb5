"""MeasurementSets whose DATA-like columns python-casacore 3.8 stores with DyscoStMan, for
the Dysco decoder's tests (run in a subprocess so a ``.casarc`` can choose MultiFile
storage): ``python3 dysco_ms.py PATH JSON`` with the settings of :func:`write`."""

import json
import sys

import casacore.tables as ct
import numpy as np

LAYOUT = {"antennas": 4, "times": 3, "channels": 5, "pols": 4, "cut": 0, "seed": 1,
          "specials": False, "values": None}


def spec(data_bits=10, weight_bits=12, distribution="TruncatedGaussian", normalization="AF",
         nu=0.0, truncation=2.5):
    return {"dataBitCount": data_bits, "weightBitCount": weight_bits,
            "distribution": distribution, "normalization": normalization,
            "studentTNu": nu, "distributionTruncation": truncation}


def visibilities(rng, shape, specials, autos):
    """Noise, strong in the autocorrelations; with ``specials`` also a row of zeros, a
    channel of zeros, NaN and infinite values, a flagged row of huge values, tiny ones."""
    data = (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    data *= rng.uniform(0.5, 20, size=(shape[0], 1, 1)).astype(np.float32)
    data[autos] = (np.abs(data[autos]) * 30).astype(np.complex64)
    if specials:
        data[1] = 0
        data[:, 2 % shape[1], :] = 0
        data[3, 1 % shape[1], 0] = np.nan
        data[4, 0, 1 % shape[2]] = complex(np.inf, 1)
        data[5, 3 % shape[1], 2 % shape[2]] = complex(1, -np.inf)
        data[6] = complex(np.nan, np.nan)
        data[7] *= np.float32(1e6)
        data[8] *= np.float32(1e-6)
    return data


def write(path, settings):
    """``settings``: LAYOUT's keys, and ``managers``: a list of {"name", "spec" (see
    :func:`spec`), "columns"}; ``values`` names an .npz of exact values per column."""
    s = dict(LAYOUT, **settings)
    shape = [s["channels"], s["pols"]]
    columns, dminfo = [], {}
    for n, manager in enumerate(s["managers"]):
        for name in manager["columns"]:
            weight = name == "WEIGHT_SPECTRUM"
            columns.append(ct.makearrcoldesc(name, 0.0 if weight else 0j, shape=shape,
                                             valuetype="float" if weight else "complex",
                                             options=5))
        dminfo[f"*{n + 1}"] = {"TYPE": "DyscoStMan", "NAME": manager["name"],
                               "SPEC": manager["spec"], "COLUMNS": list(manager["columns"])}
    t = ct.default_ms(path, ct.maketabdesc(columns), dminfo)
    pairs = [(a, b) for a in range(s["antennas"]) for b in range(a, s["antennas"])]
    nrow = s["times"] * len(pairs) - s["cut"]
    t.addrows(nrow)
    t.putcol("ANTENNA1", np.array([p[0] for p in pairs] * s["times"], np.int32)[:nrow])
    t.putcol("ANTENNA2", np.array([p[1] for p in pairs] * s["times"], np.int32)[:nrow])
    t.putcol("TIME", np.repeat(np.arange(s["times"], dtype=float) * 10, len(pairs))[:nrow])
    autos = np.array([a == b for a, b in pairs] * s["times"])[:nrow]
    rng = np.random.default_rng(s["seed"])
    cells = (nrow, s["channels"], s["pols"])
    if s["specials"]:
        flags = np.zeros(cells, bool)
        flags[7] = True
        t.putcol("FLAG", flags)
    exact = np.load(s["values"]) if s["values"] else {}
    for manager in s["managers"]:
        for name in manager["columns"]:
            if name in exact:
                t.putcol(name, exact[name])
            elif name == "WEIGHT_SPECTRUM":
                weights = rng.uniform(0, 5, size=cells).astype(np.float32)
                if s["specials"]:
                    weights[1] = 0
                    weights[7] = 0
                t.putcol(name, weights)
            else:
                t.putcol(name, visibilities(rng, cells, s["specials"], autos))
    t.close()


if __name__ == "__main__":
    write(sys.argv[1], json.loads(sys.argv[2]))
