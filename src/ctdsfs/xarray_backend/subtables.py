"""Subtable rows the partitions need, made up as xarray-ms makes them up when the MS lacks
them (with its warning), and the per-partition ``antenna_xds`` and
``field_and_source_xds`` datasets."""

import warnings
from datetime import datetime, timezone

import numpy as np
from xarray import Dataset, Variable

from .errors import (
    DuplicateAntennaNameWarning,
    HeterogeneousFeedWarning,
    ImputedMetadataWarning,
    InvalidMeasurementSet,
)
from .measures import MJD_TO_UNIX, measure_attrs

RELOCATABLE_ARRAYS = {"ALMA", "VLA", "NOEMA", "EVLA"}
PER_FEED_COLUMNS = ["RECEPTOR_ANGLE", "POLARIZATION_TYPE", "FOCUS_LENGTH"]
MAX_MADE_UP = 1 << 20  # rows of a subtable made up for the ids the MS uses
RELEASE_DATE_MADE_UP = datetime(1978, 10, 9, 8, tzinfo=timezone.utc).timestamp()


class MadeTable:
    """Rows made up for a subtable, read as a :class:`~.tables.Subtable` is."""

    def __init__(self, name, nrow, columns, keywords=None):
        self.name, self.nrow, self._columns = name, nrow, columns
        self._keywords = keywords or {}

    def has(self, column):
        return column in self._columns

    def keywords(self, column):
        return self._keywords.get(column, {})

    def column(self, name):
        return self._columns[name]

    def array(self, name, rows=None):
        values = np.asarray(self._columns[name])
        return values if rows is None else values[np.asarray(rows)]


def _missing_id(table, ids, id_name):
    """The highest id when ``table`` lacks its row (a warning then), else None; an id below
    -1 (MSv2's "none", as STATE_ID without STATE rows, taken as xarray-ms takes it), or
    one that would make up more than MAX_MADE_UP rows, is refused."""
    ids = np.concatenate([np.asarray(ids).ravel(), [0]])
    lowest, highest = int(np.min(ids)), int(np.max(ids))
    if lowest < -1:
        raise InvalidMeasurementSet(f"{id_name} {lowest} names no row of the {table.name} "
                                    "table")
    if highest < table.nrow:
        return None
    if highest >= MAX_MADE_UP:
        raise InvalidMeasurementSet(f"{id_name} {highest} names no row of the {table.name} "
                                    f"table of length {table.nrow}, and is too large for its "
                                    "rows to be made up")
    warnings.warn(f"No row exists in the {table.name} table of length {table.nrow} for "
                  f"{id_name}={highest}. Artificial metadata will be substituted.",
                  ImputedMetadataWarning, stacklevel=3)
    return highest


def checked_row(table, row, id_name):
    """``row`` when ``table`` has it, else InvalidMeasurementSet (an id from another table
    is untrusted: a negative one would index from the end)."""
    if not 0 <= row < table.nrow:
        raise InvalidMeasurementSet(f"{id_name} {row} does not exist in {table.name}, of "
                                    f"{table.nrow} rows")
    return row


def _unknown(n, prefix="UNKNOWN-"):
    return [f"{prefix}{i}" for i in range(n)]


def imputed_field(field, field_ids):
    highest = _missing_id(field, field_ids, "FIELD_ID")
    if highest is None:
        return field
    n = highest + 1
    direction = {"QuantumUnits": {"values": ["rad", "rad"]},
                 "MEASINFO": {"type": "direction", "Ref": "J2000"}}
    return MadeTable("FIELD", n, {"NAME": _unknown(n), "NUM_POLY": np.zeros(n, np.int32),
                                  "PHASE_DIR": np.zeros((n, 1, 2)),
                                  "SOURCE_ID": np.arange(n, dtype=np.int32)},
                     {"PHASE_DIR": direction})


def imputed_state(state, state_ids):
    highest = _missing_id(state, state_ids, "STATE_ID")
    if highest is None:
        return state
    n = highest + 1
    return MadeTable("STATE", n, {"OBS_MODE": ["UNSPECIFIED"] * n,
                                  "SUB_SCAN": np.zeros(n, np.int32)})


def imputed_observation(obs, obs_ids):
    highest = _missing_id(obs, obs_ids, "OBSERVATION_ID")
    if highest is None:
        return obs
    n = highest + 1
    return MadeTable("OBSERVATION", n, {
        "OBSERVER": ["unknown"] * n, "PROJECT": ["unknown"] * n,
        "TELESCOPE_NAME": ["unknown"] * n,
        "RELEASE_DATE": np.full(n, RELEASE_DATE_MADE_UP + MJD_TO_UNIX)},
        {"RELEASE_DATE": {"QuantumUnits": {"values": ["s"]},
                          "MEASINFO": {"type": "epoch", "Ref": "UTC"}}})


def imputed_processor(proc, proc_ids):
    highest = _missing_id(proc, proc_ids, "PROCESSOR_ID")
    if highest is None:
        return proc
    n = highest + 1
    return MadeTable("PROCESSOR", n, {"TYPE": ["unknown"] * n, "SUB_TYPE": ["unknown"] * n})


def imputed_source(source, source_ids):
    highest = _missing_id(source, source_ids, "SOURCE_ID")
    if highest is None:
        return source
    n = highest + 1
    return MadeTable("SOURCE", n, {"NAME": _unknown(n)})


def coded(table, column, dims, data, rows=None, attrs=None):
    """A Variable of ``data`` with the measures attrs of ``table``'s ``column``."""
    extra, _ = measure_attrs(table.keywords(column), column, table, rows)
    return Variable(dims, data, {**(attrs or {}), **extra})


def unique_antenna_names(names):
    """ANTENNA names, each repeated one suffixed ``-1``, ``-2``, ... (with a warning)."""
    names = np.asarray(names, dtype=str)
    unique, counts = np.unique(names, return_counts=True)
    repeated = set(unique[counts > 1].tolist())
    if not repeated:
        return names
    warnings.warn(f"Duplicate antenna names detected in the ANTENNA table: "
                  f"{sorted(repeated)}. A numeric suffix will be appended to make names "
                  "unique.", DuplicateAntennaNameWarning, stacklevel=3)
    result, seen = names.tolist(), {}
    for i, name in enumerate(result):
        if name in repeated:
            seen[name] = seen.get(name, 0) + 1
            result[i] = f"{name}-{seen[name]}"
    return np.array(result, dtype=str)


def select_antennas(antenna, feed, partition):
    """(FEED row per antenna, antenna ids, names) of the partition, in FEED order."""
    feed_ids, spws = feed.array("FEED_ID"), feed.array("SPECTRAL_WINDOW_ID")
    antenna_ids = feed.array("ANTENNA_ID")
    mask = ((spws == -1) | (spws == partition.spw_id)) & \
        np.isin(feed_ids, partition.feed_ids) & np.isin(antenna_ids, partition.antenna_ids)
    own_spw = antenna_ids[mask & (spws == partition.spw_id)]
    mask &= ~((spws == -1) & np.isin(antenna_ids, own_spw))
    rows = np.flatnonzero(mask)
    _, first, inverse = np.unique(antenna_ids[rows], return_index=True, return_inverse=True)
    firsts = rows[first[inverse]]
    differing = [c for c in PER_FEED_COLUMNS if feed.has(c) and not _same_cells(
        feed.column(c), rows, firsts)]
    if differing:
        warnings.warn(f"FEED columns {differing} differ between the FEED rows of an antenna "
                      f"for SPECTRAL_WINDOW_ID={partition.spw_id} and "
                      f"feeds={partition.feed_ids}. antenna_xds uses the first FEED row of "
                      "each antenna.", HeterogeneousFeedWarning, stacklevel=3)
    rows = rows[np.sort(first)].astype(np.int32)
    ids = antenna_ids[rows].astype(np.int32)
    names = unique_antenna_names(antenna.column("NAME"))[ids]
    return rows, ids, names


def _same_cells(values, rows, firsts):
    for a, b in zip(rows, firsts):
        x, y = np.asarray(values[a]), np.asarray(values[b])
        if x.shape != y.shape or not np.array_equal(
                x, y, equal_nan=np.issubdtype(x.dtype, np.inexact)):
            return False
    return True


def antenna_dataset(tables, partition, selection):
    rows, ids, names = selection
    antenna, feed = tables.subtable("ANTENNA"), tables.subtable("FEED")
    obs = imputed_observation(tables.subtable("OBSERVATION"), [partition.obs_id])
    telescope = str(obs.column("TELESCOPE_NAME")[0])
    if len(ids) == 0:
        raise InvalidMeasurementSet(f"No antennas were found in FEED matching feed_id = "
                                    f"{partition.feed_ids} and spw_id = {partition.spw_id}")
    receptors = np.unique(feed.array("NUM_RECEPTORS", rows))
    if len(receptors) != 1:
        raise NotImplementedError(f"Measurement Set partitions with multiple "
                                  f"FEED::NUM_RECEPTOR values {receptors.tolist()}")
    nrec = int(receptors[0])
    diameter = antenna.array("DISH_DIAMETER", ids)
    data_vars = {
        "ANTENNA_POSITION": coded(antenna, "POSITION", ("antenna_name", "cartesian_pos_label"),
                                  antenna.array("POSITION", ids).reshape(-1, 3), ids,
                                  {"coordinate_system": "geocentric",
                                   "origin_object_name": "earth"}),
        "ANTENNA_DISH_DIAMETER": coded(antenna, "DISH_DIAMETER", "antenna_name", diameter, ids),
        "ANTENNA_EFFECTIVE_DISH_DIAMETER": coded(antenna, "DISH_DIAMETER", "antenna_name",
                                                 diameter, ids),
        "ANTENNA_RECEPTOR_ANGLE": coded(feed, "RECEPTOR_ANGLE", ("antenna_name",
                                                                 "receptor_label"),
                                        feed.array("RECEPTOR_ANGLE", rows).reshape(-1, nrec),
                                        rows)}
    if feed.has("FOCUS_LENGTH"):
        data_vars["ANTENNA_FOCUS_LENGTH"] = coded(feed, "FOCUS_LENGTH", "antenna_name",
                                                  feed.array("FOCUS_LENGTH", rows), rows)
    pol_type = feed.array("POLARIZATION_TYPE", rows).astype(str).reshape(-1, nrec)
    return Dataset(data_vars=data_vars, coords={
        "antenna_name": Variable("antenna_name", names),
        "mount": Variable("antenna_name", antenna.array("MOUNT", ids).astype(str)),
        "telescope_name": Variable("antenna_name", np.asarray([telescope] * len(names), str)),
        "station_name": Variable("antenna_name", antenna.array("STATION", ids).astype(str)),
        "cartesian_pos_label": Variable("cartesian_pos_label", ["x", "y", "z"]),
        "polarization_type": Variable(("antenna_name", "receptor_label"), pol_type),
        "receptor_label": Variable("receptor_label", [f"pol_{i}" for i in range(nrec)])},
        attrs={"type": "antenna", "overall_telescope_name": telescope,
               "relocatable_antennas": telescope in RELOCATABLE_ARRAYS})


def field_and_source_dataset(tables, partition):
    field_ids = np.unique(partition.field_ids)
    field = imputed_field(tables.subtable("FIELD"), field_ids)
    source_ids = field.array("SOURCE_ID", field_ids)
    source = imputed_source(tables.subtable("SOURCE"), source_ids)
    num_poly = np.unique(field.array("NUM_POLY", field_ids))
    if num_poly.tolist() != [0]:
        raise NotImplementedError(f"FIELD subtable NUM_POLY {num_poly} != 0 are not "
                                  f"currently supported for FIELD_IDs {partition.field_ids}")
    data_vars = {}
    if field.has("PHASE_DIR"):
        phase = field.array("PHASE_DIR", field_ids).reshape(len(field_ids), 2)
        data_vars["FIELD_PHASE_CENTER_DIRECTION"] = coded(
            field, "PHASE_DIR", ("field_name", "sky_dir_label"), phase, field_ids)
    names = source.column("NAME")
    source_names = ["UNKNOWN" if s == -1 else names[s] for s in source_ids.tolist()]
    return Dataset(data_vars=data_vars, coords={
        "field_name": Variable("field_name", np.asarray(
            [field.column("NAME")[f] for f in field_ids.tolist()], str)),
        "sky_dir_label": Variable("sky_dir_label", ["ra", "dec"]),
        "source_name": Variable("field_name", np.asarray(source_names, str))},
        attrs={"type": "field_and_source"})
