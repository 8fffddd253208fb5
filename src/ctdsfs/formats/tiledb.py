"""TileDB arrays (seed 003; ``format_spec/`` in TileDB-Inc/TileDB) as read-only directories.

An array folder holds ``__schema/`` (generic tiles), ``__fragments/NAME/``
(data files ``a<i>.tdb``, ``d<i>.tdb``, ``_var``, ``_validity``, and
``__fragment_metadata.tdb``: generic tiles plus a footer at its end),
``__commits/NAME.wrt`` (a fragment without one is not part of the array) and
``__meta/`` (array metadata). Shown as::

    schema.json  schemas/NAME.json  metadata.json
    fragments/NAME/fragment.json  FIELD.npy  FIELD.offsets.npy + FIELD.data
                  FIELD.validity.npy  raw/ (the fragment's own files)
    dense/ATTR.npy  ATTR.offsets.npy + ATTR.data  ATTR.validity.npy
                  (dense arrays: every fragment merged, as libtiledb reads it)

Format versions 1 and 2 keep the schema in ``__array_schema.tdb``, a
fragment's metadata in one generic tile, and every dimension's coordinates in
``__coords.tdb``; their fragments are committed folders ``__uuid_t1``.

Listing is cheap: fragment names come from ``__commits``, a fragment's files
from its footer alone (read when its directory is first listed); the metadata
tiles are read when sizes or fragment.json are asked for, and a data tile is
decoded when a read touches it. A tile that cannot be decoded, or whose checksum fails, is
EIO for that read, logged with the array, fragment, field and tile.
"""

import json
import logging
import math
import os
import struct
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..container import DerivedView, name_problem
from ..errors import BlockError, CtdsfsError, FormatError
from . import tiledb_filters as tf
from .byte_reader import Reader
from .decoded_cache import DecodedCache
from .npy import npy_header
from .store import open_regular, read_small

log = logging.getLogger(__name__)

MAX_TILE_BYTES = 256 << 20  # a tile (or generic tile) declaring more is refused
MAX_SMALL_FILE = 64 << 20  # schema, metadata, fragment metadata files read whole
MAX_DENSE_BYTES = 256 << 20  # dense/ATTR.npy is built in memory up to this size
VAR = 0xFFFFFFFF  # cell_val_num of a var-sized field
NEWEST_VERSION = 23  # the newest format version the format pages describe
LEGACY_SCHEMA = "__array_schema.tdb"  # the one schema of versions before 10
LEGACY_VERSIONS = (1, 2)  # fragment metadata in one generic tile (TileDB 1.4 and 1.5)
GENERIC_HEAD = struct.Struct("<IQQBQBI")  # version, persisted and tile size, datatype,
# cell size, encryption, filter pipeline size
TILES = DecodedCache(128 << 20)  # decoded tiles of every fragment, bounded by bytes
TILES_AHEAD = 3  # a read of tile i has tiles i+1.. decoded ahead, while the cache holds them
LAYOUTS = {0: "row-major", 1: "col-major", 2: "global", 3: "unordered", 4: "hilbert"}
EXTRA_FIELDS = (("__timestamps", "t"), ("__delete_timestamps", "dt"),
                ("__delete_condition_index", "dci"))  # uint64 fields of consolidated fragments


_AHEAD = None
_AHEAD_LOCK = threading.Lock()


def _ahead():
    """Threads that decode, ahead of the readers, the tiles after one they read: a
    tile each, so one waits for the disk while another decodes."""
    global _AHEAD
    with _AHEAD_LOCK:
        if _AHEAD is None:
            _AHEAD = ThreadPoolExecutor(max_workers=min(TILES_AHEAD, os.cpu_count() or 2),
                                        thread_name_prefix="tiledb-ahead")
        return _AHEAD


def _json_bytes(obj):
    return (json.dumps(obj, indent=2, default=_json_default) + "\n").encode()


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(type(value).__name__)


def _value_list(raw, datatype, cell_val_num=1):
    """Bytes of values of ``datatype`` as JSON-ready values (strings for string types)."""
    if datatype in tf.STRING_TYPES or cell_val_num == VAR:
        return bytes(raw).decode("utf-8", "backslashreplace")
    dtype = tf.dtype_of(datatype)
    values = np.frombuffer(bytes(raw), dtype, len(raw) // dtype.itemsize).tolist()
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------- generic tiles

def read_generic_tile(data, offset, what):
    """The unfiltered content of the generic tile at ``offset`` of ``data``, and its end."""
    head = Reader(data, what)
    head.take(offset)
    version, persisted, size, datatype, cell_size, encryption, plen = \
        head.unpack(GENERIC_HEAD.format[1:])
    if not 1 <= version <= NEWEST_VERSION:
        raise FormatError(f"{what}: format version {version} is not one ctdsfs reads (1 to "
                          f"{NEWEST_VERSION}; TileDB before 1.4 wrote none)")
    if encryption:
        raise FormatError(f"{what}: encrypted (ctdsfs has no key)")
    if size > MAX_TILE_BYTES:
        raise FormatError(f"{what}: tile of {size} bytes is larger than ctdsfs reads")
    pipeline = tf.parse_pipeline(Reader(head.take(plen), what))
    problem = tf.pipeline_problem(pipeline)
    if problem:
        raise FormatError(f"{what}: {problem}")
    body = head.take(persisted)
    return tf.unfilter_tile(body, pipeline, datatype, max(cell_size, 1), size, what), head.pos


def _file_size(path, what):
    fd = open_regular(path, what)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _pread(path, offset, size, what):
    """Up to ``size`` bytes of ``path`` (a regular file, never through a link) from ``offset``."""
    if not 0 <= offset < 1 << 62:
        raise FormatError(f"{what}: offset {offset} is past any file")
    fd = open_regular(path, what)
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        raise FormatError(f"{what}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _read_small(path, what):
    return read_small(path, MAX_SMALL_FILE, what)


# ---------------------------------------------------------------- schema

def _read_name(reader, fmt):
    raw = bytes(reader.take(reader.unpack(fmt)))
    return raw.decode("utf-8", "surrogateescape")


def _read_dimension(r, version, domain_type):
    dim = {"name": _read_name(r, "I")}
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
    attr = {"name": _read_name(r, "I")}
    attr["type"], attr["cell_val_num"] = r.unpack("BI")
    _check_field_type(attr, r.what)
    attr["filters"] = tf.parse_pipeline(r)
    attr["fill"] = bytes(r.take(r.unpack("Q"))) if version >= 6 else None
    attr["nullable"], attr["fill_validity"] = r.unpack("BB") if version >= 7 else (0, 1)
    attr["order"] = r.unpack("B") if version >= 17 else 0
    attr["enumeration"] = _read_name(r, "I") if version >= 20 else ""
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
        s["enumerations"] = [{"name": _read_name(r, "I"), "file": _read_name(r, "I")}
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
                      "fill": None if fill is None else _safe_values(fill, a),
                      "fill_validity": a["fill_validity"], "filters": pipeline(a["filters"])})
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


def _sums(values, datatype):
    """Tile sums as TileDB keeps them: doubles for floats, int64 for signed integers."""
    if datatype in (2, 3):
        return values.view("<f8").tolist()
    if tf.dtype_of(datatype).kind == "i":
        return values.view("<i8").tolist()
    return values.tolist()


def _safe_values(raw, field):
    try:
        return _value_list(raw, field["type"], field["cell_val_num"])
    except FormatError:
        return bytes(raw).hex()


# ---------------------------------------------------------------- array metadata

def parse_metadata(data, what, into):
    """Apply one ``__meta`` file (key/value puts and deletes) to the dict ``into``."""
    body, _ = read_generic_tile(data, 0, what)
    r = Reader(body, what)
    while r.left():
        key = _read_name(r, "I")
        if r.unpack("B"):
            into.pop(key, None)
            continue
        datatype, count = r.unpack("BI")
        size = tf.dtype_of(datatype, what).itemsize
        if count * size > r.left():
            raise FormatError(f"{what}: value of {key!r} runs past the end")
        into[key] = {"type": tf.datatype_name(datatype),
                     "value": _value_list(r.take(count * size), datatype)}


# ---------------------------------------------------------------- fragments

class Field:
    """One stored field of a fragment: an attribute, a dimension, or t/dt/dci."""

    def __init__(self, name, datatype, cell_val_num, filters, nullable, stem, kind):
        self.name = name
        self.kind = kind  # attribute, coords (the legacy slot), dimension or extra
        self.type = datatype
        self.cell_val_num = cell_val_num
        self.filters = filters
        self.nullable = nullable
        self.stem = stem  # data file name without ``.tdb``
        self.dtype = tf.dtype_of(datatype)

    @property
    def var(self):
        return self.cell_val_num == VAR

    @property
    def cell_size(self):
        return 8 if self.var else self.dtype.itemsize * self.cell_val_num


def _timestamps(name):
    """(t1, t2) from a timestamped name ``__t1_t2_uuid[_version][.ext]``, or from a
    version 1-2 fragment name ``__uuid_t1[_t2]``; else None."""
    legacy = _legacy_timestamps(name)
    if legacy:
        return legacy
    parts = name.split("_")
    try:
        if name.startswith("__") and len(parts) >= 5:
            return int(parts[2]), int(parts[3])
    except ValueError:
        pass
    return None


def _legacy_timestamps(name):
    """(t1, t2) of a version 1-2 fragment folder name ``__uuid_t1[_t2]``, or None."""
    parts = name.split("_")
    if not name.startswith("__") or len(parts) not in (4, 5) or len(parts[2]) != 32:
        return None
    try:
        int(parts[2], 16)
        stamps = [int(p) for p in parts[3:]]
    except ValueError:
        return None
    return stamps[0], stamps[-1]


def _by_time(names):
    """Timestamped names oldest first (as numbers: ``__9_9_...`` before ``__10_10_...``)."""
    return sorted(names, key=lambda n: (_timestamps(n) or (0, 0), n))


class FragmentMetadata:
    """The footer and the per-field tiles of ``__fragment_metadata.tdb`` (version >= 10)."""

    def __init__(self, path, schema, what, footer=None):
        """``path``: the metadata file, whose footer is at its end (only the footer is read
        now, the tiles when asked for), unless ``footer`` (a footer from a consolidated
        metadata file, whose tiles are not at hand) is given."""
        self.what = what
        self.path = path
        if footer is None:
            size = _file_size(path, what)
            if size < 12:
                raise FormatError(f"{what}: too short for a footer")
            footer_len = struct.unpack("<Q", _pread(path, size - 8, 8, what))[0]
            if footer_len > min(size - 8, MAX_SMALL_FILE):
                raise FormatError(f"{what}: footer length {footer_len} exceeds the file")
            footer = _pread(path, size - 8 - footer_len, footer_len, what)
        r = Reader(footer, what + " footer")
        self.version = r.unpack("I")
        if self.version < 10:
            raise FormatError(f"{what}: fragment format version {self.version} "
                              f"(ctdsfs reads 10 and later)")
        self.schema_name = _read_name(r, "Q")
        self.schema = schema(self.schema_name)
        self.dense = bool(r.unpack("B"))
        dims = self.schema["dimensions"]
        self.non_empty_domain = None if r.unpack("B") else self._read_mbr(r, dims)
        self.sparse_tiles, self.last_tile_cells = r.unpack("QQ")
        self.has_timestamps = bool(r.unpack("B")) if self.version >= 14 else False
        self.has_delete_meta = bool(r.unpack("B")) if self.version >= 15 else False
        self.fields = fields_of(self.schema, self.has_timestamps, self.has_delete_meta)
        n = len(self.fields)
        self.file_sizes = r.unpack(f"{n}Q") if n else ()
        self.file_var_sizes = r.unpack(f"{n}Q") if n else ()
        self.file_validity_sizes = r.unpack(f"{n}Q") if n else ()
        self.rtree_offset = r.unpack("Q")
        names = ["tile_offsets", "tile_var_offsets", "tile_var_sizes"] + \
            ["tile_validity_offsets"] * (self.version >= 7) + \
            ["tile_mins", "tile_maxes", "tile_sums", "tile_null_counts"] * (self.version >= 11)
        self.tile_offsets_at = {k: (r.unpack(f"{n}Q") if n else ()) for k in names}
        self.fragment_stats_at = r.unpack("Q") if self.version >= 11 else None
        self.processed_conditions_at = r.unpack("Q") if self.version >= 16 else None
        self._cache = {}

    def footer_json(self):
        """The footer as JSON: what a consolidated metadata file keeps of each fragment."""
        names = [f.name for f in self.fields]
        out = {"version": self.version, "array_schema_name": self.schema_name,
               "dense": self.dense, "non_empty_domain": self.non_empty_domain,
               "sparse_tile_num": self.sparse_tiles,
               "last_tile_cell_num": self.last_tile_cells,
               "has_timestamps": self.has_timestamps, "has_delete_meta": self.has_delete_meta,
               "file_sizes": dict(zip(names, self.file_sizes)),
               "file_var_sizes": dict(zip(names, self.file_var_sizes)),
               "file_validity_sizes": dict(zip(names, self.file_validity_sizes)),
               "rtree_offset": self.rtree_offset}
        out.update({f"{kind}_at": dict(zip(names, at))
                    for kind, at in self.tile_offsets_at.items()})
        return out

    def offsets_in_data(self, field):
        """Whether a var string field's offsets are kept in its var tiles (RLE or DICTIONARY
        since versions 12/13 for ASCII, 17 for UTF-8), its offsets tiles being empty."""
        types = {f["type"] for f in field.filters["filters"]}
        return field.var and (
            (field.type == 11 and (self.version >= 12 and 4 in types
                                   or self.version >= 13 and 14 in types))
            or (field.type == 12 and self.version >= 17 and types & {4, 14}))

    def stores(self, field):
        """Whether the fragment has tiles of ``field`` (dense ones store no coordinates)."""
        return field.kind != "coords" and not (self.dense and field.kind == "dimension")

    def _read_mbr(self, r, dims):
        mbr = []
        for d in dims:
            if d["cell_val_num"] == VAR:
                size, min_size = r.unpack("QQ")
                if min_size > size:
                    raise FormatError(f"{self.what}: var range minimum longer than the range")
                raw = bytes(r.take(size))
                mbr.append([raw[:min_size].decode("utf-8", "backslashreplace"),
                            raw[min_size:].decode("utf-8", "backslashreplace")])
            else:
                dtype = tf.dtype_of(d["type"])
                mbr.append(np.frombuffer(bytes(r.take(2 * dtype.itemsize)), dtype).tolist())
        return mbr

    def tile(self, offset, label):
        """A generic tile of this file (cached)."""
        if offset not in self._cache:
            what = f"{self.what}: {label}"
            head = _pread(self.path, offset, GENERIC_HEAD.size, what)
            if len(head) < GENERIC_HEAD.size:
                raise FormatError(f"{what}: no generic tile at {offset}")
            fields = GENERIC_HEAD.unpack(head)
            length = GENERIC_HEAD.size + fields[-1] + fields[1]
            if length > MAX_SMALL_FILE:
                raise FormatError(f"{what}: generic tile of {length} bytes")
            self._cache[offset] = read_generic_tile(_pread(self.path, offset, length, what), 0,
                                                    what)[0]
        return self._cache[offset]

    def u64_list(self, kind, index):
        """A tile of u64 values (offsets, sizes, sums, counts) of field ``index``."""
        body = self.tile(self.tile_offsets_at[kind][index],
                         f"{kind} of {self.fields[index].name}")
        r = Reader(body, f"{self.what}: {kind}")
        count = r.count("Q", 8)
        return np.frombuffer(bytes(r.take(8 * count)), "<u8")

    def min_max(self, kind, index):
        """Tile mins or maxes: a buffer of values (offsets into a var buffer for var fields)."""
        field = self.fields[index]
        body = self.tile(self.tile_offsets_at[kind][index], f"{kind} of {field.name}")
        r = Reader(body, f"{self.what}: {kind}")
        fixed_size, var_size = r.unpack("QQ")
        fixed, var = bytes(r.take(fixed_size)), bytes(r.take(var_size))
        if not field.var:
            step = field.cell_size
            return [_value_list(fixed[i:i + step], field.type, field.cell_val_num)
                    for i in range(0, len(fixed) - step + 1, step)]
        starts = np.frombuffer(fixed, "<u8", len(fixed) // 8).tolist() + [len(var)]
        return [var[a:b].decode("utf-8", "backslashreplace") for a, b in zip(starts, starts[1:])]

    def rtree(self):
        body = self.tile(self.rtree_offset, "R-tree")
        r = Reader(body, f"{self.what}: R-tree")
        fanout, levels = r.unpack("II")
        out = {"fanout": fanout, "levels": []}
        dims = self.schema["dimensions"]
        for _ in range(min(levels, 64)):
            count = r.count("Q", 1)
            out["levels"].append([self._read_mbr(r, dims) for _ in range(min(count, 10000))])
            if count > 10000:
                out["levels"][-1].append("...")
                break
        return out

    def fragment_stats(self):
        body = self.tile(self.fragment_stats_at, "fragment min/max/sum/null count")
        r = Reader(body, f"{self.what}: fragment statistics")
        stats = {}
        for field in self.fields:
            low = r.take(r.unpack("Q"))
            high = r.take(r.unpack("Q"))
            total, nulls = r.unpack("QQ")
            if field.kind != "coords":
                stats[field.name] = {"min": _safe_values(low, vars(field)),
                                     "max": _safe_values(high, vars(field)),
                                     "sum": _sums(np.array([total], "<u8"), field.type)[0],
                                     "null_count": nulls}
        return stats

    def processed_conditions(self):
        if self.processed_conditions_at is None:
            return []
        body = self.tile(self.processed_conditions_at, "processed conditions")
        r = Reader(body, f"{self.what}: processed conditions")
        return [_read_name(r, "Q") for _ in range(r.count("Q", 8))]


def fragment_metadata(path, schema, what):
    """The metadata of a fragment, by the format version of its first generic tile: one
    tile (1, 2), a footer with tiles (10 on; 3 to 9, whose footer has no length, are
    refused: no real file of them was at hand to check a reader against)."""
    head = _pread(path, 0, 4, what)
    version = struct.unpack("<I", head)[0] if len(head) == 4 else None
    if version in LEGACY_VERSIONS:
        return LegacyFragmentMetadata(path, schema, what)
    if version is not None and 3 <= version < 10:
        raise FormatError(f"{what}: fragment format version {version} (TileDB 1.6 to 2.3) "
                          f"is not read by ctdsfs; its files are in raw/")
    return FragmentMetadata(path, schema, what)


class LegacyFragmentMetadata(FragmentMetadata):
    """Fragment metadata of versions 1 and 2: one generic tile holding the non-empty
    domain, the MBRs, first/last coordinates, and the tile offsets and file sizes of each
    attribute and of ``__coords.tdb`` (every dimension's coordinates in one tile)."""

    def __init__(self, path, schema, what):
        self.what = what
        self.path = path
        self.schema_name = LEGACY_SCHEMA
        self.schema = schema(LEGACY_SCHEMA)
        body, _ = read_generic_tile(_read_small(path, what), 0, what)
        r = Reader(body, what)
        self.version = r.unpack("I")
        dims, attrs = self.schema["dimensions"], self.schema["attributes"]
        dtype = tf.dtype_of(dims[0]["type"], what)
        if any(d["type"] != dims[0]["type"] for d in dims):
            raise FormatError(f"{what}: dimensions of different types before version 5")
        self.coords_dtype = dtype
        pair = 2 * len(dims) * dtype.itemsize  # a range (or first and last cell) per dimension
        domain = bytes(r.take(r.unpack("Q")))
        self.non_empty_domain = np.frombuffer(domain, dtype).reshape(-1, 2).tolist() \
            if len(domain) == pair else None
        self.mbrs = [np.frombuffer(bytes(r.take(pair)), dtype).reshape(-1, 2).tolist()
                     for _ in range(r.count("Q", pair))]
        self.bounding_coords = [np.frombuffer(bytes(r.take(pair)), dtype).reshape(2, -1).tolist()
                                for _ in range(r.count("Q", pair))]
        stored = len(attrs) + 1  # the attributes and __coords.tdb
        lists = {"tile_offsets": [self._u64s(r) for _ in range(stored)],
                 "tile_var_offsets": [self._u64s(r) for _ in attrs],
                 "tile_var_sizes": [self._u64s(r) for _ in attrs]}
        self.last_tile_cells = r.unpack("Q")
        sizes = tuple(np.frombuffer(bytes(r.take(8 * stored)), "<u8").tolist())
        var_sizes = tuple(np.frombuffer(bytes(r.take(8 * len(attrs))), "<u8").tolist())
        self.dense = self.schema["array_type"] == 0
        self.sparse_tiles = 0 if self.dense else len(lists["tile_offsets"][-1])
        self.has_timestamps = self.has_delete_meta = False
        self.fields = fields_of(self.schema, False, False, legacy=True)
        coords = len(attrs)
        # dimensions read __coords.tdb: its offsets and size
        self.file_sizes = sizes + (sizes[coords],) * len(dims)
        self.file_var_sizes = var_sizes + (0,) * (len(dims) + 1)
        self.file_validity_sizes = (0,) * len(self.fields)
        empty = np.zeros(0, "<u8")
        self._lists = {kind: [lists[kind][i] if i < len(lists[kind]) else
                              (lists[kind][coords] if kind == "tile_offsets" else empty)
                              for i in range(len(self.fields))] for kind in lists}
        self.rtree_offset = self.fragment_stats_at = self.processed_conditions_at = None
        self.tile_offsets_at = {}
        self._cache = {}

    @staticmethod
    def _u64s(r):
        return np.frombuffer(bytes(r.take(8 * r.count("Q", 8))), "<u8")

    def u64_list(self, kind, index):
        if kind not in self._lists:
            raise FormatError(f"{self.what}: no {kind} before version 7")
        return self._lists[kind][index]

    def coords_zipped(self):
        """Whether ``__coords.tdb`` holds each cell's coordinates together (version 1
        without a compression filter) rather than each dimension's together."""
        return self.version == 1 and not any(
            f["type"] in tf.COMPRESSORS for f in self.schema["coords_filters"]["filters"])

    def rtree(self):
        return {"mbrs": self.mbrs, "bounding_coords": self.bounding_coords}

    def processed_conditions(self):
        return []


def fields_of(schema, has_timestamps, has_delete_meta, legacy=False):
    """The stored fields in footer order: attributes, legacy coordinates, dimensions,
    then t/dt/dci. ``legacy`` (versions 1 and 2): files named after the attributes, the
    dimensions read from ``__coords.tdb``."""
    coords = schema["coords_filters"]
    dims = schema["dimensions"]
    fields = [Field(a["name"], a["type"], a["cell_val_num"], a["filters"], bool(a["nullable"]),
                    a["name"] if legacy else f"a{i}", "attribute")
              for i, a in enumerate(schema["attributes"])]
    # the slot of the legacy coordinates file (``__coords.tdb``, empty since version 5)
    fields.append(Field("__coords", dims[0]["type"], len(dims) if legacy else 1, coords,
                        False, "__coords", "coords"))
    fields += [Field(d["name"], d["type"], d["cell_val_num"],
                     d["filters"] if d["filters"] and d["filters"]["filters"] else coords,
                     False, "__coords" if legacy else f"d{i}", "dimension")
               for i, d in enumerate(dims)]
    extras = EXTRA_FIELDS[:1] * has_timestamps + EXTRA_FIELDS[1:] * has_delete_meta
    fields += [Field(name, 10, 1, coords, False, stem, "extra") for name, stem in extras]
    return fields


# ---------------------------------------------------------------- read-only directories

class _Directory(DerivedView):
    """A read-only translated directory: entries built on first use by ``_build()``.

    An entry is bytes, a ``_Lazy`` file, or a nested container.
    """

    format_name = "TileDB"
    checks_reads = True
    read_only_note = " (TileDB arrays are shown read-only)"

    def _file_size(self, entry):
        return entry.size  # (a _Lazy's size is a property)


class _Lazy:
    """A file whose bytes are a header followed by the concatenation of pieces.

    ``layout()`` gives the header and every piece's size, worked out when the
    size or the bytes are first asked for; ``load(i)`` gives piece i (a tile,
    decoded when a read first touches it). A layout that cannot be worked out
    is EIO for that file.
    """

    def __init__(self, layout, load):
        self._layout = layout
        self.load = load
        self._ready = None
        self._lock = threading.Lock()

    def _parts(self):
        with self._lock:
            if self._ready is None:
                try:
                    header, sizes = self._layout()
                except BlockError:
                    raise
                except CtdsfsError as exc:
                    raise BlockError(str(exc), str(exc)) from None
                ends = np.cumsum(np.asarray(sizes, dtype=np.int64)) if len(sizes) \
                    else np.zeros(0, np.int64)
                self._ready = header, ends, len(header) + (int(ends[-1]) if len(ends) else 0)
            return self._ready

    @property
    def size(self):
        return self._parts()[2]

    def read(self, offset, size):
        header, ends, total = self._parts()
        end = min(offset + size, total)
        if end <= len(header):  # small files are all header: bytes, as parsers want
            return header[offset:end]
        if offset >= len(header) and offset < end:  # within one piece: one copy
            pos, stop = offset - len(header), end - len(header)
            i = int(np.searchsorted(ends, pos, side="right"))
            start = int(ends[i - 1]) if i else 0
            if stop <= int(ends[i]):  # handed over without a copy
                return memoryview(self.load(i))[pos - start:stop - start]
        out = bytearray(header[offset:end])
        pos = max(offset, len(header)) - len(header)
        stop = end - len(header)
        while pos < stop:
            i = int(np.searchsorted(ends, pos, side="right"))
            start = int(ends[i - 1]) if i else 0
            piece = self.load(i)
            out += memoryview(piece)[pos - start:min(stop, int(ends[i])) - start]
            pos = int(ends[i])
        return memoryview(out).toreadonly()  # the contract's read-only view: no second copy


def _data_file(field, kind):
    """The file holding ``kind`` (data, var, validity) tiles of ``field``."""
    return field.stem + {"data": "", "var": "_var", "validity": "_validity"}[kind] + ".tdb"


class Fragment(_Directory):
    """One committed fragment: fragment.json, FIELD.npy and friends, raw/.

    Listing it reads only the footer: which files there are follows from the
    schema; their sizes (tile counts, var sizes) and fragment.json are worked
    out when first asked for, the tiles when first read.
    """

    def __init__(self, array, name):
        super().__init__(f"{array.label}/fragments/{name}")
        self.array = array
        self.name = name
        self.path = array.fragment_paths[name]
        self.meta = None
        self._counts = None
        self._var_bases = {}  # field index -> where each var tile starts in FIELD.data
        self._hidden = {}  # field name -> files not shown, with the reason

    def _load_meta(self):
        if self.meta is None:
            what = f"{self.label}: __fragment_metadata.tdb"
            self.meta = fragment_metadata(os.path.join(self.path, "__fragment_metadata.tdb"),
                                          self.array.schema_named, what)
        return self.meta

    def _build(self):
        from ..vfs.directory import DirectorySource
        entries = OrderedDict()
        try:
            meta = self._load_meta()
        except CtdsfsError as exc:
            self.problems.append(str(exc))
            log.warning("%s", exc)
            entries["fragment.json"] = _json_bytes({"name": self.name, "problem": str(exc)})
            entries["raw"] = DirectorySource(self.path, recurse=False)
            return entries
        entries["fragment.json"] = _Lazy(lambda: (_json_bytes(self._describe_fragment()), []),
                                         None)
        files = OrderedDict()
        for index, field in enumerate(meta.fields):
            for file_name, entry in self._field_files(index, field).items():
                why = name_problem(file_name) or ("name used twice" if file_name in files
                                                  else None)
                if why:
                    self.problems.append(f"{file_name!r} not shown: {why}")
                    self._hidden.setdefault(field.name, []).append(
                        f"{file_name!r} not shown: {why}")
                else:
                    files[file_name] = entry
        entries.update(files)
        entries["raw"] = DirectorySource(self.path, recurse=False)
        return entries

    def cell_counts(self):
        """Cells in each tile, from the schema, the footer and the first field's tile
        offsets (no data tile read)."""
        if self._counts is not None:
            return self._counts
        meta = self._load_meta()
        tiles = len(meta.u64_list("tile_offsets", 0)) if meta.fields else 0
        if meta.dense:
            per_tile = 1
            for d in meta.schema["dimensions"]:
                extent = d["tile_extent"]
                if not isinstance(extent, int) or extent <= 0:
                    raise FormatError(f"{self.label}: dense dimension {d['name']!r} has no "
                                      f"integer tile extent")
                per_tile *= extent
            counts = [per_tile] * tiles
        else:
            counts = [meta.schema["capacity"]] * tiles
            if tiles:
                counts[-1] = meta.last_tile_cells
        if any(c * 8 > MAX_TILE_BYTES for c in counts[:1] + counts[-1:]):
            raise FormatError(f"{self.label}: tiles of {counts[0]} cells are larger "
                              f"than ctdsfs reads")
        self._counts = counts
        return counts

    def _field_files(self, index, field):
        """{file name: _Lazy} of one field (none if it has no tiles or cannot be undone)."""
        meta = self.meta
        if not meta.stores(field) or tf.pipeline_problem(field.filters):
            return {}
        name = field.name
        if field.var:
            files = {f"{name}.offsets.npy": _Lazy(lambda: self._offsets_layout(index),
                                                  lambda i: self._offsets_piece(index, i)),
                     f"{name}.data": _Lazy(lambda: (b"", self._var_sizes(index)),
                                           lambda i: self._tile(index, "var", i))}
        else:
            def layout():
                counts = self.cell_counts()
                tail = () if field.cell_val_num == 1 else (field.cell_val_num,)
                return (npy_header(field.dtype.str, (sum(counts),) + tail, False),
                        [c * field.cell_size for c in counts])
            files = {f"{name}.npy": _Lazy(layout, lambda i: self._tile(index, "data", i))}
        if field.nullable:
            files[f"{name}.validity.npy"] = _Lazy(
                lambda: (npy_header("|u1", (sum(self.cell_counts()),), False),
                         self.cell_counts()),
                lambda i: self._tile(index, "validity", i))
        return files

    def _var_sizes(self, index):
        sizes = self.meta.u64_list("tile_var_sizes", index)
        if len(sizes) != len(self.cell_counts()):
            raise FormatError(f"{self.label}: {len(sizes)} var tile sizes for "
                              f"{len(self.cell_counts())} tiles")
        return sizes.tolist()

    def _offsets_layout(self, index):
        """FIELD.offsets.npy: every cell's start in FIELD.data, then its end."""
        counts = self.cell_counts()
        sizes = [8 * c for c in counts] or [0]
        sizes[-1] += 8
        return npy_header("<u8", (sum(counts) + 1,), False), sizes

    def _offsets_piece(self, index, i):
        """Tile i's cell offsets made global (into FIELD.data), worked out once; the last
        tile adds the end."""
        return TILES.get_or_load((self.path, index, "global offsets", i), self,
                                 lambda: self._global_offsets(index, i))

    def _global_offsets(self, index, i):
        with self._lock:
            bases = self._var_bases.get(index)
            if bases is None:
                bases = self._var_bases[index] = np.concatenate((
                    np.zeros(1, np.uint64), np.cumsum(self._var_sizes(index), dtype=np.uint64)))
        counts = self.cell_counts()
        if not counts:
            return bases[-1:].astype("<u8").tobytes()
        kind = "offsets" if self.meta.offsets_in_data(self.meta.fields[index]) else "data"
        piece = np.frombuffer(self._tile(index, kind, i), "<u8") + bases[i]
        if i == len(counts) - 1:
            piece = np.concatenate((piece, bases[-1:]))
        return piece.astype("<u8").tobytes()

    def _field_json(self, index, field):
        """fragment.json's part for one field: files, tile offsets and statistics."""
        meta = self.meta
        info = {"file": field.stem + ".tdb", "type": tf.datatype_name(field.type),
                "cell_val_num": "var" if field.var else field.cell_val_num,
                "nullable": field.nullable, "file_size": meta.file_sizes[index]}
        problem = tf.pipeline_problem(field.filters) if meta.stores(field) else None
        if problem:
            info["problem"] = f"shown in raw/ only: {problem}"
        if field.name in self._hidden:
            info["problems"] = self._hidden[field.name]
        try:
            info["tile_offsets"] = meta.u64_list("tile_offsets", index).tolist()
            if field.var:
                info["file_var_size"] = meta.file_var_sizes[index]
                info["tile_var_offsets"] = meta.u64_list("tile_var_offsets", index).tolist()
                info["tile_var_sizes"] = meta.u64_list("tile_var_sizes", index).tolist()
            if field.nullable:
                info["file_validity_size"] = meta.file_validity_sizes[index]
                info["tile_validity_offsets"] = \
                    meta.u64_list("tile_validity_offsets", index).tolist()
        except CtdsfsError as exc:
            info["problem"] = str(exc)
            return info
        if meta.version >= 11:
            try:
                info["tile_sums"] = _sums(meta.u64_list("tile_sums", index), field.type)
                info["tile_null_counts"] = meta.u64_list("tile_null_counts", index).tolist()
                info["tile_mins"] = meta.min_max("tile_mins", index)
                info["tile_maxes"] = meta.min_max("tile_maxes", index)
            except CtdsfsError as exc:
                info["statistics_problem"] = str(exc)
        return info

    def _tile(self, index, kind, i):
        """Decoded tile i of field ``index`` (kind: data, var, validity, or offsets for
        strings that keep them in the var tile), from the shared cache. Readers that
        want a tile another is decoding wait for it; the next tiles are decoded ahead
        (the kernel reads a file in order, several requests at a time)."""
        if kind == "offsets":  # decoding the var tile gives them
            self._tile(index, "var", i)
            data = TILES.get((self.path, index, kind, i), self)
            return data if data is not None else self._decode(index, "var", i)[1]
        data = TILES.get_or_load((self.path, index, kind, i), self,
                                 lambda: self._decoded(index, kind, i, parallel=True))
        tiles = len(self._counts or ())
        room = max(0, TILES.limit // max(len(data), 1) - 2)  # the ahead ones must not evict
        for ahead in range(i + 1, min(i + 1 + min(TILES_AHEAD, room), tiles)):
            # (its chunks one after another: the other threads have the other cores)
            TILES.load_ahead((self.path, index, kind, ahead), self,
                             lambda ahead=ahead: self._decoded(index, kind, ahead, False),
                             _ahead().submit)
        return data

    def _decoded(self, index, kind, i, parallel):
        """``_decode``'s tile; the offsets it finds in a var tile go into the cache."""
        data, offsets = self._decode(index, kind, i, parallel)
        if offsets is not None:
            TILES.put((self.path, index, "offsets", i), self, offsets)
        return data

    def _decode(self, index, kind, i, parallel=True):
        """Tile i of field ``index`` unfiltered, and for strings whose offsets are in the
        var tile those offsets (else None); BlockError if it cannot be decoded."""
        meta = self.meta
        field = meta.fields[index]
        schema = meta.schema
        string_offsets = [] if kind == "var" and meta.offsets_in_data(field) else None
        file_name = _data_file(field, kind)
        where = f"tile {i} of {field.name} ({file_name})"
        try:
            if name_problem(file_name):
                raise FormatError(f"{where}: not a file name: {name_problem(file_name)}")
            if field.kind == "dimension" and isinstance(meta, LegacyFragmentMetadata):
                return self._legacy_coordinates(index, i), None
            counts = self.cell_counts()
            if i >= len(counts):
                raise FormatError(f"{where}: the fragment has {len(counts)} tiles")
            if kind == "var":
                offsets = meta.u64_list("tile_var_offsets", index)
                file_size = meta.file_var_sizes[index]
                expected = self._var_sizes(index)[i]
                pipeline, datatype, cell = field.filters, field.type, field.dtype.itemsize
            elif kind == "validity":
                offsets = meta.u64_list("tile_validity_offsets", index)
                file_size = meta.file_validity_sizes[index]
                expected = counts[i]
                pipeline, datatype, cell = schema["validity_filters"], 6, 1
            else:
                offsets = meta.u64_list("tile_offsets", index)
                file_size = meta.file_sizes[index]
                expected = counts[i] * field.cell_size
                pipeline = schema["offsets_filters"] if field.var else field.filters
                datatype = 10 if field.var else field.type
                cell = 8 if field.var else field.cell_size
            if expected > MAX_TILE_BYTES:
                raise FormatError(f"{where}: {expected} bytes is more than ctdsfs decodes")
            raw = self._tile_bytes(file_name, offsets, i, file_size, where)
            data = tf.unfilter_tile(raw, pipeline, datatype, cell, expected, where,
                                    string_offsets, parallel)
            if len(data) != expected:
                raise FormatError(f"{where}: {len(data)} bytes, not the {expected} the "
                                  f"metadata declares")
            if string_offsets is not None:
                cells = sum(map(len, string_offsets))
                if cells != counts[i]:
                    raise FormatError(f"{where}: strings for {cells} cells, not {counts[i]}")
                string_offsets = b"".join(o.tobytes() for o in string_offsets)
        except CtdsfsError as exc:
            detail = str(exc)
            raise BlockError(f"{self.label}: {detail}", detail) from None
        return data, string_offsets

    def _legacy_coordinates(self, index, i):
        """Tile i of a dimension of a version 1-2 fragment, cut from ``__coords.tdb``."""
        meta = self.meta
        coords = len(meta.schema["attributes"])  # the __coords field, before the dimensions
        dims = len(meta.schema["dimensions"])
        cells = np.frombuffer(self._tile(coords, "data", i), meta.coords_dtype)
        cells = cells.reshape(-1, dims).T if meta.coords_zipped() else cells.reshape(dims, -1)
        return cells[index - coords - 1].tobytes()

    def _tile_bytes(self, file_name, offsets, i, file_size, where):
        """The on-disk bytes of tile i: from its offset to the next (or the file's end)."""
        if i >= len(offsets):
            raise FormatError(f"{where}: no offset for this tile")
        start = int(offsets[i])
        end = int(offsets[i + 1]) if i + 1 < len(offsets) else int(file_size)
        if end < start or end - start > MAX_TILE_BYTES:
            raise FormatError(f"{where}: tile offsets {start}..{end} are not a tile")
        raw = _pread(os.path.join(self.path, file_name), start, end - start, where)
        if len(raw) != end - start:
            raise FormatError(f"{where}: bytes {start}..{end} run past the end of the file")
        return raw

    def _describe_fragment(self):
        meta = self.meta
        stamps = _timestamps(self.name)
        out = {"name": self.name, "timestamps": list(stamps) if stamps else None,
               "version": meta.version, "array_schema_name": meta.schema_name,
               "dense": meta.dense, "non_empty_domain": meta.non_empty_domain,
               "sparse_tile_num": meta.sparse_tiles, "last_tile_cell_num": meta.last_tile_cells,
               "has_timestamps": meta.has_timestamps,
               "has_delete_meta": meta.has_delete_meta}
        calls = [("rtree", meta.rtree), ("processed_conditions", meta.processed_conditions)]
        if meta.version >= 11:
            calls.append(("fragment_statistics", meta.fragment_stats))
        for key, call in calls:
            try:
                out[key] = call()
            except CtdsfsError as exc:
                out[key] = {"problem": str(exc)}
        out["fields"] = {field.name: self._field_json(index, field)
                         for index, field in enumerate(meta.fields)
                         if field.kind != "coords" or meta.file_sizes[index]}
        return out

    def check(self, bar=None):
        """Decode every tile of every field (checksums verified); problems and notes."""
        problems, notes = [], []
        self.names()  # (listing reads the metadata, or says what is wrong with it)
        problems += [p if p.startswith(self.label) else f"{self.label}: {p}"
                     for p in self.problems]
        if self.meta is None:
            return problems, notes
        meta = self.meta
        try:
            counts = self.cell_counts()
        except CtdsfsError as exc:
            return problems + [str(exc)], notes
        for index, field in enumerate(meta.fields):
            if not meta.stores(field):
                continue
            if tf.pipeline_problem(field.filters):
                notes.append(f"{self.label}: {field.name}: not decoded (raw/ only)")
                continue
            kinds = ["data"] * (not meta.offsets_in_data(field)) + ["var"] * field.var + \
                ["validity"] * field.nullable
            for kind in kinds:
                problems += self._check_file(index, kind, len(counts), bar)
        notes.append(f"{self.label}: {len(counts)} tiles of {len(meta.fields)} fields checked")
        return problems, notes

    def _check_file(self, index, kind, tiles, bar):
        meta = self.meta
        field = meta.fields[index]
        file_name = _data_file(field, kind)
        declared = {"data": meta.file_sizes, "var": meta.file_var_sizes,
                    "validity": meta.file_validity_sizes}[kind][index]
        problems = []
        try:
            if name_problem(file_name):
                raise FormatError(f"not a file name: {name_problem(file_name)}")
            actual = os.path.getsize(os.path.join(self.path, file_name))
            if actual != declared:
                problems.append(f"{self.label}: {file_name}: {actual} bytes, the footer "
                                f"says {declared}")
            kind_offsets = {"data": "tile_offsets", "var": "tile_var_offsets",
                            "validity": "tile_validity_offsets"}[kind]
            offsets = meta.u64_list(kind_offsets, index)
            if len(offsets) != tiles:
                problems.append(f"{self.label}: {file_name}: {len(offsets)} tile offsets for "
                                f"{tiles} tiles")
            if len(offsets) and (np.any(np.diff(offsets.astype(np.int64)) < 0)
                                 or int(offsets[-1]) > declared or int(offsets[0]) != 0):
                problems.append(f"{self.label}: {file_name}: tile offsets not inside the file "
                                f"in order")
        except (OSError, CtdsfsError) as exc:
            return problems + [f"{self.label}: {file_name}: {exc}"]
        for i in range(min(tiles, len(offsets))):
            try:
                data = self._decode(index, kind, i)[0]
                if bar is not None:
                    bar.update(len(data))
            except BlockError as exc:
                problems.append(f"{self.label}: {exc.detail}")
        return problems


class _Folder(_Directory):
    """A directory of given entries (``schemas/``, ``fragments/``, ``dense/``)."""

    def __init__(self, label, build):
        super().__init__(label)
        self._builder = build

    def _build(self):
        return self._builder()


class TileDBArray(_Directory):
    """A TileDB array folder as schema.json, schemas/, metadata.json, fragments/, dense/."""

    def __init__(self, path):
        super().__init__(os.fspath(path))
        self.path = os.fspath(path)
        self._schemas = {}
        self.schema_names = _by_time(self._list("__schema", files_only=True))
        if not self.schema_names and LEGACY_SCHEMA in self._list(".", files_only=True):
            self.schema_names = [LEGACY_SCHEMA]
        if not self.schema_names:
            raise FormatError(f"{self.label}: no array schema in __schema")
        self.schema = self.schema_named(self.schema_names[-1])
        self.fragment_names = self._committed_fragments()
        self._fragments = {}
        self._dense_cache = None  # (attribute index, its merged parts)

    def _list(self, folder, files_only=False):
        where = os.path.join(self.path, folder)
        try:
            names = sorted(os.listdir(where))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise FormatError(f"{self.label}: {folder}: {exc.strerror}") from None
        if files_only:
            names = [n for n in names if os.path.isfile(os.path.join(where, n))
                     and not os.path.islink(os.path.join(where, n))]
        return names

    def schema_named(self, name):
        """The schema in ``__schema/name`` (parsed once)."""
        with self._lock:
            if name not in self._schemas:
                if name not in self.schema_names:
                    raise FormatError(f"{self.label}: no schema {name!r} in __schema")
                folder = "." if name == LEGACY_SCHEMA else "__schema"
                what = f"{self.label}: {os.path.normpath(os.path.join(folder, name))}"
                data = _read_small(os.path.join(self.path, folder, name), what)
                self._schemas[name] = parse_schema(data, what)
            return self._schemas[name]

    def _committed_fragments(self):
        """Fragment folders with a commit: ``__commits/NAME.wrt`` or a line of a ``.con``
        file (version 12 on), ``NAME.ok`` beside a folder in the array's own (5 to 11),
        or (1 and 2, renamed when complete) a ``__uuid_t1`` folder with fragment metadata."""
        self.fragment_paths = {n: os.path.join(self.path, "__fragments", n)
                               for n in self._list("__fragments")}
        committed = set()
        for name in self._list("."):
            if name.endswith(".ok") and name.startswith("__") and name[:-3] != "__":
                self.fragment_paths.setdefault(name[:-3], os.path.join(self.path, name[:-3]))
                committed.add(name[:-3])
            elif _legacy_timestamps(name) and os.path.isfile(
                    os.path.join(self.path, name, "__fragment_metadata.tdb")):
                self.fragment_paths.setdefault(name, os.path.join(self.path, name))
                committed.add(name)
        present = set(self.fragment_paths)
        for name in self._list("__commits"):
            if name.endswith(".wrt"):
                committed.add(name[:-4])
            elif name.endswith(".con"):
                what = f"{self.label}: __commits/{name}"
                text = _read_small(os.path.join(self.path, "__commits", name), what)
                for line in text.split(b"\n"):
                    line = line.decode("utf-8", "surrogateescape")
                    if line.startswith("__fragments/") and line.endswith(".wrt"):
                        committed.add(line[len("__fragments/"):-4])
        for name in sorted(present - committed):
            self.problems.append(f"fragment {name!r} not shown: no commit file")
        shown = []
        for name in _by_time(present & committed):
            why = name_problem(name)
            path = self.fragment_paths[name]
            if why or not os.path.isdir(path) or os.path.islink(path):
                self.problems.append(f"fragment {name!r} not shown: {why or 'not a directory'}")
            else:
                shown.append(name)
        return shown

    def fragment(self, name):
        with self._lock:
            if name not in self._fragments:
                self._fragments[name] = Fragment(self, name)
            return self._fragments[name]

    def metadata(self):
        values = {}
        for name in _by_time(self._list("__meta", files_only=True)):
            if name.endswith(".vac"):
                continue
            what = f"{self.label}: __meta/{name}"
            try:
                parse_metadata(_read_small(os.path.join(self.path, "__meta", name), what),
                               what, values)
            except CtdsfsError as exc:
                self.problems.append(str(exc))
                log.warning("%s", exc)
        return values

    def _schemas_folder(self):
        entries = OrderedDict()
        for name in self.schema_names:
            try:
                entries[name + ".json"] = _json_bytes(schema_json(self.schema_named(name)))
            except CtdsfsError as exc:
                self.problems.append(str(exc))
        return entries

    def _build(self):
        entries = OrderedDict()
        entries["schema.json"] = _json_bytes(schema_json(self.schema))
        entries["schemas"] = _Folder(f"{self.label}/schemas", self._schemas_folder)
        entries["metadata.json"] = _json_bytes(self.metadata())
        entries["fragments"] = _Folder(f"{self.label}/fragments", lambda: OrderedDict(
            (name, self.fragment(name)) for name in self.fragment_names))
        if self.schema["array_type"] == 0:
            entries["dense"] = _Folder(f"{self.label}/dense", self._dense_folder)
        if self._list("__fragment_meta", files_only=True):
            entries["fragment_meta"] = _Folder(f"{self.label}/fragment_meta",
                                               self._consolidated_metadata)
        return entries

    def _consolidated_metadata(self):
        """``__fragment_meta/NAME.meta`` (footers of several fragments, kept together so
        that opening reads one file) as NAME.json."""
        entries = OrderedDict()
        for name in self._list("__fragment_meta", files_only=True):
            what = f"{self.label}: __fragment_meta/{name}"
            try:
                data = _read_small(os.path.join(self.path, "__fragment_meta", name), what)
                entries[name + ".json"] = _json_bytes(self._footers(data, what))
            except CtdsfsError as exc:
                self.problems.append(str(exc))
                log.warning("%s", exc)
        return entries

    def _footers(self, data, what):
        body, _ = read_generic_tile(data, 0, what)
        r = Reader(body, what)
        listed = [(_read_name(r, "Q"), r.unpack("Q")) for _ in range(r.count("I", 16))]
        ends = [offset for _, offset in listed[1:]] + [len(body)]
        footers = []
        for (name, start), end in zip(listed, ends):
            if not start <= end <= len(body):
                raise FormatError(f"{what}: footer of {name!r} at {start}..{end} is not inside")
            meta = FragmentMetadata(None, self.schema_named, f"{what}: {name}",
                                    footer=body[start:end])
            footers.append({"fragment": name, **meta.footer_json()})
        return {"fragments": footers}

    # -- the merged dense view

    def _dense_folder(self):
        """ATTR.npy, or ATTR.offsets.npy + ATTR.data for var-sized attributes, and
        ATTR.validity.npy for nullable ones: built when first read, one attribute at a time."""
        entries = OrderedDict()
        shape = self._dense_shape()
        if shape is None:
            return entries
        cells = math.prod(shape)
        if cells * 8 > MAX_DENSE_BYTES:
            self.problems.append(f"dense/ not shown: {cells} cells are more than ctdsfs "
                                 f"builds in memory")
            return entries
        col_major = self.schema["cell_order"] == 1
        for index, field in enumerate(fields_of(self.schema, False, False)[:len(
                self.schema["attributes"])]):
            files = {}
            if field.var:
                files[f"{field.name}.offsets.npy"] = \
                    ("offsets", npy_header("<u8", (cells + 1,), False), (cells + 1) * 8)
                files[f"{field.name}.data"] = ("data", b"", None)
            elif cells * field.cell_size > MAX_DENSE_BYTES:
                self.problems.append(f"dense/{field.name}.npy not shown: "
                                     f"{cells * field.cell_size} bytes are more than ctdsfs "
                                     f"builds in memory")
            else:
                tail = () if field.cell_val_num == 1 else (field.cell_val_num,)
                files[f"{field.name}.npy"] = ("values", npy_header(
                    field.dtype.str, tuple(shape) + tail, col_major), cells * field.cell_size)
            if field.nullable:
                files[f"{field.name}.validity.npy"] = \
                    ("validity", npy_header("|u1", tuple(shape), col_major), cells)
            for name, (part, header, size) in files.items():
                if not name_problem(name):
                    entries[name] = _Lazy(
                        lambda a=index, p=part, h=header, n=size:
                            (h, [len(self._merged_part(a, p)) if n is None else n]),
                        lambda i, a=index, p=part: self._merged_part(a, p))
        return entries

    def _dense_shape(self):
        shape = []
        for d in self.schema["dimensions"]:
            low, high = d["domain"] or (0, -1)
            if not isinstance(low, int) or high < low:
                return None
            shape.append(high - low + 1)
        return shape

    def _merged_part(self, attr_index, part):
        """One part (values, offsets, data, validity) of the merged attribute, kept for the
        last attribute asked for; a fragment that cannot be merged makes the read EIO."""
        with self._lock:
            if self._dense_cache is None or self._dense_cache[0] != attr_index:
                try:
                    self._dense_cache = None
                    self._dense_cache = attr_index, self._merged(attr_index)
                except BlockError:
                    raise
                except CtdsfsError as exc:
                    raise BlockError(f"{self.label}: dense view: {exc}",
                                     f"dense view: {exc}") from None
            return self._dense_cache[1][part]

    def _dense_sources(self, attr_index):
        """Where every cell of the domain comes from: an array of the domain's shape holding
        -1 (fill) or the cell's index in the fragments' cells taken one after another, and
        those fragments with their tile counts. Fragments go in timestamp order, later
        ones over earlier ones; one that another's time range contains is left out."""
        schema = self.schema
        positions = np.full(self._dense_shape(), -1, np.int64)
        sources, base = [], 0
        ranges = {n: _timestamps(n) for n in self.fragment_names if _timestamps(n)}
        for name in self.fragment_names:
            t = ranges.get(name)
            if t and any(o != t and o[0] <= t[0] and t[1] <= o[1] for o in ranges.values()):
                continue
            frag = self.fragment(name)
            frag.names()  # (listing reads its metadata)
            meta = frag.meta
            if meta is None or not meta.dense or meta.non_empty_domain is None or \
                    meta.fields[attr_index].name != schema["attributes"][attr_index]["name"]:
                continue
            counts = frag.cell_counts()
            cells = sum(counts)
            self._place(positions, np.arange(base, base + cells, dtype=np.int64),
                        meta.non_empty_domain, schema["dimensions"], ())
            sources.append((frag, len(counts)))
            base += cells
        return positions, sources

    def _merged(self, attr_index):
        """The attribute over the whole domain, as libtiledb reads it: {part: bytes}.
        Fixed-sized values and validity in the cell order (what the .npy headers say);
        var-sized cells in row-major order, their offsets (and the end) into the data."""
        schema = self.schema
        field = fields_of(schema, False, False)[attr_index]
        attr = schema["attributes"][attr_index]
        positions, sources = self._dense_sources(attr_index)
        order = "F" if schema["cell_order"] == 1 else "C"
        parts = {}
        if field.nullable:
            validity = [np.array([attr["fill_validity"]], np.uint8)] + [
                np.frombuffer(frag._tile(attr_index, "validity", i), np.uint8)
                for frag, tiles in sources for i in range(tiles)]
            parts["validity"] = np.concatenate(validity)[
                positions.ravel(order) + 1].tobytes()
        if field.var:
            parts["offsets"], parts["data"] = self._merged_var(
                attr_index, attr["fill"], positions.ravel() + 1, sources)
            return parts
        tail = () if field.cell_val_num == 1 else (field.cell_val_num,)
        fill = attr["fill"]
        if fill is None or len(fill) != field.cell_size:
            fill = bytes(field.cell_size)  # (libtiledb always stores one cell)
        values = [fill] + [frag._tile(attr_index, "data", i)
                           for frag, tiles in sources for i in range(tiles)]
        if sum(map(len, values)) > MAX_DENSE_BYTES:
            raise FormatError("the fragments' cells are more than ctdsfs merges in memory")
        values = np.frombuffer(b"".join(values), field.dtype).reshape((-1,) + tail)
        parts["values"] = values[positions.ravel(order) + 1].tobytes()
        return parts

    def _merged_var(self, attr_index, fill, picks, sources):
        """(offsets, data) of var-sized cells: cell k is cell ``picks[k]`` of the fill value
        (0) followed by every source fragment's cells."""
        fill = fill or b""
        sizes, starts, blobs, base = [np.array([len(fill)], np.int64)], \
            [np.zeros(1, np.int64)], [fill], len(fill)
        for frag, tiles in sources:
            if not tiles:
                continue
            offsets = np.frombuffer(b"".join(frag._offsets_piece(attr_index, i)
                                             for i in range(tiles)), "<u8").astype(np.int64)
            data = b"".join(frag._tile(attr_index, "var", i) for i in range(tiles))
            if np.any(np.diff(offsets) < 0) or offsets[0] != 0 or offsets[-1] != len(data):
                raise FormatError(f"{frag.label}: cell offsets out of order or past the data")
            sizes.append(np.diff(offsets))
            starts.append(offsets[:-1] + base)
            blobs.append(data)
            base += len(data)
            if base > MAX_DENSE_BYTES:
                raise FormatError("the fragments' cells are more than ctdsfs merges in memory")
        sizes, starts = np.concatenate(sizes)[picks], np.concatenate(starts)[picks]
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if len(ends) else 0
        if total * 8 > MAX_DENSE_BYTES:
            raise FormatError(f"{total} bytes of cells are more than ctdsfs merges in memory")
        offsets = np.concatenate((np.zeros(1, np.int64), ends))
        gather = np.repeat(starts - offsets[:-1], sizes) + np.arange(total)
        data = np.frombuffer(b"".join(blobs), np.uint8)[gather]
        return offsets.astype("<u8").tobytes(), data.tobytes()

    def _place(self, result, cells, domain, dims, tail):
        """Copy a dense fragment's tiles (tile order, cells in cell order) into ``result``."""
        schema = self.schema
        extents = [d["tile_extent"] for d in dims]
        lows = [d["domain"][0] for d in dims]
        first = [(lo - dlo) // e for (lo, _), dlo, e in zip(domain, lows, extents)]
        last = [(hi - dlo) // e for (_, hi), dlo, e in zip(domain, lows, extents)]
        grid = [b - a + 1 for a, b in zip(first, last)]
        order = "F" if schema["tile_order"] == 1 else "C"
        cell_order = "F" if schema["cell_order"] == 1 else "C"
        per_tile = math.prod(extents)
        inside = all(d["domain"][0] <= lo <= hi <= d["domain"][1]
                     for (lo, hi), d in zip(domain, dims))
        if not inside or len(cells) != per_tile * math.prod(grid):
            raise FormatError("a fragment's tiles do not cover its non-empty domain "
                              "inside the array's")
        for t in range(math.prod(grid)):
            coords = np.unravel_index(t, grid, order=order)
            tile = cells[t * per_tile:(t + 1) * per_tile].reshape(tuple(extents) + tail,
                                                                  order=cell_order)
            src, dst = [], []
            for k, (c, e) in enumerate(zip(coords, extents)):
                start = lows[k] + (first[k] + c) * e  # the tile's first coordinate
                lo, hi = max(start, domain[k][0]), min(start + e - 1, domain[k][1])
                src.append(slice(lo - start, hi - start + 1))
                dst.append(slice(lo - lows[k], hi - lows[k] + 1))
            result[tuple(dst)] = tile[tuple(src)]

    # -- commands

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        schema = info["schema"]
        lines = [f"{info['container']}: TileDB {schema['array_type']} array, schema version "
                 f"{schema['version']}, {len(info['schemas'])} schema(s), "
                 f"{len(info['fragments'])} fragment(s)",
                 f"  order            tiles {schema['tile_order']}, cells {schema['cell_order']}, "
                 f"capacity {schema['capacity']}"]
        for kind, fields in (("dimension", schema["dimensions"]), ("attribute", schema["attributes"])):
            for f in fields:
                filters = "+".join(g["name"] for g in (f["filters"] or {"filters": []})["filters"])
                extra = f" domain {f['domain']} tile {f['tile_extent']}" if kind == "dimension" else ""
                lines.append(f"  {kind:<16} {f['name']}: {f['type']} x {f['cell_val_num']}"
                             f"{extra}{' nullable' if f.get('nullable') else ''}"
                             f" [{filters or 'no filters'}]")
        lines.append(f"  metadata keys    {', '.join(info['metadata']) or 'none'}")
        for frag in info["fragments"]:
            if "problem" in frag:
                lines.append(f"  fragment {frag['name']}: {frag['problem']}")
            else:
                lines.append(f"  fragment {frag['name']}: v{frag['version']}, {frag['tiles']} tiles, "
                             f"{frag['cells']} cells, non-empty domain {frag['non_empty_domain']}")
        lines += [f"  problem: {p}" for p in info["problems"]]
        return lines

    def describe(self):
        info = {"container": self.label, "format": "TileDB",
                "schema": schema_json(self.schema), "schemas": self.schema_names,
                "metadata": self.metadata(), "fragments": []}
        for name in self.fragment_names:
            frag = self.fragment(name)
            entry = {"name": name, "timestamps": list(_timestamps(name) or (0, 0))}
            try:
                meta = frag._load_meta()
                entry.update({"version": meta.version, "dense": meta.dense,
                              "non_empty_domain": meta.non_empty_domain,
                              "tiles": len(frag.cell_counts()),
                              "cells": sum(frag.cell_counts())})
            except CtdsfsError as exc:
                entry["problem"] = str(exc)
            info["fragments"].append(entry)
        info["problems"] = list(self.problems)
        return info

    def check(self, bar=None):
        """Every fragment's tiles decoded and checked, then what the array itself lacks."""
        problems, notes = [], []
        for name in self.fragment_names:
            p, n = self.fragment(name).check(bar)
            problems += p
            notes += n
        self.metadata()
        return problems + [f"{self.label}: {p}" for p in dict.fromkeys(self.problems)], notes


def looks_like_directory(path):
    """An array folder: ``__schema`` is a directory (``__fragments`` may not exist yet), or
    (before version 10) ``__array_schema.tdb`` is a file."""
    schemas, legacy = os.path.join(path, "__schema"), os.path.join(path, LEGACY_SCHEMA)
    return not os.path.islink(schemas) and os.path.isdir(schemas) or \
        not os.path.islink(legacy) and os.path.isfile(legacy)


def open_file(path, *, verify_crc=True, writable=False):
    """The TileDB array folder at ``path``, always read-only (a read-write mount shows it
    too, refusing changes); checksums are always verified."""
    return TileDBArray(path)
