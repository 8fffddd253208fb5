"""A TileDB fragment as a directory: fragment.json, FIELD.npy and friends, raw/.

Also the pieces every TileDB view is built from: the read-only directory class, the
lazy file (a header and pieces worked out on first use), and the shared cache of
decoded tiles with its read-ahead threads, so that a sequential reader finds the
next tiles already decoded.
"""

import logging
import os
from collections import OrderedDict

import numpy as np

from ...container import DerivedView, name_problem
from ...errors import BlockError, CtdsfsError, FormatError
from ...io.beneath import lstat_beneath
from ...io.blosc_chunk import file_identity
from ...io.buffers import spare_buffer
from ...io.decoded_cache import DecodedCache, shared_pool
from ...io.directory import PlainDirectory
from ...io.lazy_files import PiecedFile
from ...io.npy import npy_header
from . import blosc as tiledb_blosc
from . import filters as tf
from .fragment_meta import ArrayFile, LegacyFragmentMetadata, fragment_metadata, timestamps
from .schema import MAX_TILE_BYTES, json_bytes, sums

log = logging.getLogger(__name__)

TILES = DecodedCache(128 << 20, "tiledb tiles")  # decoded tiles of every fragment, by bytes
TILES_AHEAD = 3  # a read of tile i has tiles i+1.. decoded ahead, while the cache holds them


class TileDBDirectory(DerivedView):
    """A read-only translated directory: entries built on first use by ``_build()``.

    An entry is bytes, a ``PiecedFile`` file, or a nested container.
    """

    format_name = "TileDB"
    checks_reads = True
    read_only_note = " (TileDB arrays are shown read-only)"

    def _file_size(self, entry):
        return entry.size  # (a PiecedFile's size is a property)

    def cached(self, key, offset, size):
        """Whether the read's tiles are decoded already (then the mount answers it without
        a thread's hop); never builds the entries."""
        entry = (self._built or {}).get(key) if isinstance(key, str) else None
        return isinstance(entry, bytes) or (isinstance(entry, PiecedFile) and
                                            entry.held(offset, size))


def _data_file(field, kind):
    """The file holding ``kind`` (data, var, validity) tiles of ``field``."""
    return field.stem + {"data": "", "var": "_var", "validity": "_validity"}[kind] + ".tdb"


class Fragment(TileDBDirectory):
    """One committed fragment: fragment.json, FIELD.npy and friends, raw/.

    Listing it reads only the footer: which files there are follows from the
    schema; their sizes (tile counts, var sizes) and fragment.json are worked
    out when first asked for, the tiles when first read.
    """

    def __init__(self, array, name):
        super().__init__(f"{array.label}/fragments/{name}")
        self.array = array
        self.name = name
        self.rel = array.fragment_paths[name]  # its folder inside the array
        self.path = os.path.join(array.path, self.rel)
        self.meta = None
        self._counts = None
        self._var_bases = {}  # field index -> where each var tile starts in FIELD.data
        self._hidden = {}  # field name -> files not shown, with the reason
        self._identity = None

    @property
    def identity(self):
        """What the fragment's tiles are valid for: its folder and its metadata file (a
        fragment is written once; one written again has a new metadata file), the same
        in every worker process; the object itself (its tiles stay in this process) if
        that file cannot be looked at."""
        if self._identity is None:
            try:
                self._identity = (self.path,) + file_identity(lstat_beneath(
                    self.array.path, os.path.join(self.rel, "__fragment_metadata.tdb")))
            except (OSError, CtdsfsError):
                self._identity = self
        return self._identity

    def _load_meta(self):
        if self.meta is None:
            what = f"{self.label}: __fragment_metadata.tdb"
            self.meta = fragment_metadata(self._file("__fragment_metadata.tdb"),
                                          self.array.schema_named, what)
        return self.meta

    def _file(self, name):
        """A file of this fragment, never reached through a link."""
        return ArrayFile(self.array.path, os.path.join(self.rel, name))

    def _build(self):
        entries = OrderedDict()
        try:
            meta = self._load_meta()
        except CtdsfsError as exc:
            self.problems.append(str(exc))
            log.warning("%s", exc)
            entries["fragment.json"] = json_bytes({"name": self.name, "problem": str(exc)})
            entries["raw"] = PlainDirectory(self.path)
            return entries
        entries["fragment.json"] = PiecedFile(lambda: (json_bytes(self._describe_fragment()), []),
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
        entries["raw"] = PlainDirectory(self.path)
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
        """{file name: PiecedFile} of one field (none if it has no tiles or cannot be undone)."""
        meta = self.meta
        if not meta.stores(field) or tf.pipeline_problem(field.filters):
            return {}
        name = field.name
        if field.var:
            files = {f"{name}.offsets.npy": PiecedFile(lambda: self._offsets_layout(index),
                                                  lambda i: self._offsets_piece(index, i)),
                     f"{name}.data": PiecedFile(lambda: (b"", self._var_sizes(index)),
                                           lambda i: self._tile(index, "var", i))}
        else:
            def layout():
                counts = self.cell_counts()
                dtype, tail = field.user_dtype
                return (npy_header(dtype.str, (sum(counts),) + tail, False),
                        [c * field.cell_size for c in counts])
            files = {f"{name}.npy": PiecedFile(layout, lambda i: self._tile(index, "data", i),
                                             lambda i: self.tile_held(index, "data", i))}
        if field.nullable:
            files[f"{name}.validity.npy"] = PiecedFile(
                lambda: (npy_header("|u1", (sum(self.cell_counts()),), False),
                         self.cell_counts()),
                lambda i: self._tile(index, "validity", i),
                lambda i: self.tile_held(index, "validity", i))
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
        return TILES.get_or_load((self.path, index, "global offsets", i), self.identity,
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
                info["tile_sums"] = sums(meta.u64_list("tile_sums", index), field.type)
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
        of a reader that had the tile before (the kernel reads a file in order, several
        requests at a time), none for a random read."""
        if kind == "offsets":  # decoding the var tile gives them
            self._tile(index, "var", i)
            data = TILES.get((self.path, index, kind, i), self.identity)
            return data if data is not None else self._decode(index, "var", i)[1]
        key = (self.path, index, kind, i)
        data = TILES.get(key, self.identity)
        # (a random read has nothing decoded before its tile)
        in_order = i == 0 or TILES.has((self.path, index, kind, i - 1), self.identity)
        if in_order:  # (asked for before this tile is decoded: the next tiles' disk reads
            # and decoding overlap this one's, the first tile of a file's too)
            self._decode_ahead(index, kind, i, None if data is None else len(data))
        if data is None:
            data = TILES.get_or_load(key, self.identity,
                                     lambda: self._decoded(index, kind, i, parallel=True))
            if in_order:
                self._decode_ahead(index, kind, i, len(data))
        return data

    def tile_held(self, index, kind, i):
        """Whether ``_tile(index, kind, i)`` is decoded and in the cache."""
        return TILES.has((self.path, index, kind, i), self.identity)

    def _decode_ahead(self, index, kind, i, tile_bytes):
        """Have tiles i+1.. decoded ahead by the pool's threads, as many as the cache holds
        beside tiles of ``tile_bytes`` (the requested one's; the first one ahead alone
        while that is not known)."""
        room = 1 if tile_bytes is None else max(0, TILES.limit // max(tile_bytes, 1) - 2)
        for ahead in range(i + 1, min(i + 1 + min(TILES_AHEAD, room), len(self._counts or ()))):
            TILES.load_ahead((self.path, index, kind, ahead), self.identity,
                             lambda ahead=ahead: self._decoded(index, kind, ahead, False),
                             shared_pool("tiledb-ahead", TILES_AHEAD).submit)

    def _decoded(self, index, kind, i, parallel):
        """``_decode``'s tile; the offsets it finds in a var tile go into the cache."""
        data, offsets = self._decode(index, kind, i, parallel)
        if offsets is not None:
            TILES.put((self.path, index, "offsets", i), self.identity, offsets)
        return data

    def _decode(self, index, kind, i, parallel=True):
        """Tile i of field ``index`` unfiltered, and for strings whose offsets are in the
        var tile those offsets (else None); BlockError if it cannot be decoded."""
        meta = self.meta
        field = meta.fields[index]
        schema = meta.schema
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
            string_offsets = tf.StringOffsets(counts[i]) \
                if kind == "var" and meta.offsets_in_data(field) else None
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
            start, size = self._tile_range(offsets, i, file_size, where)
            with spare_buffer(tiledb_blosc.ROOM + size) as spare:
                raw = memoryview(spare)[:tiledb_blosc.ROOM + size]
                if self._file(file_name).pread_into(start, raw[tiledb_blosc.ROOM:], where) \
                        != size:
                    raise FormatError(f"{where}: bytes {start}..{start + size} run past the "
                                      f"end of the file")
                data = tf.unfilter_tile(raw, pipeline, datatype, cell, expected, where,
                                        string_offsets, parallel, tiledb_blosc.ROOM)
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

    def _tile_range(self, offsets, i, file_size, where):
        """(start, size) of tile i's on-disk bytes: from its offset to the next (or the
        file's end)."""
        if i >= len(offsets):
            raise FormatError(f"{where}: no offset for this tile")
        start = int(offsets[i])
        end = int(offsets[i + 1]) if i + 1 < len(offsets) else int(file_size)
        if end < start or end - start > MAX_TILE_BYTES:
            raise FormatError(f"{where}: tile offsets {start}..{end} are not a tile")
        return start, end - start

    def _describe_fragment(self):
        meta = self.meta
        stamps = timestamps(self.name)
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
            actual = lstat_beneath(self.array.path, os.path.join(self.rel, file_name)).st_size
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


