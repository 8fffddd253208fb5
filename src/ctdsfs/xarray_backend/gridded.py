"""``pointing_xds``, ``weather_xds`` and ``system_calibration_xds``: the POINTING,
WEATHER and SYSCAL rows of a partition's antennas (or weather stations) and time span on
a (time, antenna) grid, by xarray-ms's rules; and ``phased_array_xds``, PHASED_ARRAY's
rows of the partition's antennas.

A row holds for its INTERVAL around its TIME; a sample much shorter than its antenna's
cadence (or of no interval) holds for the cadence, and without a cadence for ever. The
rows kept are those of the partition's antennas holding at some time of the partition's
span (its times widened by half its longest interval); their unique TIMEs are the time
axis, and a cell without a row is NaN (with a warning).
"""

import warnings

import numpy as np
from xarray import Dataset, Variable

from .errors import (
    ColumnShapeImputationWarning,
    DuplicateSubtableRowWarning,
    InvalidMeasurementSet,
    IrregularSubtableGridWarning,
)
from .measures import measure_attrs, to_unix

MINIMUM_INTERVAL = 1e-6  # intervals under this are no interval
INSTANTANEOUS_FRACTION = 0.1  # of the cadence: a sample shorter holds until the next
SKY_DIR_LABELS = {"altaz": ["az", "alt"]}  # others: ["ra", "dec"]


def valid_intervals(time, interval, antenna):
    """How long each row holds (rows sorted by antenna, then time)."""
    out = np.where(interval > MINIMUM_INTERVAL, interval, np.inf)
    bounds = np.flatnonzero(antenna[1:] != antenna[:-1]) + 1
    for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, antenna.size].tolist()):
        steps = np.diff(time[lo:hi])
        steps = steps[steps > 0]
        if steps.size:
            cadence = np.median(steps)
            out[lo:hi] = np.where(interval[lo:hi] < INSTANTANEOUS_FRACTION * cadence,
                                  cadence, interval[lo:hi])
    return out


def partition_span(partition):
    half = partition.interval.max() / 2 if partition.interval.size else 0.0
    return partition.time.min() - half, partition.time.max() + half


def holding_rows(table, key, antenna_ids, span, among=None):
    """(rows sorted by ``key`` then TIME, their keys, their TIMEs) of ``table`` (of the
    rows ``among``, all by default) whose key is among ``antenna_ids`` and that hold
    within ``span``."""
    among = np.arange(table.nrow) if among is None else among
    antenna = np.asarray(table.array(key), np.int64)[among]
    time = np.asarray(table.array("TIME"), np.float64)[among]
    order = np.lexsort([time, antenna])
    antenna, time = antenna[order], time[order]
    interval = np.asarray(table.array("INTERVAL"), np.float64)[among][order]
    half = valid_intervals(time, interval, antenna) / 2
    start, end = span
    keep = np.flatnonzero(np.isin(antenna, antenna_ids) & (time + half >= start) &
                          (time - half <= end))
    return among[order[keep]], antenna[keep], time[keep], half[keep]


def gridded_rows(table, antenna_ids, span, key="ANTENNA_ID", among=None, times=None):
    """(times, (time, antenna) grid of ``table`` rows, -1 where none) of the rows
    (``among``, all by default) of ``antenna_ids`` holding within ``span``: on their
    unique TIMEs, or with ``times`` on those (see ``as_of``); None when there are none
    or a (TIME, ANTENNA_ID) repeats (with a warning)."""
    rows, antenna, time, half = holding_rows(table, key, antenna_ids, span, among)
    if rows.size == 0:
        return None
    if np.any((antenna[1:] == antenna[:-1]) & (time[1:] == time[:-1])):
        warnings.warn(f"Multiple rows of {table.name} share a (TIME, {key}) tuple, so "
                      f"it is not possible to establish a unique (time, antenna) grid. "
                      f"{table.name} will be omitted for antennas {antenna_ids.tolist()} "
                      f"over the time span {span}.", DuplicateSubtableRowWarning,
                      stacklevel=4)
        return None
    if times is not None:
        grid = as_of(time, half, antenna, rows, antenna_ids, times)
        return (times, grid) if (grid >= 0).any() else None
    utime, time_index = np.unique(time, return_inverse=True)
    sorter = np.argsort(antenna_ids)
    column = sorter[np.searchsorted(antenna_ids, antenna, sorter=sorter)]
    grid = np.full(utime.size * len(antenna_ids), -1, np.int64)
    grid[time_index * len(antenna_ids) + column] = rows
    missing = grid.size - rows.size
    if missing:
        warnings.warn(f"{missing} / {grid.size} cells of the (time, antenna) grid of "
                      f"{table.name} are missing and will be filled with default values. "
                      f"This occurs when antennas record values at differing times.",
                      IrregularSubtableGridWarning, stacklevel=4)
    return utime, grid.reshape(utime.size, len(antenna_ids))


def as_of(time, half, antenna, rows, antenna_ids, times):
    """The (``times``, antenna) grid of ``rows``: each cell the row of that antenna that
    began to hold last at or before the time (a row holding for ever, since the
    earliest start), if it still holds then; else -1."""
    start, end = time - half, time + half
    finite = np.isfinite(start)
    earliest = min(start[finite].min(initial=time.min()), times.min())
    start = np.where(finite, start, earliest)
    grid = np.full((times.size, len(antenna_ids)), -1, np.int64)
    for column, antenna_id in enumerate(np.asarray(antenna_ids).tolist()):
        mine = np.flatnonzero(antenna == antenna_id)
        mine = mine[np.argsort(start[mine], kind="stable")]
        at = np.searchsorted(start[mine], times, side="right") - 1
        found = np.flatnonzero(at >= 0)
        picked = mine[at[found]]
        holds = end[picked] >= times[found]
        grid[found[holds], column] = rows[picked[holds]]
    return grid


def _gathered(table, column, grid, first_row):
    """Column ``column`` on ``grid`` (float64, NaN where no row); None when the column is
    absent or undefined in the grid's first row."""
    if not table.has(column):
        return None
    cells = table.column(column)
    if isinstance(cells, np.ndarray):
        values = cells
    elif cells[first_row] is None:
        return None
    else:
        shape = np.shape(cells[first_row])
        values = np.stack([np.full(shape, np.nan) if c is None or np.shape(c) != shape
                           else c for c in cells])
    out = np.full(grid.shape + values.shape[1:], np.nan)
    present = grid >= 0
    out[present] = values[grid[present]]
    return out


def pointing_dataset(tables, partition, antenna_ids, antenna_names, interpolate=False):
    """The partition's pointing_xds (with ``interpolate`` on its times), or None (no
    POINTING rows for it)."""
    pointing = tables.subtable("POINTING")
    if pointing.nrow == 0:
        return None
    got = gridded_rows(pointing, np.asarray(antenna_ids), partition_span(partition),
                       times=partition.time if interpolate else None)
    if got is None:
        return None
    time, grid = got
    first_row = int(grid[grid >= 0][0])
    direction = _gathered(pointing, "DIRECTION", grid, first_row)
    if direction is None:
        return None
    if direction.ndim != 4 or direction.shape[3] != 2:
        raise InvalidMeasurementSet(f"{tables.source}/POINTING: DIRECTION cells of shape "
                                    f"{direction.shape[2:]}, not (NUM_POLY + 1, 2)")
    if direction.shape[2] != 1:
        raise NotImplementedError(f"POINTING NUM_POLY {direction.shape[2] - 1} > 0 is not "
                                  f"currently supported")
    time_dim = "time" if interpolate else "time_pointing"
    dims = (time_dim, "antenna_name", "local_sky_dir_label")
    attrs, _ = measure_attrs(pointing.keywords("DIRECTION"), "DIRECTION", pointing,
                             grid[grid >= 0])
    data_vars = {"POINTING_BEAM": Variable(dims, direction[:, :, 0], attrs)}
    encoder = _gathered(pointing, "ENCODER", grid, first_row)
    if encoder is not None:
        data_vars["POINTING_DISH_MEASURED"] = Variable(
            dims, encoder, measure_attrs(pointing.keywords("ENCODER"), "ENCODER", pointing,
                                         grid[grid >= 0])[0])
    over = _gathered(pointing, "OVER_THE_TOP", grid, first_row)
    if over is not None:
        data_vars["POINTING_OVER_THE_TOP"] = Variable(dims[:2], np.nan_to_num(over) != 0)
    time_attrs, epoch = measure_attrs(pointing.keywords("TIME"), "TIME")
    coords = {
        time_dim: Variable(time_dim, to_unix(time) if epoch else time,
                           {**time_attrs, "type": time_dim}),
        "antenna_name": Variable("antenna_name", np.asarray(antenna_names)),
        "local_sky_dir_label": Variable("local_sky_dir_label", SKY_DIR_LABELS.get(
            attrs.get("frame"), ["ra", "dec"])),
    }
    return Dataset(data_vars, coords, {"type": "pointing"})


WEATHER_COLUMNS = ("H2O", "IONOS_ELECTRON", "PRESSURE", "REL_HUMIDITY", "TEMPERATURE",
                   "DEW_POINT", "WIND_DIRECTION", "WIND_SPEED")
MSV4_UNITS = {"hPa": ("Pa", 100.0), "mbar": ("Pa", 100.0), "m-2": ("/m^2", 1.0)}


def _weather_key(weather):
    """The column naming a WEATHER row's station: NS_WX_STATION_ID when it is there and
    used (an id >= 0), else ANTENNA_ID."""
    present = [c for c in ("NS_WX_STATION_ID", "ANTENNA_ID") if weather.has(c)] or \
        ["ANTENNA_ID"]
    return next((c for c in present if np.max(weather.array(c)) >= 0), present[-1])


def weather_dataset(tables, partition, antenna_ids, antenna_xds, interpolate=False):
    """The partition's weather_xds (with ``interpolate`` on its times), or None (no
    WEATHER rows for it)."""
    weather = tables.subtable("WEATHER")
    if weather.nrow == 0:
        return None
    key = _weather_key(weather)
    span = partition_span(partition)
    ids = np.asarray(weather.array(key), np.int64)
    relevant = np.unique(holding_rows(weather, key, np.unique(ids[ids >= 0]), span)[1])
    if key == "NS_WX_STATION_ID":
        station_ids, present = relevant, None
        names = _station_names(tables, station_ids)
    else:
        present = np.isin(antenna_ids, relevant)
        station_ids = np.asarray(antenna_ids)[present]
        names = antenna_xds.station_name.values[present]
    if station_ids.size == 0:
        return None
    got = gridded_rows(weather, station_ids, span, key,
                       times=partition.time if interpolate else None)
    if got is None:
        return None
    time, grid = got
    first_row = int(grid[grid >= 0][0])
    time_dim = "time" if interpolate else "time_weather"
    dims = ("station_name", time_dim)
    data_vars = {}
    for column in WEATHER_COLUMNS:
        values = _gathered(weather, column, grid, first_row)
        if values is None or values.ndim != 2:
            continue
        attrs, _ = measure_attrs(weather.keywords(column), column)
        units, scale = MSV4_UNITS.get(attrs.get("units"), (attrs.get("units"), 1.0))
        if units is not None:
            attrs["units"] = units
        data_vars[column] = Variable(dims, values.T * scale if scale != 1.0 else values.T,
                                     attrs)
    if not data_vars:
        return None
    time_attrs, epoch = measure_attrs(weather.keywords("TIME"), "TIME")
    coords = {time_dim: Variable(time_dim, to_unix(time) if epoch else time,
                                 {**time_attrs, "type": time_dim}),
              "station_name": Variable("station_name", np.asarray(names))}
    position = _station_positions(weather, grid, station_ids) if present is None else \
        antenna_xds.ANTENNA_POSITION.values[present]
    if position is not None:
        data_vars["STATION_POSITION"] = Variable(("station_name", "cartesian_pos_label"),
                                                 position,
                                                 antenna_xds.ANTENNA_POSITION.attrs)
        coords["cartesian_pos_label"] = Variable("cartesian_pos_label", ["x", "y", "z"])
    return Dataset(data_vars, coords, {"type": "weather"})


def _station_names(tables, station_ids):
    """ASDM_STATION's names of the stations when it names them all, else Station_<id>."""
    stations = tables.subtable("ASDM_STATION")
    if stations.has("name"):
        names = np.asarray(stations.column("name"), str)
        if np.all((station_ids >= 0) & (station_ids < len(names))):
            return names[station_ids]
    return np.asarray([f"Station_{i}" for i in station_ids.tolist()])


def _station_positions(weather, grid, station_ids):
    """Each station's NS_WX_STATION_POSITION in its first WEATHER row (by key, then
    TIME), or None when the column is absent or undefined there."""
    if not weather.has("NS_WX_STATION_POSITION"):
        return None
    key = np.asarray(weather.array("NS_WX_STATION_ID"), np.int64)
    order = np.lexsort([np.asarray(weather.array("TIME")), key])
    cells = weather.column("NS_WX_STATION_POSITION")
    if not isinstance(cells, np.ndarray) and cells[int(order[0])] is None:
        return None
    firsts = order[np.searchsorted(key[order], station_ids, side="left")]
    return np.stack([np.asarray(cells[int(r)], np.float64) for r in firsts.tolist()])


# MSv4 name -> SYSCAL's column per receptor, and per channel and receptor
SYSCAL_COLUMNS = {"TCAL": ("TCAL", "TCAL_SPECTRUM"), "TRX": ("TRX", "TRX_SPECTRUM"),
                  "TSKY": ("TSKY", "TSKY_SPECTRUM"), "TSYS": ("TSYS", "TSYS_SPECTRUM"),
                  "TANT": ("TANT", "TANT_SPECTRUM"),
                  "TANT_SYS": ("TANT_TSYS", "TANT_TSYS_SPECTRUM")}


def system_calibration_dataset(tables, partition, antenna_ids, antenna_names,
                               antenna_xds, interpolate=False):
    """The partition's system_calibration_xds (the SYSCAL rows of its spectral window;
    with ``interpolate`` on its times), or None."""
    syscal = tables.subtable("SYSCAL")
    if syscal.nrow == 0:
        return None
    among = np.flatnonzero(np.asarray(syscal.array("SPECTRAL_WINDOW_ID")) ==
                           partition.spw_id)
    got = gridded_rows(syscal, np.asarray(antenna_ids), partition_span(partition),
                       among=among, times=partition.time if interpolate else None) \
        if among.size else None
    if got is None:
        return None
    time, grid = got
    first_row = int(grid[grid >= 0][0])
    nrec, nchan = antenna_xds.sizes["receptor_label"], None
    time_dim = "time" if interpolate else "time_system_cal"
    dims = ("antenna_name", time_dim)
    data_vars = {}
    for name, columns in SYSCAL_COLUMNS.items():
        made = [(c, v) for c in columns[::-1]
                if (v := _gathered(syscal, c, grid, first_row)) is not None]
        if not made:
            continue
        column, values = made[0]
        values = np.moveaxis(values, 1, 0)  # (antenna, time, ...)
        shape = values.shape[2:]
        if shape == (nrec,):
            var_dims = dims + ("receptor_label",)
        elif len(shape) == 2 and shape[1] == nrec and nchan in (None, shape[0]):
            nchan = shape[0]
            values = np.swapaxes(values, 2, 3)  # (chan, receptor) shown as (receptor, chan)
            var_dims = dims + ("receptor_label", "frequency_system_cal")
        else:
            warnings.warn(f"Ignoring SYSCAL::{column} with row shape {shape}, which is "
                          f"inconsistent with {nrec} receptors or {nchan} channels",
                          ColumnShapeImputationWarning, stacklevel=3)
            continue
        attrs, _ = measure_attrs(syscal.keywords(column), column)
        if "units" not in attrs:  # (temperatures are Kelvin; TANT_TSYS has no units)
            attrs.update({"type": "quantity", "units": "K"})
        data_vars[name] = Variable(var_dims, values, attrs)
    phase = _gathered(syscal, "PHASE_DIFF", grid, first_row)
    if phase is not None and phase.ndim == 2:
        data_vars["PHASE_DIFFERENCE"] = Variable(dims, phase.T, measure_attrs(
            syscal.keywords("PHASE_DIFF"), "PHASE_DIFF")[0])
    if not data_vars:
        return None
    time_attrs, epoch = measure_attrs(syscal.keywords("TIME"), "TIME")
    coords = {time_dim: Variable(time_dim, to_unix(time) if epoch else time,
                                 {**time_attrs, "type": "time"}),
              "antenna_name": Variable("antenna_name", np.asarray(antenna_names)),
              "station_name": antenna_xds.station_name.variable,
              "receptor_label": antenna_xds.receptor_label.variable,
              "polarization_type": antenna_xds.polarization_type.variable}
    if nchan is not None:
        coords["frequency_system_cal"] = Variable("frequency_system_cal", np.arange(nchan))
    return Dataset(data_vars, coords, {"type": "system_calibration"})


def phased_array_dataset(tables, antenna_ids, antenna_names, antenna_xds):
    """The partition's phased_array_xds (PHASED_ARRAY's rows of its antennas, in their
    order), or None without PHASED_ARRAY rows."""
    table = tables.subtable("PHASED_ARRAY")
    if table.nrow == 0:
        return None
    ids = np.asarray(table.array("ANTENNA_ID")).tolist()
    if not set(np.asarray(antenna_ids).tolist()) <= set(ids):
        raise InvalidMeasurementSet(
            f"PHASED_ARRAY table does not contain all antenna_ids for the partition. "
            f"antenna_ids in PHASED_ARRAY: {ids}, antenna_ids in partition: "
            f"{np.asarray(antenna_ids).tolist()}")
    where = {a: r for r, a in enumerate(ids)}  # (the last row of an antenna)
    rows = [where[a] for a in np.asarray(antenna_ids).tolist()]
    nrec = antenna_xds.sizes["receptor_label"]
    axes = np.stack([_cell(tables, table, "COORDINATE_AXES", r, (3, 3)) for r in rows])
    offsets = [_cell(tables, table, "ELEMENT_OFFSET", r, (3, None)) for r in rows]
    flags = [_cell(tables, table, "ELEMENT_FLAG", r, (nrec, None)) for r in rows]
    offset_attrs = {"coordinate_system": "topocentric", "origin": "ANTENNA_POSITION",
                    **measure_attrs(table.keywords("ELEMENT_OFFSET"), "ELEMENT_OFFSET")[0]}
    flag_attrs = measure_attrs(table.keywords("ELEMENT_FLAG"), "ELEMENT_FLAG")[0]
    offset = _rectangular(offsets, 3, np.nan)
    data_vars = {
        "PHASED_ARRAY_COORDINATE_AXES": Variable(
            ("antenna_name", "cartesian_pos_label_local", "cartesian_pos_label"), axes,
            {"units": "dimensionless", "type": "rotation_matrix"}),
        "PHASED_ARRAY_ELEMENT_OFFSET": Variable(
            ("antenna_name", "cartesian_pos_label_local", "element_id"), offset,
            offset_attrs),
        "PHASED_ARRAY_ELEMENT_FLAG": Variable(
            ("antenna_name", "receptor_label", "element_id"),
            _rectangular(flags, nrec, True).astype(bool), flag_attrs),
        "PHASED_ARRAY_ELEMENT_COUNT": Variable(
            "antenna_name", np.array([len(o[0]) for o in offsets], np.int32)),
    }
    coords = {"antenna_name": np.asarray(antenna_names),
              "receptor_label": antenna_xds.receptor_label,
              "polarization_type": antenna_xds.polarization_type,
              "cartesian_pos_label": ["x", "y", "z"],
              "cartesian_pos_label_local": ["p", "q", "r"],
              "element_id": np.arange(offset.shape[-1])}
    return Dataset(data_vars, coords, {"type": "phased_array"})


def _cell(tables, table, column, row, shape):
    """Cell ``row`` of ``column`` as an array of ``shape`` (None: any length; values in
    the order they are stored); InvalidMeasurementSet when it is undefined or cannot."""
    cell = table.column(column)[row] if table.has(column) else None
    size = None if cell is None else np.size(cell)
    known = int(np.prod([n for n in shape if n is not None]))
    if cell is None or size == 0 or size % known or (None not in shape and size != known):
        raise InvalidMeasurementSet(f"{tables.source}/{table.name}: row {row} has no "
                                    f"{column} of shape {shape}")
    return np.asarray(cell).reshape(-1).reshape([-1 if n is None else n for n in shape])


def _rectangular(cells, middle, fill):
    """Cells of (``middle``, elements) as one (cells, middle, most elements) array padded
    with ``fill``."""
    out = np.full((len(cells), middle, max(c.shape[1] for c in cells)), fill)
    for i, c in enumerate(cells):
        out[i, :, :c.shape[1]] = c
    return out
