"""casacore measures (a column's MEASINFO and QuantumUnits keywords) as MSv4 attrs.

The rules are xarray-ms's (0.5.x): an epoch becomes ``{type: time, units, format: unix,
scale}`` and its values move from MJD seconds to unix seconds; frequencies, UVW, positions
and directions get their MSv4 type and frame; a column with units only is a quantity.
A frame given per row (``VarRefCol``) must be one frame over the rows read.
"""

import warnings

import numpy as np

from .errors import (
    ComplexMeasurementSet,
    FrameConversionWarning,
    InvalidMeasurementSet,
    MissingMeasuresInfo,
    MultipleQuantumUnits,
    PartitioningError,
)

MJD_TO_UNIX = 3506716800.0  # seconds from 1858-11-17 (MJD 0) to 1970-01-01

# casacore's reference codes per measure (MEpoch.h, MFrequency.h, MDirection.h, Muvw.h,
# MPosition.h): what a VarRefCol's integers mean without TabRefTypes
_SKY = ["J2000", "JMEAN", "JTRUE", "APP", "B1950", "B1950_VLA", "BMEAN", "BTRUE",
        "GALACTIC", "HADEC", "AZEL", "AZELSW", "AZELGEO", "AZELSWGEO", "JNAT", "ECLIPTIC",
        "MECLIPTIC", "TECLIPTIC", "SUPERGAL", "ITRF", "TOPO", "ICRS"]
REFERENCE_CODES = {
    "epoch": ["LAST", "LMST", "GMST1", "GAST", "UT1", "UT2", "UTC", "TAI", "TDT", "TCG",
              "TDB", "TCB"],
    "frequency": ["REST", "LSRK", "LSRD", "BARY", "GEO", "TOPO", "GALACTO", "LGROUP", "CMB"],
    "direction": _SKY + ["MERCURY", "VENUS", "MARS", "JUPITER", "SATURN", "URANUS",
                         "NEPTUNE", "PLUTO", "SUN", "MOON", "COMET"],
    "uvw": _SKY,
    "position": ["ITRF", "WGS84"],
}
MSV4_TYPES = {"uvw": "uvw", "epoch": "time", "frequency": "spectral_coord",
              "direction": "sky_coord", "position": "location"}
FRAMES = {
    "direction": {"AZEL": "altaz", "AZELGEO": "altaz", "ICRS": "icrs", "J2000": "fk5"},
    "position": {"ITRF": "ITRS"},
    "frequency": {"BARY": "BARY", "REST": "REST", "TOPO": "TOPO", "LSRK": "lsrk",
                  "LSRD": "lsrd", "GEO": "gcrs"},
}


def values_of(keyword):
    """A keyword array's values (the decoder gives arrays as ``{shape, values}``)."""
    return keyword["values"] if isinstance(keyword, dict) and "values" in keyword else keyword


def unit(keywords, name):
    """The column's one unit, None without QuantumUnits."""
    if "QuantumUnits" not in keywords:
        return None
    units = set(values_of(keywords["QuantumUnits"]))
    if len(units) > 1:
        raise MultipleQuantumUnits(f"Multiple quantum units {sorted(units)} found for "
                                   f"column {name}")
    return next(iter(units), None)


def _frame(keywords, name, measure, subtable=None, rows=None):
    info = keywords["MEASINFO"]
    ref_column = info.get("VarRefCol")
    if isinstance(ref_column, str) and subtable is not None:
        codes = subtable.array(ref_column, rows) if subtable.nrow else np.zeros(0, int)
        if not np.issubdtype(codes.dtype, np.integer):
            raise InvalidMeasurementSet(f"{ref_column} is not integral {codes.dtype}")
        types = values_of(info.get("TabRefTypes"))
        if isinstance(types, list):
            numbers = values_of(info.get("TabRefCodes"))
            if not isinstance(numbers, list):
                numbers = [REFERENCE_CODES[measure].index(t) for t in types]
            if len(numbers) != len(types):
                raise InvalidMeasurementSet(f"TabRefTypes {types} and TabRefCodes {numbers} "
                                            f"have different lengths in {name} MEASINFO")
            names = dict(zip(numbers, types))
        else:
            names = dict(enumerate(REFERENCE_CODES[measure]))
        try:
            frames = {names[int(c)] for c in codes}
        except KeyError as exc:
            raise InvalidMeasurementSet(f"Code {exc.args[0]} in {ref_column} is not in the "
                                        f"code frame map {names} for column {name}") from None
        if len(frames) > 1:
            raise PartitioningError(f"Multiple measures frames {sorted(frames)} found in "
                                    f"{name}: partition more finely")
        return next(iter(frames), None)
    if "Ref" in info:
        return info["Ref"]
    if any("VarRefCol" in k or k.startswith("RefOff") for k in info):
        raise ComplexMeasurementSet(f"The MEASINFO in column {name} {info} refers to other "
                                    "columns")
    raise MissingMeasuresInfo(f"'Ref' was not present in {name} MEASINFO {info}")


def _msv4_frame(measure, frame):
    table = FRAMES[measure]
    if frame not in table:
        warnings.warn(f"No conversion exists from MSv2 frame {frame}. Available mappings: "
                      f"{table}. {frame} will be used as the MSv4 frame.",
                      FrameConversionWarning, stacklevel=3)
        return frame
    return table[frame]


def measure_type(keywords):
    info = keywords.get("MEASINFO")
    return info.get("type") if isinstance(info, dict) else None


def measure_attrs(keywords, name, subtable=None, rows=None):
    """(attrs, is_epoch) for column ``name`` with ``keywords``; ``subtable`` and ``rows``
    give a per-row frame (``VarRefCol``) its values."""
    measure = measure_type(keywords)
    if measure is None:
        units = unit(keywords, name)
        return ({} if units is None else {"type": "quantity", "units": units}), False
    if measure not in MSV4_TYPES:
        raise NotImplementedError(f"{measure} measures")
    units = unit(keywords, name)
    if units is None:
        raise MissingMeasuresInfo(f"QuantumUnits is not present in {name} keywords")
    attrs = {"type": MSV4_TYPES[measure], "units": units}
    frame = _frame(keywords, name, measure, subtable, rows)
    if measure == "epoch":
        if frame not in ("UTC", "TAI"):
            raise NotImplementedError(f"Epoch frame {frame}")
        attrs.update(format="unix", scale=frame.lower())
    elif measure == "uvw":
        if frame not in ("J2000", "APP", "ITRF"):
            raise NotImplementedError(f"UVW frame {frame}")
        attrs["frame"] = "fk5" if frame == "J2000" else frame
    elif measure == "frequency":
        attrs["observer"] = _msv4_frame(measure, frame)
    else:
        attrs["frame"] = _msv4_frame(measure, frame)
    return attrs, measure == "epoch"


def to_unix(values):
    """MJD seconds to unix seconds."""
    return values - MJD_TO_UNIX
