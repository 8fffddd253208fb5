"""TileDB bytes that are not data: generic tiles, the array schema, array metadata.

Everything here parses bytes already read (no file access), so the same code serves
``__schema``, ``__meta``, consolidated metadata and the fragment metadata's tiles.
Types stay TileDB's datatype ids in the parsed dicts; ``schema_json`` names them the
way users read them.
"""

import json
import math
import struct

import numpy as np

from ...errors import FormatError
from ...io.byte_reader import Reader
from . import filters as tf

MAX_TILE_BYTES = 256 << 20  # a tile (or generic tile) declaring more is refused
MAX_SMALL_FILE = 64 << 20  # schema, metadata, fragment metadata files read whole
VAR = 0xFFFFFFFF  # cell_val_num of a var-sized field
NEWEST_VERSION = 23  # the newest format version the format pages describe
LEGACY_SCHEMA = "__array_schema.tdb"  # the one schema of versions before 10
GENERIC_HEAD = struct.Struct("<IQQBQBI")  # version, persisted and tile size, datatype,
# cell size, encryption, filter pipeline size
ENCRYPTIONS = {1: "AES-256-GCM"}  # a generic tile's encryption byte (0: none)
NP_FLAT, NP_SHAPE = "__np_flat_", "__np_shape_"  # tiledb-py's keys of an ndarray value
LAYOUTS = {0: "row-major", 1: "col-major", 2: "global", 3: "unordered", 4: "hilbert"}


def json_bytes(obj):
    return (json.dumps(obj, indent=2, default=_json_default) + "\n").encode()


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(type(value).__name__)


def value_list(raw, datatype, cell_val_num=1):
    """Bytes of values of ``datatype`` as JSON-ready values (strings for string types)."""
    if datatype in tf.STRING_TYPES or cell_val_num == VAR:
        return bytes(raw).decode("utf-8", "backslashreplace")
    dtype = tf.dtype_of(datatype)
    values = np.frombuffer(bytes(raw), dtype, len(raw) // dtype.itemsize).tolist()
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------- generic tiles

def read_generic_tile(data, offset, what, limit=MAX_TILE_BYTES):
    """The unfiltered content of the generic tile at ``offset`` of ``data``, and its end;
    a tile declaring more than ``limit`` bytes is refused before it is unfiltered."""
    head = Reader(data, what)
    head.take(offset)
    version, persisted, size, datatype, cell_size, encryption, plen = \
        head.unpack(GENERIC_HEAD.format[1:])
    if not 1 <= version <= NEWEST_VERSION:
        raise FormatError(f"{what}: format version {version} is not one ctdsfs reads (1 to "
                          f"{NEWEST_VERSION}; TileDB before 1.4 wrote none)")
    if encryption:
        cipher = ENCRYPTIONS.get(encryption, f"encryption type {encryption}")
        raise FormatError(f"{what}: encrypted ({cipher}); ctdsfs reads no encrypted "
                          f"TileDB array (it takes no key)")
    if size > limit:
        raise FormatError(f"{what}: tile of {size} bytes is larger than ctdsfs reads"
                          + ("" if limit == MAX_TILE_BYTES else f" here ({limit} at most)"))
    pipeline = tf.parse_pipeline(Reader(head.take(plen), what))
    problem = tf.pipeline_problem(pipeline)
    if problem:
        raise FormatError(f"{what}: {problem}")
    body = head.take(persisted)
    return tf.unfilter_tile(body, pipeline, datatype, max(cell_size, 1), size, what), head.pos


# ---------------------------------------------------------------- schema

def read_name(reader, fmt):
    raw = bytes(reader.take(reader.unpack(fmt)))
    return raw.decode("utf-8", "surrogateescape")


def _read_dimension(r, version, domain_type):
    dim = {"name": read_name(r, "I")}
    if version >= 5:
        dim["type"], dim["cell_val_num"] = r.unpack("BI")
        dim["filters"] = tf.parse_pipeline(r)
        raw = r.take(r.unpack("Q"))
    else:
        dim["type"], dim["cell_val_num"], dim["filters"] = domain_type, 1, None
        raw = r.take(2 * tf.dtype_of(domain_type, r.what).itemsize)
    dtype = tf.dtype_of(dim["type"], r.what)
    _check_field_type(dim, r.what)
    if dim["cell_val_num"] == VAR or not raw:
        dim["domain"] = None
    elif len(raw) == 2 * dtype.itemsize:
        dim["domain"] = np.frombuffer(bytes(raw), dtype).tolist()
    else:
        raise FormatError(f"{r.what}: domain of {dim['name']!r} is {len(raw)} bytes")
    null_extent = r.unpack("B")
    dim["tile_extent"] = None if null_extent else \
        np.frombuffer(bytes(r.take(dtype.itemsize)), dtype)[0].item()
    return dim


def _check_field_type(field, what):
    """A known datatype, and at least one value a cell."""
    tf.dtype_of(field["type"], what)
    if field["cell_val_num"] == 0:
        raise FormatError(f"{what}: {field['name']!r} has cells of 0 values")


def _read_attribute(r, version):
    attr = {"name": read_name(r, "I")}
    attr["type"], attr["cell_val_num"] = r.unpack("BI")
    _check_field_type(attr, r.what)
    attr["filters"] = tf.parse_pipeline(r)
    attr["fill"] = bytes(r.take(r.unpack("Q"))) if version >= 6 else None
    attr["nullable"], attr["fill_validity"] = r.unpack("BB") if version >= 7 else (0, 1)
    attr["order"] = r.unpack("B") if version >= 17 else 0
    attr["enumeration"] = read_name(r, "I") if version >= 20 else ""
    return attr


def parse_schema(data, what):
    """An array schema file (one generic tile) as a dict (types as TileDB ids)."""
    body, _ = read_generic_tile(data, 0, what)
    r = Reader(body, what)
    s = {"version": r.unpack("I")}
    version = s["version"]
    s["allows_dups"] = bool(r.unpack("B")) if version >= 5 else False
    s["array_type"], s["tile_order"], s["cell_order"], s["capacity"] = r.unpack("BBBQ")
    s["coords_filters"] = tf.parse_pipeline(r)
    s["offsets_filters"] = tf.parse_pipeline(r)
    s["validity_filters"] = tf.parse_pipeline(r) if version >= 7 else \
        {"max_chunk_size": 0, "filters": []}
    domain_type = r.unpack("B") if version < 5 else None
    s["dimensions"] = [_read_dimension(r, version, domain_type)
                       for _ in range(r.count("I", 6))]
    if not s["dimensions"]:
        raise FormatError(f"{what}: a domain without dimensions")
    s["attributes"] = [_read_attribute(r, version) for _ in range(r.count("I", 13))]
    if version >= 18 and r.unpack("I"):
        s["dimension_labels"] = "present (not decoded)"
        return s
    if version >= 20:
        s["enumerations"] = [{"name": read_name(r, "I"), "file": read_name(r, "I")}
                             for _ in range(r.count("I", 8))]
    return s


def schema_json(s):
    """The schema as users read it: names for types, orders and filters."""
    def pipeline(p):
        if p is None:
            return None
        out = {"max_chunk_size": p["max_chunk_size"], "filters": []}
        for f in p["filters"]:
            g = {k: v for k, v in f.items() if k not in ("type", "compressor")}
            if "reinterpret_type" in g:
                g["reinterpret_type"] = tf.datatype_name(g["reinterpret_type"])
            out["filters"].append(g)
        return out

    def cvn(n):
        return "var" if n == VAR else n

    attrs = []
    for a in s["attributes"]:
        fill = a["fill"]
        attrs.append({"name": a["name"], "type": tf.datatype_name(a["type"]),
                      "cell_val_num": cvn(a["cell_val_num"]), "nullable": bool(a["nullable"]),
                      "fill": None if fill is None else safe_values(fill, a),
                      "fill_validity": a["fill_validity"], "filters": pipeline(a["filters"])})
        if a.get("enumeration"):
            attrs[-1]["enumeration"] = a["enumeration"]
    dims = [{"name": d["name"], "type": tf.datatype_name(d["type"]),
             "cell_val_num": cvn(d["cell_val_num"]), "domain": d["domain"],
             "tile_extent": d["tile_extent"], "filters": pipeline(d["filters"])}
            for d in s["dimensions"]]
    out = {"version": s["version"], "array_type": "sparse" if s["array_type"] else "dense",
           "allows_dups": s["allows_dups"], "tile_order": LAYOUTS.get(s["tile_order"]),
           "cell_order": LAYOUTS.get(s["cell_order"]), "capacity": s["capacity"],
           "dimensions": dims, "attributes": attrs,
           "coords_filters": pipeline(s["coords_filters"]),
           "offsets_filters": pipeline(s["offsets_filters"]),
           "validity_filters": pipeline(s["validity_filters"])}
    for key in ("enumerations", "dimension_labels"):
        if key in s:
            out[key] = s[key]
    return out


def parse_enumeration(data, what):
    """An enumeration file (``__schema/__enumerations/``: one generic tile) as its name,
    its values' type and the values (labels) themselves."""
    body, _ = read_generic_tile(data, 0, what)
    r = Reader(body, what)
    version = r.unpack("I")
    name, file_name = read_name(r, "I"), read_name(r, "I")
    datatype, cell_val_num, ordered = r.unpack("BIB")
    tf.dtype_of(datatype, what)
    data = bytes(r.take(r.unpack("Q")))
    if cell_val_num == VAR:
        count = r.unpack("Q")
        if count % 8:
            raise FormatError(f"{what}: offsets of {count} bytes are not whole offsets")
        starts = np.frombuffer(bytes(r.take(count)), "<u8").tolist() + [len(data)]
        if any(b < a for a, b in zip(starts, starts[1:])):
            raise FormatError(f"{what}: offsets out of order or past the values")
        kind = VAR if datatype in tf.STRING_TYPES else 1  # (labels are strings, or lists)
        values = [value_list(data[a:b], datatype, kind) for a, b in zip(starts, starts[1:])]
    elif cell_val_num == 0:
        raise FormatError(f"{what}: values of 0 bytes")
    else:
        step = cell_val_num * tf.dtype_of(datatype).itemsize
        values = [value_list(data[i:i + step], datatype, cell_val_num)
                  for i in range(0, len(data) - step + 1, step)]
    return {"name": name, "file": file_name, "version": version,
            "type": tf.datatype_name(datatype),
            "cell_val_num": "var" if cell_val_num == VAR else cell_val_num,
            "ordered": bool(ordered), "values": values}


def sums(values, datatype):
    """Tile sums as TileDB keeps them: doubles for floats, int64 for signed integers."""
    if datatype in (2, 3):
        return values.view("<f8").tolist()
    if tf.dtype_of(datatype).kind == "i":
        return values.view("<i8").tolist()
    return values.tolist()


def safe_values(raw, field):
    try:
        return value_list(raw, field["type"], field["cell_val_num"])
    except FormatError:
        return bytes(raw).hex()


# ---------------------------------------------------------------- array metadata

def parse_metadata(data, what, into):
    """Apply one ``__meta`` file (key/value puts and deletes) to the dict ``into``."""
    body, _ = read_generic_tile(data, 0, what)
    r = Reader(body, what)
    while r.left():
        key = read_name(r, "I")
        if r.unpack("B"):
            into.pop(key, None)
            continue
        datatype, count = r.unpack("BI")
        size = tf.dtype_of(datatype, what).itemsize
        if count * size > r.left():
            raise FormatError(f"{what}: value of {key!r} runs past the end")
        value = value_list(r.take(count * size), datatype)
        if datatype == 41:  # BOOL: as tiledb-py gives it
            value = [bool(v) for v in value] if isinstance(value, list) else bool(value)
        into[key] = {"type": tf.datatype_name(datatype), "value": value}


def metadata_as_tiledb_py(values):
    """Metadata keyed as ``A.meta`` shows it: tiledb-py keeps an ndarray value as
    ``__np_flat_KEY`` (its values) and, unless it is 1-D, ``__np_shape_KEY``; here that
    is KEY again, its value a (nested) list. A shape that does not fit is left flat."""
    out = {}
    for key, entry in values.items():
        if key.startswith(NP_SHAPE):
            continue
        if not key.startswith(NP_FLAT):
            out[key] = entry
            continue
        name = key[len(NP_FLAT):]
        flat = entry["value"] if isinstance(entry["value"], list) else [entry["value"]]
        shape = values.get(NP_SHAPE + name, {}).get("value")
        shape = shape if isinstance(shape, list) else [shape]
        if all(isinstance(n, int) and n >= 0 for n in shape) and \
                math.prod(shape) == len(flat) and len(shape) > 1:
            flat = np.array(flat, dtype=object).reshape(shape).tolist()
        out[name] = {"type": entry["type"], "value": flat}
    return out


