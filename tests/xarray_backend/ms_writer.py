"""MeasurementSets python-casacore writes for the xarray backend's tests (run in a
subprocess, so that a ``.casarc`` can choose MultiFile storage or big-endian files).

    python3 ms_writer.py PATH '{"layout": "tiled", "autocorrs": true, ...}'

Every MS has 4 antennas, one FEED row each (SPECTRAL_WINDOW_ID -1), and rows laid out
time by time; the options choose what the xarray-ms rules are tested on (see ``SPEC``).
"""

import json
import sys

import casacore.tables as ct
import numpy as np

SPEC = {
    "layout": "tiled",  # "tiled" (TiledShapeStMan DATA/FLAG...), "ssm" (StandardStMan
    # only), or the tiled one with casacore 3.8's compressing managers (one DATA_DESCRIPTION:
    # fixed cell shapes): "dysco" (DATA and WEIGHT_SPECTRUM in DyscoStMan), "sisco" (DATA in
    # SiscoStMan), "stokes" (DATA and WEIGHT_SPECTRUM in StokesIStMan, cells [I, 0, 0, I];
    # ANTENNA1/2 in AntennaPairStMan, UVW in UvwStMan); Dysco, AntennaPairStMan and
    # UvwStMan need every time step to hold the same baselines ("missing": False)
    "nant": 4,
    "ntime": 5,
    "spws": [8, 4],  # channels per spectral window
    "pols": [[9, 10, 11, 12], [5, 8], [9]],  # CORR_TYPE per POLARIZATION row
    "ddids": [[0, 0], [1, 1], [0, 2]],  # (spw, pol) per DATA_DESCRIPTION row
    "autocorrs": True,
    "reversed": True,  # some baselines written as (ANTENNA2, ANTENNA1)
    "missing": True,  # some rows left out
    "fields": 2,  # fields alternate with time
    "states": ["CALIBRATE_PHASE,ON_SOURCE", "OBSERVE_TARGET#ON_SOURCE"],
    "observations": 1,
    "weight_spectrum": True,
    "corrected": True,  # CORRECTED_DATA and MODEL_DATA
    "irregular_interval": False,
    "irregular_width": False,
    "source": True,  # a SOURCE subtable
    "flag_row_only": False,
    "feed_rows": None,  # FEED rows (default: one per antenna); fewer leave antennas unknown
    "duplicate": False,  # the first row written twice
    "pointing": None,  # POINTING rows: "regular" (every antenna at every time and one
    # step beyond, no interval), "irregular" (antenna 0 skips a time; intervals given),
    # "duplicate" (regular, a row at the first time written twice)
    "weather": None,  # WEATHER rows: "antenna" (by ANTENNA_ID, all but the last antenna),
    # "station" (by NS_WX_STATION_ID: two stations with positions, ANTENNA_ID -1)
    "syscal": False,  # SYSCAL rows of every antenna and time, for spectral windows 0 and 1:
    # TSYS and TANT_TSYS per receptor, TCAL_SPECTRUM per channel and receptor
    "phased_array": None,  # PHASED_ARRAY rows: "stations" (antenna i a station of 3 + i
    # elements), "undefined" (the same, the last row's ELEMENT_OFFSET left undefined)
}


def _values(rng, shape, dtype):
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.3
    return rng.random(shape).astype(dtype)


# the compressing layouts: {layout: {storage manager: its columns}}, and the managers' specs
COMPRESSED = {
    "dysco": {"DyscoStMan": ["DATA", "WEIGHT_SPECTRUM"]},
    "sisco": {"SiscoStMan": ["DATA"]},
    "stokes": {"StokesIStMan": ["DATA", "WEIGHT_SPECTRUM"],
               "AntennaPairStMan": ["ANTENNA1", "ANTENNA2"], "UvwStMan": ["UVW"]},
}
MANAGER_SPECS = {"DyscoStMan": {"dataBitCount": 10, "weightBitCount": 12,
                                "distribution": "TruncatedGaussian", "normalization": "AF",
                                "studentTNu": 0.0, "distributionTruncation": 2.5}}


def _compressed(spec):
    """{column: storage manager} of the layout's compressing managers."""
    return {column: manager for manager, columns in COMPRESSED.get(spec["layout"], {}).items()
            for column in columns}


def _main_desc(spec):
    spw, pol = spec["ddids"][0]
    fixed = {"shape": [spec["spws"][spw], len(spec["pols"][pol])], "options": 5}

    def cell(name, value, valuetype):  # (the compressing managers: fixed shapes)
        return ct.makearrcoldesc(name, value, valuetype=valuetype,
                                 **(fixed if name in _compressed(spec) else {"ndim": 2}))

    cols = [cell("DATA", 0j, "complex")]
    if spec["weight_spectrum"]:
        cols.append(cell("WEIGHT_SPECTRUM", 0.0, "float"))
    if spec["corrected"]:
        cols += [cell(n, 0j, "complex") for n in ("CORRECTED_DATA", "MODEL_DATA")]
    desc = ct.maketabdesc(cols)
    desc["DATA"]["keywords"] = {"UNIT": "Jy"}
    return desc


def _dminfo(spec, desc):
    if spec["layout"] == "ssm":
        return {"*1": {"TYPE": "StandardStMan", "NAME": "SSM", "SPEC": {"BUCKETSIZE": 8192},
                       "COLUMNS": sorted(desc) + ["FLAG", "UVW", "WEIGHT", "SIGMA",
                                                  "FLAG_CATEGORY"]}}
    compressed = _compressed(spec)
    info = {}
    for i, name in enumerate(sorted(desc) + ["FLAG"]):
        if name not in compressed:
            info[f"*{i + 1}"] = {"TYPE": "TiledShapeStMan", "NAME": f"Tiled{name}",
                                 "COLUMNS": [name],
                                 "SPEC": {"DEFAULTTILESHAPE": np.array([4, 8, 16], np.int32)}}
    if "UVW" not in compressed:
        info["*uvw"] = {"TYPE": "TiledColumnStMan", "NAME": "TiledUVW", "COLUMNS": ["UVW"],
                        "SPEC": {"DEFAULTTILESHAPE": np.array([3, 64], np.int32)}}
    for manager, columns in COMPRESSED.get(spec["layout"], {}).items():
        info[f"*{manager}"] = {"TYPE": manager, "NAME": manager, "COLUMNS": columns,
                               "SPEC": MANAGER_SPECS.get(manager, {})}
    return info


def _rows(spec, rng):
    """(TIME, INTERVAL, ANTENNA1, ANTENNA2, DDID, FIELD, STATE, OBS, SCAN) per row."""
    nant = spec["nant"]
    pairs = [(a, b) for a in range(nant) for b in range(a, nant)
             if spec["autocorrs"] or a != b]
    rows = []
    for obs in range(spec["observations"]):
        for t in range(spec["ntime"]):
            interval = 2.0 if not spec["irregular_interval"] else [2.0, 3.0][t % 2]
            time = 4.9e9 + 100 * obs + 2.5 * t + (t % 2) * 0.5 * spec["irregular_interval"]
            field = t % spec["fields"]
            state = t % len(spec["states"]) if spec["states"] else -1
            for ddid in range(len(spec["ddids"])):
                for k, (a, b) in enumerate(pairs):
                    if spec["missing"] and (t * 7 + k * 3 + ddid) % 11 == 0:
                        continue
                    if spec["reversed"] and (k + t) % 5 == 1:
                        a, b = b, a
                    rows.append((time, interval, a, b, ddid, field, state, obs, 1 + t // 2))
    return rows[:1] + rows if spec["duplicate"] else rows


def write(path, spec):
    spec = {**SPEC, **spec}
    rng = np.random.default_rng(42)
    desc = _main_desc(spec)
    t = ct.default_ms(path, desc, _dminfo(spec, desc))
    rows = _rows(spec, rng)
    t.addrows(len(rows))
    cols = list(zip(*rows))
    t.putcol("TIME", np.array(cols[0]))
    t.putcol("TIME_CENTROID", np.array(cols[0]) + 0.25)
    t.putcol("INTERVAL", np.array(cols[1]))
    t.putcol("EXPOSURE", np.array(cols[1]) * 0.9)
    for name, i in (("ANTENNA1", 2), ("ANTENNA2", 3), ("DATA_DESC_ID", 4), ("FIELD_ID", 5),
                    ("STATE_ID", 6), ("OBSERVATION_ID", 7), ("SCAN_NUMBER", 8)):
        if name not in _compressed(spec):
            t.putcol(name, np.array(cols[i], np.int32))
    if spec["layout"] == "stokes":
        _put_pairs_and_uvw(t, spec, rng, cols)
    else:
        t.putcol("UVW", _values(rng, (len(rows), 3), np.float64))
    if len(spec["ddids"]) == 1:  # one cell shape: whole columns at once (large MSes)
        _put_cells(t, spec, rng, len(rows))
    for row, ddid in enumerate(cols[4] if len(spec["ddids"]) > 1 else ()):
        spw, pol = spec["ddids"][ddid]
        shape = (spec["spws"][spw], len(spec["pols"][pol]))
        t.putcell("DATA", row, _values(rng, shape, np.complex64))
        t.putcell("FLAG", row, _values(rng, shape, np.bool_))
        t.putcell("WEIGHT", row, _values(rng, shape[1:], np.float32))
        t.putcell("SIGMA", row, _values(rng, shape[1:], np.float32))
        if spec["weight_spectrum"]:
            t.putcell("WEIGHT_SPECTRUM", row, _values(rng, shape, np.float32))
        if spec["corrected"]:
            t.putcell("CORRECTED_DATA", row, _values(rng, shape, np.complex64))
            t.putcell("MODEL_DATA", row, _values(rng, shape, np.complex64))
    t.putcol("FLAG_ROW", _values(rng, len(rows), np.bool_))
    if spec["flag_row_only"]:
        t.removecols(["FLAG"])
    t.close()
    _subtables(path, spec, rng)


def _put_cells(t, spec, rng, nrow):
    spw, pol = spec["ddids"][0]
    shape = (nrow, spec["spws"][spw], len(spec["pols"][pol]))
    names = [("DATA", np.complex64), ("FLAG", np.bool_)] + \
        [("WEIGHT_SPECTRUM", np.float32)] * spec["weight_spectrum"] + \
        [("CORRECTED_DATA", np.complex64), ("MODEL_DATA", np.complex64)] * spec["corrected"]
    for name, dtype in names:
        for start in range(0, nrow, 8192):
            count = min(8192, nrow - start)
            values = _values(rng, (count,) + shape[1:], dtype)
            if _compressed(spec).get(name) == "StokesIStMan":
                values[..., 1:3], values[..., 3] = 0, values[..., 0]
            t.putcol(name, values, start, count)
    for name in ("WEIGHT", "SIGMA"):
        t.putcol(name, _values(rng, (nrow, shape[2]), np.float32))


def _put_pairs_and_uvw(t, spec, rng, cols):
    """ANTENNA1/2 a row at a time (AntennaPairStMan needs each row's pair whole before the
    next), UVW as differences of per-antenna positions at each time (as UvwStMan stores)."""
    for row, (a1, a2) in enumerate(zip(cols[2], cols[3])):
        t.putcell("ANTENNA1", row, a1)
        t.putcell("ANTENNA2", row, a2)
    _, step = np.unique(np.array(cols[0]), return_inverse=True)
    positions = rng.normal(size=(step.max() + 1, spec["nant"], 3)) * 3000
    t.putcol("UVW", positions[step, np.array(cols[3])] - positions[step, np.array(cols[2])])


def _put(path, nrow, **columns):
    sub = ct.table(path, readonly=False, ack=False)
    sub.addrows(nrow)
    for name, value in columns.items():
        sub.putcol(name, value)
    sub.close()


def _subtables(path, spec, rng):
    nant = spec["nant"]
    nfeed = spec["feed_rows"] or nant
    _put(f"{path}/ANTENNA", nant, NAME=[f"A{i:02}" for i in range(nant)],
         STATION=[f"PAD{i}" for i in range(nant)], MOUNT=["ALT-AZ"] * nant,
         TYPE=["GROUND-BASED"] * nant, POSITION=5e6 + rng.random((nant, 3)) * 1e3,
         DISH_DIAMETER=np.full(nant, 13.5))
    _put(f"{path}/FEED", nfeed, ANTENNA_ID=np.arange(nfeed, dtype=np.int32),
         FEED_ID=np.zeros(nfeed, np.int32), SPECTRAL_WINDOW_ID=np.full(nfeed, -1, np.int32),
         NUM_RECEPTORS=np.full(nfeed, 2, np.int32), POLARIZATION_TYPE=np.array([["X", "Y"]] * nfeed),
         RECEPTOR_ANGLE=rng.random((nfeed, 2)), BEAM_OFFSET=np.zeros((nfeed, 2, 2)),
         POL_RESPONSE=np.zeros((nfeed, 2, 2), np.complex64), POSITION=np.zeros((nfeed, 3)),
         TIME=np.zeros(nfeed), INTERVAL=np.zeros(nfeed))
    nspw = len(spec["spws"])
    spw = ct.table(f"{path}/SPECTRAL_WINDOW", readonly=False, ack=False)
    spw.addrows(nspw)
    for i, nchan in enumerate(spec["spws"]):
        width = np.full(nchan, 1e6 * (i + 1))
        if spec["irregular_width"]:
            width[: nchan // 2] *= 2
        freq = 1.4e9 + 1e8 * i + np.cumsum(width)
        for name, value in (("CHAN_FREQ", freq), ("CHAN_WIDTH", width),
                            ("EFFECTIVE_BW", width), ("RESOLUTION", width)):
            spw.putcell(name, i, value)
        spw.putcell("NUM_CHAN", i, nchan)
        spw.putcell("REF_FREQUENCY", i, freq[0])
        spw.putcell("TOTAL_BANDWIDTH", i, width.sum())
        spw.putcell("NAME", i, f"SPW{i}")
        spw.putcell("MEAS_FREQ_REF", i, [5, 1][i % 2])  # TOPO, LSRK
    spw.close()
    pol = ct.table(f"{path}/POLARIZATION", readonly=False, ack=False)
    pol.addrows(len(spec["pols"]))
    for i, corr in enumerate(spec["pols"]):
        pol.putcell("CORR_TYPE", i, np.array(corr, np.int32))
        pol.putcell("CORR_PRODUCT", i, np.zeros((len(corr), 2), np.int32))
        pol.putcell("NUM_CORR", i, len(corr))
    pol.close()
    ddids = np.array(spec["ddids"], np.int32)
    _put(f"{path}/DATA_DESCRIPTION", len(ddids), SPECTRAL_WINDOW_ID=ddids[:, 0],
         POLARIZATION_ID=ddids[:, 1])
    nfield = spec["fields"]
    _put(f"{path}/FIELD", nfield, NAME=[f"FIELD{i}" for i in range(nfield)],
         SOURCE_ID=np.arange(nfield, dtype=np.int32), NUM_POLY=np.zeros(nfield, np.int32),
         PHASE_DIR=rng.random((nfield, 1, 2)), DELAY_DIR=rng.random((nfield, 1, 2)),
         REFERENCE_DIR=rng.random((nfield, 1, 2)))
    if spec["states"]:
        _put(f"{path}/STATE", len(spec["states"]), OBS_MODE=spec["states"],
             SUB_SCAN=np.arange(len(spec["states"]), dtype=np.int32),
             SIG=[True] * len(spec["states"]), REF=[False] * len(spec["states"]))
    nobs = spec["observations"]
    _put(f"{path}/OBSERVATION", nobs, TELESCOPE_NAME=["MeerKAT"] * nobs,
         OBSERVER=[f"observer{i}" for i in range(nobs)],
         PROJECT=[f"project{i}" for i in range(nobs)],
         RELEASE_DATE=np.full(nobs, 4.9e9), TIME_RANGE=np.full((nobs, 2), 4.9e9))
    _put(f"{path}/PROCESSOR", 1, TYPE=["CORRELATOR"], SUB_TYPE=["MeerKAT"])
    if spec["pointing"]:
        _pointing(path, spec, rng)
    if spec["weather"]:
        _weather(path, spec, rng)
    if spec["syscal"]:
        _syscal(path, spec, rng)
    if spec["phased_array"]:
        _phased_array(path, spec, rng)
    if spec["source"]:
        src = ct.default_ms_subtable("SOURCE", f"{path}/SOURCE")
        src.addrows(nfield)
        src.putcol("SOURCE_ID", np.arange(nfield, dtype=np.int32))
        src.putcol("NAME", [f"SRC{i}" for i in range(nfield)])
        src.putcol("DIRECTION", rng.random((nfield, 2)))
        src.putcol("SPECTRAL_WINDOW_ID", np.full(nfield, -1, np.int32))
        src.close()
        ms = ct.table(path, readonly=False, ack=False)
        ms.putkeyword("SOURCE", f"Table: {path}/SOURCE")
        ms.close()


def _pointing(path, spec, rng):
    with ct.table(path, ack=False) as ms:
        times = np.unique(ms.getcol("TIME"))
    step = times[1] - times[0] if len(times) > 1 else 1.0
    times = np.concatenate([[times[0] - step], times, [times[-1] + step]])
    rows = [(a, t) for t in times for a in range(spec["nant"])]
    if spec["pointing"] == "irregular":
        rows = [(a, t) for a, t in rows if a or t != times[2]]
    if spec["pointing"] == "duplicate":
        rows.append(rows[spec["nant"]])  # (a time of the partitions)
    n = len(rows)
    interval = np.full(n, step if spec["pointing"] == "irregular" else 0.0)
    _put(f"{path}/POINTING", n, ANTENNA_ID=np.array([a for a, _ in rows], np.int32),
         TIME=np.array([t for _, t in rows]), INTERVAL=interval,
         NUM_POLY=np.zeros(n, np.int32), DIRECTION=rng.random((n, 1, 2)),
         TARGET=rng.random((n, 1, 2)), TRACKING=np.ones(n, bool),
         NAME=[""] * n, TIME_ORIGIN=np.zeros(n))


def _weather(path, spec, rng):
    with ct.table(path, ack=False) as ms:
        times = np.unique(ms.getcol("TIME"))
    times = np.concatenate([times, [times[-1] + 100.0]])  # (the last: outside every span)
    desc = ct.complete_ms_desc("WEATHER")
    by_station = spec["weather"] == "station"
    if by_station:
        desc.update(ct.maketabdesc([
            ct.makescacoldesc("NS_WX_STATION_ID", 0),
            ct.makearrcoldesc("NS_WX_STATION_POSITION", 0.0, ndim=1, shape=[3])]))
        desc["NS_WX_STATION_POSITION"]["keywords"] = {"QuantumUnits": ["m", "m", "m"]}
    table = ct.default_ms_subtable("WEATHER", f"{path}/WEATHER", desc)
    keys = range(2) if by_station else range(spec["nant"] - 1)
    rows = [(k, t) for t in times for k in keys]
    n = len(rows)
    table.addrows(n)
    key = np.array([k for k, _ in rows], np.int32)
    table.putcol("ANTENNA_ID", np.full(n, -1, np.int32) if by_station else key)
    table.putcol("TIME", np.array([t for _, t in rows]))
    table.putcol("INTERVAL", np.full(n, 0.05))
    for name in ("PRESSURE", "TEMPERATURE", "REL_HUMIDITY", "H2O"):
        table.putcol(name, 1000 * rng.random(n).astype(np.float32))
    if by_station:
        table.putcol("NS_WX_STATION_ID", key)
        table.putcol("NS_WX_STATION_POSITION", 5e6 + rng.random((n, 3)))
    table.close()
    with ct.table(path, readonly=False, ack=False) as ms:
        ms.putkeyword("WEATHER", f"Table: {path}/WEATHER")


def _syscal(path, spec, rng):
    with ct.table(path, ack=False) as ms:
        times = np.unique(ms.getcol("TIME"))
    table = ct.default_ms_subtable("SYSCAL", f"{path}/SYSCAL",
                                   ct.complete_ms_desc("SYSCAL"))
    rows = [(a, t, w) for w in (0, 1) for t in times for a in range(spec["nant"])]
    n = len(rows)
    table.addrows(n)
    table.putcol("ANTENNA_ID", np.array([a for a, _, _ in rows], np.int32))
    table.putcol("TIME", np.array([t for _, t, _ in rows]))
    table.putcol("SPECTRAL_WINDOW_ID", np.array([w for _, _, w in rows], np.int32))
    table.putcol("FEED_ID", np.zeros(n, np.int32))
    table.putcol("INTERVAL", np.full(n, 2.0))
    table.putcol("TSYS", 20 + rng.random((n, 2)).astype(np.float32))
    table.putcol("TANT_TSYS", rng.random((n, 2)).astype(np.float32))
    table.putcol("TCAL_SPECTRUM", rng.random((n, 3, 2)).astype(np.float32))
    table.putcol("PHASE_DIFF", rng.random(n).astype(np.float32))
    table.close()
    with ct.table(path, readonly=False, ack=False) as ms:
        ms.putkeyword("SYSCAL", f"Table: {path}/SYSCAL")


def _phased_array(path, spec, rng):
    desc = ct.maketabdesc([
        ct.makescacoldesc("ANTENNA_ID", 0),
        ct.makearrcoldesc("COORDINATE_AXES", 0.0, ndim=2, shape=[3, 3]),
        ct.makearrcoldesc("ELEMENT_OFFSET", 0.0, ndim=2),
        ct.makearrcoldesc("ELEMENT_FLAG", False, ndim=2)])
    desc["ELEMENT_OFFSET"]["keywords"] = {"QuantumUnits": ["m", "m", "m"]}
    nant = spec["nant"]
    with ct.table(f"{path}/PHASED_ARRAY", desc, nrow=nant, ack=False) as table:
        table.putcol("ANTENNA_ID", np.arange(nant, dtype=np.int32)[::-1].copy())
        table.putcol("COORDINATE_AXES", rng.random((nant, 3, 3)))
        for row in range(nant):
            count = 3 + row
            if spec["phased_array"] != "undefined" or row < nant - 1:
                table.putcell("ELEMENT_OFFSET", row, rng.random((3, count)))
            table.putcell("ELEMENT_FLAG", row, rng.random((2, count)) < 0.3)
    with ct.table(path, readonly=False, ack=False) as ms:
        ms.putkeyword("PHASED_ARRAY", f"Table: {path}/PHASED_ARRAY")


if __name__ == "__main__":
    write(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
