"""The variables and attrs of one partition's correlated dataset (xarray-ms's layout)."""

import warnings
from datetime import datetime, timezone

import numpy as np
from xarray import Variable
from xarray.core.indexing import LazilyIndexedArray

from ..formats.casacore.base import TP_BOOL, TP_UCHAR
from ..formats.casacore.columns import VarShapeColumn
from .arrays import BroadcastArray, MainColumnArray
from .errors import (
    ColumnShapeImputationWarning,
    FrameConversionWarning,
    InvalidMeasurementSet,
    IrregularBaselineGridWarning,
    IrregularChannelGridWarning,
    IrregularTimeGridWarning,
)
from .measures import measure_attrs, to_unix
from .subtables import (
    imputed_field,
    imputed_observation,
    imputed_processor,
    unique_antenna_names,
)
from .tables import row_spans

CELL = ("frequency", "polarization")
# MSv4 name -> (MSv2 column, its axes after (time, baseline_id), fill, the column's own
# axes when it is spread over CELL)
SCHEMAS = {
    "TIME": ("TIME", (), np.nan, None),
    "INTEGRATION_TIME": ("INTERVAL", (), np.nan, None),
    "TIME_CENTROID": ("TIME_CENTROID", (), np.nan, None),
    "EFFECTIVE_INTEGRATION_TIME": ("EXPOSURE", (), np.nan, None),
    "UVW": ("UVW", ("uvw_label",), np.nan, None),
    "FLAG_ROW": ("FLAG_ROW", CELL, 1, ()),
    "FLAG": ("FLAG", CELL, 1, None),
    "VISIBILITY": ("DATA", CELL, complex(np.nan, np.nan), None),
    "WEIGHT_ROW": ("WEIGHT", CELL, np.nan, ("polarization",)),
    "WEIGHT": ("WEIGHT_SPECTRUM", CELL, np.nan, None),
    "SIGMA_ROW": ("SIGMA", CELL, np.nan, ("polarization",)),
    "SIGMA_SPECTRUM": ("SIGMA_SPECTRUM", CELL, np.nan, None),
}
STANDARD = ("TIME_CENTROID", "EFFECTIVE_INTEGRATION_TIME", "UVW", "VISIBILITY")
# The MSv2 main-table columns that are not extra variables (xarray-ms keeps CORRECTED_DATA,
# CORRECTED_WEIGHT_SPECTRUM, FLOAT_DATA and MODEL_DATA, and columns outside the standard)
MS_COLUMNS = {"ANTENNA1", "ANTENNA2", "ANTENNA3", "ARRAY_ID", "BASELINE_REF", "DATA",
              "DATA_DESC_ID", "EXPOSURE", "FEED1", "FEED2", "FEED3", "FIELD_ID", "FLAG",
              "FLAG_CATEGORY", "FLAG_ROW", "IMAGING_WEIGHT", "INTERVAL", "LAG_DATA",
              "OBSERVATION_ID", "PHASE_ID", "PROCESSOR_ID", "PULSAR_BIN", "PULSAR_GATE_ID",
              "SCAN_NUMBER", "SIGMA", "SIGMA_SPECTRUM", "STATE_ID", "TIME", "TIME_CENTROID",
              "TIME_EXTRA_PREC", "UVW", "UVW2", "VIDEO_POINT", "WEIGHT", "WEIGHT_SPECTRUM"}
STOKES = ["Undefined", "I", "Q", "U", "V", "RR", "RL", "LR", "LL", "XX", "XY", "YX", "YY",
          "RX", "RY", "LX", "LY", "XR", "XL", "YR", "YL", "PP", "PQ", "QP", "QQ",
          "RCircular", "LCircular", "Linear", "Ptotal", "Plinear", "PFtotal", "PFlinear",
          "Pangle"]


def _stokes(code):
    """The name of Stokes type ``code`` (a POLARIZATION table's CORR_TYPE)."""
    if not 0 <= code < len(STOKES):
        raise InvalidMeasurementSet(f"CORR_TYPE {code} is not a Stokes type")
    return STOKES[code]


PARTITIONING_LINK = "https://xarray-ms.readthedocs.io/en/latest/partitioning.html"


def presented_dtype(col):
    """The dtype xarray-ms gives a column: Bool and uChar as uint8."""
    return np.dtype(np.uint8) if col.data_type in (TP_BOOL, TP_UCHAR) else col.dtype


class CorrelatedVariables:
    """The variables of partition ``key`` of the MS ``tables``, by xarray-ms's rules."""

    def __init__(self, tables, structure, key, preferred_chunks):
        self.tables, self.key = tables, key
        self.partition = structure[key]
        self.main = tables.main
        self.preferred_chunks = preferred_chunks or {}

    def _array(self, name, sizes):
        column, axes, fill, low_axes = SCHEMAS[name]
        col = self.main.columns[column]
        dims = ("time", "baseline_id") + axes
        dtype = presented_dtype(col)
        own = axes if low_axes is None else low_axes
        epoch = measure_attrs(col.keywords, column)[1]
        array = MainColumnArray(self.tables, column, self.partition.row_map,
                                tuple(sizes[d] for d in own), dtype, dtype.type(fill), epoch)
        if low_axes is not None:
            where = [True, True] + [d in low_axes for d in axes]
            array = BroadcastArray(array, where, tuple(sizes[d] for d in dims))
        return dims, array

    def variable(self, name, sizes):
        column = SCHEMAS[name][0]
        dims, array = self._array(name, sizes)
        attrs = {"type": "quantity", "units": "Jy"} if name == "VISIBILITY" else \
            measure_attrs(self.main.columns[column].keywords, column)[0]
        encoding = {"preferred_chunks": self.preferred_chunks} if self.preferred_chunks \
            else {}
        return Variable(dims, LazilyIndexedArray(array), attrs, encoding, fastpath=True)

    def variables(self):
        p, columns = self.partition, self.main.columns
        antenna = self.tables.subtable("ANTENNA")
        names = unique_antenna_names(antenna.column("NAME"))
        ant1, ant2 = p.antenna_pairs
        spw = self.tables.subtable("SPECTRAL_WINDOW")
        pol = self.tables.subtable("POLARIZATION")
        chan_freq = np.asarray(spw.column("CHAN_FREQ")[p.spw_id], np.float64)
        chan_width = np.asarray(spw.column("CHAN_WIDTH")[p.spw_id], np.float64)
        corr_type = [_stokes(int(c)) for c in pol.column("CORR_TYPE")[p.pol_id]]
        sizes = {"time": len(p.time), "baseline_id": p.row_map.shape[1],
                 "frequency": len(chan_freq), "polarization": len(corr_type), "uvw_label": 3}
        missing = int(np.count_nonzero(p.row_map == -1))
        if missing:
            warnings.warn(
                f"{missing} / {p.row_map.size} ({100.0 * missing / p.row_map.size:.1f}%) "
                f"rows missing from the full (time, baseline_id) grid in partition "
                f"{self.key}. Dataset variables will be padded with nans in the case of "
                f"data variables and flags will be set for these cases. See "
                f"{PARTITIONING_LINK}", IrregularBaselineGridWarning, stacklevel=2)
        data_vars = [(v, self.variable(v, sizes)) for v in STANDARD]
        done = {SCHEMAS[v][0] for v in STANDARD}
        for present, name, fallback in (("FLAG", "FLAG", "FLAG_ROW"),
                                        ("WEIGHT_SPECTRUM", "WEIGHT", "WEIGHT_ROW"),
                                        ("SIGMA_SPECTRUM", "SIGMA_SPECTRUM", "SIGMA_ROW")):
            if present in columns:
                data_vars.append((name, self.variable(name, sizes)))
                done.add(present)
            elif name != "SIGMA_SPECTRUM" or "SIGMA" in columns:
                data_vars.append((name, self.variable(fallback, sizes)))
                done.add(SCHEMAS[fallback][0])
        data_vars += self._extra_variables(done, sizes)
        field = imputed_field(self.tables.subtable("FIELD"), p.field_ids)
        field_names = np.asarray([field.column("NAME")[f] for f in p.field_ids.tolist()], str)
        encoding = {"preferred_chunks": self.preferred_chunks} if self.preferred_chunks \
            else None
        coords = [
            ("baseline_id", ("baseline_id", np.arange(len(ant1)),
                             {"coordinates": "baseline_id"})),
            ("baseline_antenna1_name", ("baseline_id", names[ant1],
                                        {"coordinates": "baseline_antenna1_name"})),
            ("baseline_antenna2_name", ("baseline_id", names[ant2],
                                        {"coordinates": "baseline_antenna2_name"})),
            ("polarization", ("polarization", corr_type, None)),
            ("uvw_label", ("uvw_label", ["u", "v", "w"], None)),
            ("field_name", ("time", field_names, {"coordinates": "field_name"})),
            ("scan_name", ("time", p.scan_numbers.astype(str),
                           {"coordinates": "scan_name", "scan_intents":
                            [s.strip() for s in p.obs_mode.split(",")]})),
        ]
        coords = [(n, Variable(d, v, a, encoding)) for n, (d, v, a) in coords]
        data_vars += self._time(coords, sizes, missing)
        data_vars += self._frequency(coords, spw, chan_freq, chan_width)
        return dict(sorted(data_vars + coords))

    def _time(self, coords, sizes, missing):
        p = self.partition
        attrs = {"integration_time": {"attrs": {"type": "quantity", "units": "s"},
                                      "data": 0.0}}
        extra = []
        step = grid_step(p.interval)
        if step is not None:
            attrs["integration_time"]["data"] = step
        else:
            warnings.warn(
                f"Missing/Multiple intervals {p.interval} found in partition {self.key}. "
                f"MSv4 cannot strictly represent this case so "
                f"time.attrs['integration_time'] will be set to 'nan' and (time, "
                f"baseline_id) shaped TIME and INTEGRATION_TIME columns will be added. "
                f"{'They contain nans in missing rows. ' if missing else ''}"
                f"See {PARTITIONING_LINK}", IrregularTimeGridWarning, stacklevel=3)
            attrs["integration_time"]["data"] = np.nan
            extra = [("TIME", self.variable("TIME", sizes)),
                     ("INTEGRATION_TIME", self.variable("INTEGRATION_TIME", sizes))]
        time_attrs, epoch = measure_attrs(self.main.columns["TIME"].keywords, "TIME")
        coords.append(("time", Variable("time", to_unix(p.time) if epoch else p.time,
                                        {**attrs, **time_attrs})))
        return extra

    def _frequency(self, coords, spw, chan_freq, chan_width):
        p, rows = self.partition, [self.partition.spw_id]
        freq_attrs, _ = measure_attrs(spw.keywords("CHAN_FREQ"), "CHAN_FREQ", spw, rows)
        ref_attrs, _ = measure_attrs(spw.keywords("REF_FREQUENCY"), "REF_FREQUENCY", spw, rows)
        name = spw.column("NAME")[p.spw_id] if spw.has("NAME") else ""
        group = spw.column("FREQ_GROUP_NAME")[p.spw_id] if spw.has("FREQ_GROUP_NAME") else ""
        freq_attrs.update({
            "spectral_window_name": name or "<Unknown>",
            "spectral_window_intents": ["<Unknown>"],
            "reference_frequency": {"attrs": ref_attrs, "data": float(
                spw.array("REF_FREQUENCY")[p.spw_id])},
            "channel_width": {"attrs": {"type": "quantity", "units": "Hz"}},
            "effective_channel_width": "EFFECTIVE_CHANNEL_WIDTH"})
        if group:
            freq_attrs["frequency_group_name"] = group
        widths = np.unique(chan_width[:-1] if len(chan_width) > 1 else chan_width)
        extra = []
        step = grid_step(widths)
        if step is not None:
            freq_attrs["channel_width"]["data"] = step
        else:
            warnings.warn(
                f"Multiple distinct channel widths {widths} found in partition {self.key}. "
                f"MSv4 cannot strictly represent this case and so "
                f"frequency.attrs['channel_width'] will be set to 'nan' and a "
                f"(frequency,) shaped CHANNEL_WIDTH column will be added. See "
                f"{PARTITIONING_LINK}", IrregularChannelGridWarning, stacklevel=3)
            freq_attrs["channel_width"]["data"] = np.nan
            width_attrs, _ = measure_attrs(spw.keywords("CHAN_WIDTH"), "CHAN_WIDTH", spw, rows)
            extra.append(("CHANNEL_WIDTH", Variable("frequency", chan_width, width_attrs)))
        coords.append(("frequency", Variable("frequency", chan_freq, freq_attrs)))
        return extra

    def _extra_variables(self, done, sizes):
        """Columns outside the MSv2 standard, and CORRECTED_DATA, MODEL_DATA, ...: a
        variable when their cells in the partition have one shape."""
        out = []
        rows = np.sort(self.partition.row_map[self.partition.row_map >= 0])
        for name, col in self.main.columns.items():
            if name in MS_COLUMNS or name in done or name.startswith("_"):
                continue
            shape = self._row_shape(name, col, rows)
            if shape is None:
                continue
            dims, free = (), dict(sizes)
            for d, n in reversed(list(enumerate(shape, 1))):
                if free.get("polarization", -1) == n:
                    dims = ("polarization",) + dims
                    del free["polarization"]
                elif free.get("frequency", -1) == n:
                    dims = ("frequency",) + dims
                    del free["frequency"]
                else:
                    dims += (f"{name}-{d}",)
            dtype = presented_dtype(col)
            attrs, epoch = measure_attrs(col.keywords, name)
            array = MainColumnArray(self.tables, name, self.partition.row_map, shape, dtype,
                                    dtype.type(np.nan), epoch)
            out.append((name, Variable(("time", "baseline_id") + dims, array, attrs)))
        return out

    def _row_shape(self, name, col, rows):
        """The one cell shape of column ``name`` in ``rows``; None (a warning) otherwise."""
        if not col.is_array:
            warnings.warn(f"Ignoring scalar secondary column {name}",
                          ColumnShapeImputationWarning, stacklevel=4)
            return None
        shapes = set()
        if col.cell_shape is not None:
            shapes = {col.cell_shape}
        else:
            known, shape = self.main.uniform_shape(name) if col.decoded else (False, None)
            if known and shape is not None:
                shapes = {tuple(shape)}
            else:
                shapes = self._decoded_shapes(name, col, rows)
        if len(shapes) != 1 or None in shapes:
            warnings.warn(f"Ignoring secondary column {name} without a distinct row shape "
                          f"{sorted(s for s in shapes if s is not None)}",
                          ColumnShapeImputationWarning, stacklevel=4)
            return None
        return next(iter(shapes))

    def _decoded_shapes(self, name, col, rows):
        if not col.decoded:
            return set()
        shapes = set()
        for start, stop in row_spans(rows, 1 << 12):
            got = self.main.read_column(name, start, stop)
            local = rows[(rows >= start) & (rows < stop)] - start
            if isinstance(got, VarShapeColumn):
                shapes.update(got.shapes[i] for i in local.tolist())
            else:
                shapes.add(got.shape[1:])
        return shapes

    def attrs(self):
        p = self.partition
        obs = imputed_observation(self.tables.subtable("OBSERVATION"), [p.obs_id])
        date_attrs, epoch = measure_attrs(obs.keywords("RELEASE_DATE"), "RELEASE_DATE", obs,
                                          [p.obs_id])
        if date_attrs.get("scale") not in ("utc", "tai"):
            warnings.warn(f"OBSERVATION::RELEASE_DATE Ref {date_attrs.get('scale')} not in "
                          "{'utc', 'tai'}. observation_info['release_date'] may be "
                          "innaccurate.", FrameConversionWarning, stacklevel=2)
        release = float(obs.array("RELEASE_DATE")[p.obs_id])
        release = to_unix(release) if epoch else release
        proc = imputed_processor(self.tables.subtable("PROCESSOR"), [p.proc_id])
        return {
            "observation_info": {
                "observer": [obs.column("OBSERVER")[p.obs_id]],
                "project_UID": obs.column("PROJECT")[p.obs_id],
                "release_date": datetime.fromtimestamp(release, timezone.utc).isoformat()},
            "processor_info": {"sub_type": proc.column("SUB_TYPE")[p.proc_id],
                               "type": proc.column("TYPE")[p.proc_id]}}


def grid_step(values):
    """The one step of a regular grid (time intervals, channel widths): the value, or the
    mean of values all close to each other, as xarray-ms takes it; None if irregular."""
    if values.size == 1:
        return values.item()
    if np.allclose(values[:, None], values[None, :]):
        return np.mean(values)
    return None
