"""The partitions of an MS and the (time, baseline) grid of each, by xarray-ms's rules.

Rows are split by OBSERVATION_ID, PROCESSOR_ID, DATA_DESC_ID and STATE's OBS_MODE (STATE
rows with one intent string are one mode), and by the ``partition_schema`` columns
asked for; partitions come in the order of those values. In a partition the times are
its unique TIMEs, the baselines ``triu_indices`` over the antennas FEED lists for its
spectral window and feeds (autocorrelations only with ``auto_corrs``), a row with
ANTENNA1 > ANTENNA2 fills the cell of the swapped pair, and ``row_map[t, b]`` is the row
of that cell (-1: none).
"""

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..formats.casacore.base import process_memory
from .errors import InvalidMeasurementSet, InvalidPartitionKey, PartitioningError
from .subtables import checked_row, imputed_field, imputed_state

MAIN_PARTITION_COLUMNS = ["OBSERVATION_ID", "PROCESSOR_ID", "DATA_DESC_ID"]
DEFAULT_PARTITION_SCHEMA = MAIN_PARTITION_COLUMNS + ["OBS_MODE"]
GRID_CELL_BYTES = 16  # a (time, baseline) cell of the row map and the intervals
OPTIONAL_MAIN = ["DATA_DESC_ID", "OBSERVATION_ID", "PROCESSOR_ID", "FIELD_ID",
                 "SCAN_NUMBER", "STATE_ID"]
SHORT_NAMES = {"D": "DATA_DESC_ID", "F": "FIELD_ID", "O": "OBSERVATION_ID",
               "P": "PROCESSOR_ID", "S": "SOURCE_ID", "SI": "STATE_ID", "SN": "SCAN_NUMBER",
               "OM": "OBS_MODE", "SSN": "SUB_SCAN_NUMBER"}
INDEX_COLUMNS = ["DATA_DESC_ID", "OBSERVATION_ID", "PROCESSOR_ID", "FIELD_ID",
                 "SCAN_NUMBER", "STATE_ID", "TIME", "ANTENNA1", "ANTENNA2", "FEED1",
                 "FEED2", "INTERVAL"]


@dataclass
class Partition:
    time: np.ndarray  # unique TIMEs (MJD seconds)
    interval: np.ndarray  # unique intervals, the last time step left out
    obs_id: int
    proc_id: int
    spw_id: int
    pol_id: int
    antenna_ids: np.ndarray
    feed_ids: np.ndarray
    field_ids: np.ndarray  # per time
    scan_numbers: np.ndarray  # per time
    obs_mode: str
    row_map: np.ndarray  # (time, baseline) -> row, -1 where none

    @property
    def auto_corrs(self):
        na, nbl = len(self.antenna_ids), self.row_map.shape[1]
        return na * (na + 1) // 2 == nbl

    @property
    def antenna_pairs(self):
        a1, a2 = np.triu_indices(len(self.antenna_ids), 0 if self.auto_corrs else 1)
        ids = np.asarray(self.antenna_ids, np.int32)
        return ids[a1], ids[a2]


def partition_columns(schema):
    """(main-table columns, STATE/FIELD columns) the partitions are split by."""
    asked = set(schema or DEFAULT_PARTITION_SCHEMA)
    main = MAIN_PARTITION_COLUMNS + [c for c in OPTIONAL_MAIN
                                     if c in asked and c not in MAIN_PARTITION_COLUMNS]
    derived = ["OBS_MODE"] + [c for c in ("SOURCE_ID", "SUB_SCAN_NUMBER") if c in asked]
    return main, derived


def _obs_mode_ids(state, state_id):
    """Per row an index into the unique OBS_MODE strings (in STATE order), and those."""
    modes = OrderedDict()
    obs_mode = state.column("OBS_MODE")
    for sid, mode in enumerate(obs_mode):
        modes.setdefault(mode, []).append(sid)
    lookup = np.empty(len(obs_mode), np.int32)
    for index, sids in enumerate(modes.values()):
        lookup[sids] = index
    return lookup[state_id], list(modes)


def _time_values(column, key, values, ntime, time_ids):
    if column in key:
        return np.full(ntime, key[column])
    out = np.empty(ntime, values.dtype)
    out[time_ids] = values
    return out


def _feed_antennas(feed, spw_id, feed_ids):
    if feed.nrow == 0:
        return np.zeros(0, np.int32)
    spws, feeds = feed.array("SPECTRAL_WINDOW_ID"), feed.array("FEED_ID")
    mask = ((spws == -1) | (spws == spw_id)) & np.isin(feeds, feed_ids)
    return np.unique(feed.array("ANTENNA_ID")[mask])


def baseline_index(a1, a2, na, auto_corrs):
    """The baseline index of antenna positions ``a1 <= a2`` (``a1 < a2`` without
    autocorrelations) among ``na``, in ``triu_indices``' order: the pairs of the rows
    before ``a1``'s, then ``a2``'s place in its row (no table of ``na * na`` entries: FEED,
    which gives ``na``, may list antennas the rows never use)."""
    skip = 0 if auto_corrs else 1
    a1, a2 = np.asarray(a1, np.int64), np.asarray(a2, np.int64)
    return a1 * (na - skip) - a1 * (a1 - 1) // 2 + a2 - a1 - skip


class Structure:
    """The partitions of one MS: ``keys()`` in order, ``[key]`` a :class:`Partition`."""

    def __init__(self, tables, schema, auto_corrs):
        self.main_columns, self.derived_columns = partition_columns(schema)
        main = tables.main
        index = {c: np.asarray(main.read_column(c)) for c in INDEX_COLUMNS}
        nrow = len(index["TIME"])
        field = imputed_field(tables.subtable("FIELD"), index["FIELD_ID"])
        state = imputed_state(tables.subtable("STATE"), index["STATE_ID"])
        index["SOURCE_ID"] = field.array("SOURCE_ID")[index["FIELD_ID"]] if nrow else \
            np.zeros(0, np.int32)
        index["SUB_SCAN_NUMBER"] = state.array("SUB_SCAN")[index["STATE_ID"]] if nrow else \
            np.zeros(0, np.int32)
        index["OBS_MODE_ID"], modes = _obs_mode_ids(state, index["STATE_ID"])
        split = self.main_columns + self.derived_columns[1:] + ["OBS_MODE_ID"]
        # (the row number last: the sort is total, as xarray-ms's)
        index["ROW"] = np.arange(nrow, dtype=np.int64)
        keys = split + ["TIME", "ANTENNA1", "ANTENNA2", "FEED1", "FEED2", "INTERVAL", "ROW"]
        sort = np.lexsort([index[c] for c in reversed(keys)])
        ordered = {c: v[sort] for c, v in index.items()}
        edges = np.flatnonzero(np.logical_or.reduce(
            [np.diff(ordered[c]) != 0 for c in split])) + 1 if nrow else np.zeros(0, int)
        bounds = np.concatenate([[0], edges, [nrow]]) if nrow else np.zeros(1, int)
        ddesc = tables.subtable("DATA_DESCRIPTION")
        feed = tables.subtable("FEED")
        self._described = {name: tables.subtable(name) for name in
                           ("SPECTRAL_WINDOW", "POLARIZATION", "ANTENNA")}
        self._partitions = {}
        for start, stop in zip(bounds[:-1], bounds[1:]):
            rows = {c: v[start:stop] for c, v in ordered.items()}
            key = {c: rows[c][0].item() for c in split}
            key["OBS_MODE"] = modes[key.pop("OBS_MODE_ID")]
            part_key = tuple(sorted(key.items()))
            self._partitions[part_key] = self._partition(part_key, key, rows, ddesc, feed,
                                                         auto_corrs, main.label)

    def _partition(self, part_key, key, rows, ddesc, feed, auto_corrs, label):
        ddid = int(key["DATA_DESC_ID"])
        if not 0 <= ddid < ddesc.nrow:
            raise InvalidMeasurementSet(f"DATA_DESC_ID {ddid} does not exist in "
                                        f"{label}::DATA_DESCRIPTION")
        spw_id = checked_row(self._described["SPECTRAL_WINDOW"],
                             int(ddesc.array("SPECTRAL_WINDOW_ID")[ddid]), "SPECTRAL_WINDOW_ID")
        pol_id = checked_row(self._described["POLARIZATION"],
                             int(ddesc.array("POLARIZATION_ID")[ddid]), "POLARIZATION_ID")
        utime, time_ids = np.unique(rows["TIME"], return_inverse=True)
        ntime = utime.size
        field_ids = _time_values("FIELD_ID", key, rows["FIELD_ID"], ntime, time_ids)
        scans = _time_values("SCAN_NUMBER", key, rows["SCAN_NUMBER"], ntime, time_ids)
        a1, a2 = rows["ANTENNA1"].copy(), rows["ANTENNA2"].copy()
        feeds = np.union1d(rows["FEED1"], rows["FEED2"])
        antennas = _feed_antennas(feed, spw_id, feeds)
        present = np.union1d(a1, a2)
        if not np.all(np.isin(present, antennas)):
            raise InvalidMeasurementSet(
                f"Unique ANTENNA1 and ANTENNA2 values {present} are not a subset of "
                f"FEED::ANTENNA_ID {antennas} for SPECTRAL_WINDOW_ID={spw_id} and "
                f"feeds={feeds}")
        for antenna in antennas[:1].tolist() + antennas[-1:].tolist():  # (sorted)
            checked_row(self._described["ANTENNA"], antenna, "FEED::ANTENNA_ID")
        na = len(antennas)
        nbl = na * (na + (1 if auto_corrs else -1)) // 2
        row, interval = rows["ROW"], rows["INTERVAL"]
        if not auto_corrs:
            cross = a1 != a2
            a1, a2, row, interval, time_ids = (a1[cross], a2[cross], row[cross],
                                               interval[cross], time_ids[cross])
        swap = a1 > a2
        a1[swap], a2[swap] = a2[swap], a1[swap]
        a1, a2 = np.searchsorted(antennas, a1), np.searchsorted(antennas, a2)
        if ntime * nbl * GRID_CELL_BYTES > process_memory():
            raise PartitioningError(
                f"The (time, baseline) grid of partition {part_key}, {ntime} times by {nbl} "
                f"baselines of the {na} antennas FEED lists, is more than this process can "
                "hold")
        cell = time_ids * nbl + baseline_index(a1, a2, na, auto_corrs)
        if cell.size and np.bincount(cell).max() > 1:
            raise PartitioningError(
                f"Multiple occurences of a (TIME, ANTENNA1, ANTENNA2) tuple are present in "
                f"partition {part_key}. It is not possible to establish a unique (time, "
                f"baseline) grid for this partition: partition more finely by adding "
                f"columns to the partition_schema")
        row_map = np.full(ntime * nbl, -1, np.int64)
        row_map[cell] = row
        intervals = np.full(ntime * nbl, -1.0)
        intervals[cell] = interval
        intervals = intervals.reshape(ntime, nbl)
        if ntime > 1:
            intervals = intervals[:-1]
        uinterval = np.unique(intervals)
        return Partition(
            time=utime, interval=uinterval[uinterval >= 0], obs_id=int(key["OBSERVATION_ID"]),
            proc_id=int(key["PROCESSOR_ID"]), spw_id=spw_id, pol_id=pol_id,
            antenna_ids=antennas, feed_ids=feeds, field_ids=field_ids, scan_numbers=scans,
            obs_mode=str(key["OBS_MODE"]), row_map=row_map.reshape(ntime, nbl))

    def keys(self):
        return list(self._partitions)

    def __getitem__(self, key):
        return self._partitions[key]

    def __len__(self):
        return len(self._partitions)

    def resolve_key(self, key):
        """The partition keys ``key`` (a tuple of pairs, ``"D=0,F=1"``, or None: all)
        matches."""
        if not key:
            return self.keys()
        if isinstance(key, str):
            key = parse_key(key)
        valid = set(self.main_columns) | set(self.derived_columns)
        wanted = set()
        for column, value in key:
            column = SHORT_NAMES.get(column.upper(), column.upper())
            if column not in valid:
                raise InvalidPartitionKey(f"{column} is not valid a valid partition column "
                                          f"{self.main_columns}")
            if not isinstance(value, (str, int, np.integer)):
                raise InvalidPartitionKey(f"{value} is an invalid partition key value. "
                                          "Should be an integer or (rarely) a string")
            wanted.add((column, value))
        return [k for k in self._partitions if wanted <= set(k)]


def parse_key(text):
    """``"DATA_DESC_ID=0, F=1"`` as a tuple of (column, value) pairs."""
    pairs = []
    for part in (p.strip() for p in text.split(",")):
        try:
            column, value = part.split("=")
        except ValueError:
            raise InvalidPartitionKey(f"Invalid partition key {text!r}") from None
        try:
            pairs.append((column, int(value)))
        except ValueError:
            pairs.append((column, value))
    return tuple(sorted(pairs))
