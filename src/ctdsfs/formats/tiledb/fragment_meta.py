"""TileDB fragment metadata: which fields a fragment stores, and where their tiles are.

``__fragment_metadata.tdb`` ends with a footer (field file sizes and where each
per-field tile of offsets, sizes, mins/maxes/sums sits in the same file); those
tiles are read one at a time when asked for, so listing a fragment costs its
footer only. Versions 1 and 2 keep all of it in one generic tile
(``LegacyFragmentMetadata``). Fragment names carry their timestamps, which order
fragments and schemas.
"""

import os
import struct

import numpy as np

from ...errors import FormatError
from ...io.beneath import listdir_beneath, lstat_beneath, open_regular_beneath, read_small_beneath
from ...io.byte_reader import Reader
from ...io.store import preadv_all
from . import filters as tf
from .schema import (
    GENERIC_HEAD,
    LEGACY_SCHEMA,
    MAX_SMALL_FILE,
    VAR,
    read_generic_tile,
    read_name,
    safe_values,
    sums,
    value_list,
)

LEGACY_VERSIONS = (1, 2)  # fragment metadata in one generic tile (TileDB 1.4 and 1.5)
# a fragment's metadata tiles together hold at most this many bytes for each byte of its
# files (every tile a field lists costs its data file more than a tenth of what the
# metadata keeps of it: offsets, sizes, sums, counts, mins and maxes, its MBR), and a MiB
METADATA_PER_FILE_BYTE = 16
EXTRA_FIELDS = (("__timestamps", "t"), ("__delete_timestamps", "dt"),
                ("__delete_condition_index", "dci"))  # uint64 fields of consolidated fragments


class ArrayFile:
    """A file inside an array folder, reached from the array's root one component at a
    time without following a link (``beneath``): any folder of an array (``__fragments``,
    a fragment, ``__meta``) may be a link to somewhere else, and nothing outside the
    array is ever read."""

    def __init__(self, root, rel):
        self.root = root
        self.rel = rel

    def size(self, what):
        fd = open_regular_beneath(self.root, self.rel, what)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def pread(self, offset, size, what):
        """Up to ``size`` bytes from ``offset``."""
        if not 0 <= offset < 1 << 62:
            raise FormatError(f"{what}: offset {offset} is past any file")
        fd = open_regular_beneath(self.root, self.rel, what)
        try:
            return os.pread(fd, size, offset)
        except OSError as exc:
            raise FormatError(f"{what}: {exc.strerror}") from None
        finally:
            os.close(fd)

    def pread_into(self, offset, into, what):
        """Fill ``into`` (a writable buffer) from ``offset`` on, as far as the file goes;
        the byte count."""
        if not 0 <= offset < 1 << 62:
            raise FormatError(f"{what}: offset {offset} is past any file")
        fd = open_regular_beneath(self.root, self.rel, what)
        try:
            return preadv_all(fd, into, offset)
        except OSError as exc:
            raise FormatError(f"{what}: {exc.strerror}") from None
        finally:
            os.close(fd)

    def read_small(self, what):
        """The whole file, up to MAX_SMALL_FILE bytes."""
        return read_small_beneath(self.root, self.rel, MAX_SMALL_FILE, what)


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
    def user_dtype(self):
        """(dtype, cell shape) of the field's .npy files: what tiledb-py gives."""
        return tf.user_dtype(self.type, self.cell_val_num)

    @property
    def cell_size(self):
        return 8 if self.var else self.dtype.itemsize * self.cell_val_num


def timestamps(name):
    """(t1, t2) from a timestamped name ``__t1_t2_uuid[_version][.ext]``, or from a
    version 1-2 fragment name ``__uuid_t1[_t2]``; else None."""
    legacy = legacy_timestamps(name)
    if legacy:
        return legacy
    parts = name.split("_")
    try:
        if name.startswith("__") and len(parts) >= 5:
            return int(parts[2]), int(parts[3])
    except ValueError:
        pass
    return None


def legacy_timestamps(name):
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


def by_time(names):
    """Timestamped names oldest first (as numbers: ``__9_9_...`` before ``__10_10_...``)."""
    return sorted(names, key=lambda n: (timestamps(n) or (0, 0), n))


class FragmentMetadata:
    """The footer and the per-field tiles of ``__fragment_metadata.tdb`` (version >= 10)."""

    def __init__(self, file, schema, what, footer=None):
        """``file``: the metadata file (an ArrayFile), whose footer is at its end (only the
        footer is read now, the tiles when asked for), unless ``footer`` (a footer from a
        consolidated metadata file, whose tiles are not at hand) is given."""
        self.what = what
        self.file = file
        if footer is None:
            size = file.size(what)
            if size < 12:
                raise FormatError(f"{what}: too short for a footer")
            footer_len = struct.unpack("<Q", file.pread(size - 8, 8, what))[0]
            if footer_len > min(size - 8, MAX_SMALL_FILE):
                raise FormatError(f"{what}: footer length {footer_len} exceeds the file")
            footer = file.pread(size - 8 - footer_len, footer_len, what)
        r = Reader(footer, what + " footer")
        self.version = r.unpack("I")
        if self.version < 10:
            raise FormatError(f"{what}: fragment format version {self.version} "
                              f"(ctdsfs reads 10 and later)")
        self.schema_name = read_name(r, "Q")
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
        self._budget = None

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
            head = self.file.pread(offset, GENERIC_HEAD.size, what)
            if len(head) < GENERIC_HEAD.size:
                raise FormatError(f"{what}: no generic tile at {offset}")
            fields = GENERIC_HEAD.unpack(head)
            length = GENERIC_HEAD.size + fields[-1] + fields[1]
            if length > MAX_SMALL_FILE:
                raise FormatError(f"{what}: generic tile of {length} bytes")
            room = self._tiles_budget(what) - sum(map(len, self._cache.values()))
            self._cache[offset] = read_generic_tile(self.file.pread(offset, length, what), 0,
                                                    what, max(room, 0))[0]
        return self._cache[offset]

    def _tiles_budget(self, what):
        """The most bytes this fragment's metadata tiles may hold (METADATA_PER_FILE_BYTE):
        a tile that declares more is refused before it is decompressed, so the memory a
        fragment's metadata takes follows the bytes its files really hold."""
        if self._budget is None:
            folder = os.path.dirname(self.file.rel)
            try:
                held = sum(lstat_beneath(self.file.root, os.path.join(folder, name)).st_size
                           for name in listdir_beneath(self.file.root, folder))
            except OSError as exc:
                raise FormatError(f"{what}: {exc.strerror}") from None
            self._budget = METADATA_PER_FILE_BYTE * held + (1 << 20)
        return self._budget

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
            return [value_list(fixed[i:i + step], field.type, field.cell_val_num)
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
                stats[field.name] = {"min": safe_values(low, vars(field)),
                                     "max": safe_values(high, vars(field)),
                                     "sum": sums(np.array([total], "<u8"), field.type)[0],
                                     "null_count": nulls}
        return stats

    def processed_conditions(self):
        if self.processed_conditions_at is None:
            return []
        body = self.tile(self.processed_conditions_at, "processed conditions")
        r = Reader(body, f"{self.what}: processed conditions")
        return [read_name(r, "Q") for _ in range(r.count("Q", 8))]


def fragment_metadata(file, schema, what):
    """The metadata of a fragment, by the format version of its first generic tile: one
    tile (1, 2), a footer with tiles (10 on; 3 to 9, whose footer has no length, are
    refused: no real file of them was at hand to check a reader against)."""
    head = file.pread(0, 4, what)
    version = struct.unpack("<I", head)[0] if len(head) == 4 else None
    if version in LEGACY_VERSIONS:
        return LegacyFragmentMetadata(file, schema, what)
    if version is not None and 3 <= version < 10:
        raise FormatError(f"{what}: fragment format version {version} (TileDB 1.6 to 2.3) "
                          f"is not read by ctdsfs; its files are in raw/")
    return FragmentMetadata(file, schema, what)


class LegacyFragmentMetadata(FragmentMetadata):
    """Fragment metadata of versions 1 and 2: one generic tile holding the non-empty
    domain, the MBRs, first/last coordinates, and the tile offsets and file sizes of each
    attribute and of ``__coords.tdb`` (every dimension's coordinates in one tile)."""

    def __init__(self, file, schema, what):
        self.what = what
        self.file = file
        self.schema_name = LEGACY_SCHEMA
        self.schema = schema(LEGACY_SCHEMA)
        body, _ = read_generic_tile(file.read_small(what), 0, what)
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


