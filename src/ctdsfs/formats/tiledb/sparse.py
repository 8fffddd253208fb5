"""The merged sparse view (``sparse/``): every cell of a sparse array, in the global
order libtiledb reads with ``A.query(order='G')[:]``.

Cells of every fragment (a consolidated one standing for those it contains) are sorted
by space tile (the dimensions' tile extents, in the tile order), then by coordinates
(in the cell order); in Hilbert order by the Hilbert value of the coordinates, then
row-major. Where the schema allows no duplicates, the newest write of a coordinate
wins (per-cell timestamps of consolidated fragments, else the fragment's); deletes
then remove what their conditions say (``tiledb_deletes``). Time travel keeps the
cells written in its range. String coordinates are ordered as signed chars, as
libtiledb orders them. What this cannot do as libtiledb does (updates, Hilbert order
over a string dimension, string coordinates beyond ASCII in several fragments, which
libtiledb merges in an order of its own) is refused in one line (``info`` shows it;
the last, when only inner coordinates show it, makes reads EIO saying so), never
approximated. A mix-in of ``TileDBArray`` beside ``DenseView``, whose gathering it
shares.
"""

from collections import OrderedDict

import numpy as np

from ...container import name_problem
from ...errors import BlockError, CtdsfsError, FormatError
from ...io.lazy_files import PiecedFile
from ...io.npy import npy_header
from .deletes import matches, read_deletes
from .dense import MAX_DENSE_BYTES
from .fragment_meta import fields_of, timestamps
from .hilbert import hilbert_values

HILBERT = 4
# libtiledb orders string coordinates by their bytes taken as signed chars (0x80 to 0xff
# before 0x00): flipping the top bit makes Python's bytes order that one
SIGNED_BYTES = bytes(b ^ 0x80 for b in range(256))
BEYOND_ASCII = ("string coordinates beyond ASCII in several fragments: libtiledb merges "
                "them in an order of its own, not reproduced by ctdsfs")


class SparseView:
    """sparse/ of a sparse array (see the module)."""

    def _sparse_folder(self):
        """DIM.npy and ATTR.npy (var-sized: NAME.offsets.npy + NAME.data; nullable:
        NAME.validity.npy), one entry per cell; merged when first read, a field at a time."""
        entries = OrderedDict()
        if self._sparse_refusal():  # (info and check say why: not_shown())
            return entries
        for index, field in enumerate(self._sparse_fields()):
            files = {}
            if field.var:
                files[f"{field.name}.offsets.npy"] = "offsets"
                files[f"{field.name}.data"] = "data"
            else:
                files[f"{field.name}.npy"] = "values"
            if field.nullable:
                files[f"{field.name}.validity.npy"] = "validity"
            for name, part in files.items():
                if not name_problem(name):
                    entries[name] = PiecedFile(
                        lambda f=index, p=part: self._sparse_layout(f, p),
                        lambda i, f=index, p=part: self._sparse_part(f, p))
        return entries

    def _sparse_fields(self):
        """The dimensions, then the attributes, of the newest schema."""
        fields = fields_of(self.schema, False, False)
        return [f for f in fields if f.kind == "dimension"] + \
            [f for f in fields if f.kind == "attribute"]

    def _sparse_refusal(self):
        schema = self.schema
        strings = [k for k, d in enumerate(schema["dimensions"]) if d["domain"] is None]
        if strings and len(self.fragment_names) > 1 and any(
                not str(bound).isascii()
                for domain in self._readable_domains()
                for k in strings
                for bound in (domain or [[]])[k]):
            return BEYOND_ASCII
        if schema["cell_order"] == HILBERT and any(d["domain"] is None
                                                   for d in schema["dimensions"]):
            return "Hilbert cell order with a string dimension is not merged by ctdsfs"
        commits = self._list("__commits")
        if any(n.endswith(".upd") for n in commits):
            return "the array has updates, which ctdsfs does not apply"
        return None

    def _readable_domains(self):
        """The non-empty domain of every fragment whose metadata can be read (a damaged
        one is EIO where a read needs it, its fragment.json saying why)."""
        for name in self.fragment_names:
            try:
                yield self.fragment(name)._load_meta().non_empty_domain
            except CtdsfsError:
                continue

    def _sparse_layout(self, field_index, part):
        cells = len(self._sparse_order()[0])
        field = self._sparse_fields()[field_index]
        if part == "offsets":
            return npy_header("<u8", (cells + 1,), False), [(cells + 1) * 8]
        if part == "validity":
            return npy_header("|u1", (cells,), False), [cells]
        if part == "values":
            dtype, tail = field.user_dtype
            return npy_header(dtype.str, (cells,) + tail, False), [cells * field.cell_size]
        return b"", [len(self._sparse_part(field_index, part))]

    def _sparse_part(self, field_index, part):
        """One part of the merged field, kept for the last field asked for; a fragment
        that cannot be merged makes the read EIO."""
        key = ("sparse", field_index)
        with self._lock:
            if self._merged_cache is None or self._merged_cache[0] != key:
                try:
                    self._merged_cache = None
                    self._merged_cache = key, self._sparse_merged(field_index)
                except BlockError:
                    raise
                except CtdsfsError as exc:
                    raise BlockError(f"{self.label}: sparse view: {exc}",
                                     f"sparse view: {exc}") from None
            return self._merged_cache[1][part]

    def _sparse_fragments(self):
        """The sparse fragments that take part, oldest first: one that another's time range
        contains (consolidated into it) is left out."""
        ranges = {n: timestamps(n) for n in self.fragment_names if timestamps(n)}
        chosen = []
        for name in self.fragment_names:
            t = ranges.get(name)
            if t and any(o != t and o[0] <= t[0] and t[1] <= o[1] for o in ranges.values()):
                continue
            frag = self.fragment(name)
            frag._load_meta()
            if not frag.meta.dense:
                chosen.append(frag)
        return chosen

    def _sparse_order(self):
        """(picks, fragments): every output cell as its index in the fragments' cells taken
        one after another; worked out once."""
        with self._lock:
            if self._sparse_cache is None:
                self._sparse_cache = self._global_order()
            return self._sparse_cache

    def _field_cells(self, frag, field):
        """All cells of ``field`` (found by name) of a fragment: an array of values, or
        for a var-sized field a list of bytes."""
        own = self._own_field_named(frag, field)
        tiles = len(frag.cell_counts())
        if field.var:
            offsets = np.frombuffer(b"".join(frag._offsets_piece(own, i) for i in range(tiles)),
                                    "<u8").astype(np.int64) if tiles else np.zeros(1, np.int64)
            data = b"".join(frag._tile(own, "var", i) for i in range(tiles))
            if np.any(np.diff(offsets) < 0) or offsets[-1] != len(data):
                raise FormatError(f"{frag.label}: cell offsets out of order or past the data")
            return [data[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        return np.frombuffer(b"".join(frag._tile(own, "data", i) for i in range(tiles)),
                             field.dtype)

    def _global_order(self):
        schema = self.schema
        dims = [f for f in self._sparse_fields() if f.kind == "dimension"]
        fragments = self._sparse_fragments()
        coords = [[] for _ in dims]
        stamps, total = [], 0
        for order, frag in enumerate(fragments):
            cells = sum(frag.cell_counts())
            total += cells
            if total * 8 * (len(dims) + 2) > MAX_DENSE_BYTES:
                raise FormatError(f"{total} cells are more than ctdsfs merges in memory")
            for k, dim in enumerate(dims):
                values = self._field_cells(frag, dim)
                if len(values) != cells:
                    raise FormatError(f"{frag.label}: {len(values)} coordinates of "
                                      f"{dim.name!r} for {cells} cells")
                coords[k].append(values)
            cell_stamps = None
            if frag.meta.has_timestamps:
                cell_stamps = self._extra_cells(frag, "__timestamps")
            t = timestamps(frag.name) or (0, 0)
            stamps.append(np.stack([cell_stamps.astype(np.int64) if cell_stamps is not None
                                    else np.full(cells, t[1], np.int64),
                                    np.full(cells, order, np.int64)]))
        if not fragments:
            return np.zeros(0, np.int64), fragments
        stamps = np.concatenate(stamps, axis=1)
        travelled = np.ones(stamps.shape[1], bool)
        if self.timestamp is not None:  # (a consolidated fragment's cells by their own)
            travelled = (stamps[0] >= self.timestamp[0]) & (stamps[0] <= self.timestamp[1])
        cell_keys, tile_keys = [], []
        for k, (dim, d) in enumerate(zip(dims, schema["dimensions"])):
            if dim.var:
                words = [w.translate(SIGNED_BYTES) for part in coords[k] for w in part]
                if len(fragments) > 1 and not all(w.isascii() for part in coords[k]
                                                  for w in part):
                    raise FormatError(BEYOND_ASCII)
                rank = np.unique(np.array(words, dtype=object), return_inverse=True)[1] \
                    if words else np.zeros(0, np.int64)
                cell_keys.append(rank.astype(np.int64))
                tile_keys.append(np.zeros(len(words), np.int64))
                continue
            values = np.concatenate(coords[k])
            cell_keys.append(values)
            tile_keys.append(space_tile(values, d["domain"][0], d["tile_extent"]))
        if schema["cell_order"] == HILBERT:  # (no space tiles: the Hilbert value first)
            tile_keys = [hilbert_values(cell_keys, [d["domain"] for d in schema["dimensions"]])]
        if schema["cell_order"] == 1:
            cell_keys = cell_keys[::-1]
        if schema["tile_order"] == 1 and schema["cell_order"] != HILBERT:
            tile_keys = tile_keys[::-1]
        # (np.lexsort: the last key sorts first; the newest write of a cell comes last)
        keys = [stamps[1], stamps[0]] + cell_keys[::-1] + tile_keys[::-1]
        chosen = np.flatnonzero(travelled)
        order = chosen[np.lexsort([key[chosen] for key in keys])]
        deleted = self._deleted(fragments, order, stamps)
        if not schema["allows_dups"] and len(order):
            same = np.ones(len(order) - 1, bool)
            for key in cell_keys:
                ordered = key[order]
                same &= ordered[1:] == ordered[:-1]
            keep = np.append(~same, True)  # the last (newest) of each run of one coordinate
            order, deleted = order[keep], deleted[keep]
        return order[~deleted].astype(np.int64), fragments

    def _deleted(self, fragments, order, stamps):
        """Whether each cell of ``order`` a delete removes: the cell was written at or before
        the delete, and fails the condition stored (libtiledb stores the negation of the
        condition the user gave: the cells to keep). A fragment consolidated with deletes
        keeps, per cell, when a delete it processed removed it."""
        deleted = np.zeros(len(order), bool)
        if not len(order):
            return deleted
        written, source = stamps[0][order], stamps[1][order]
        bases = np.cumsum([0] + [sum(f.cell_counts()) for f in fragments])
        last = self.timestamp[1] if self.timestamp else (1 << 64) - 2
        processed = {}
        for k, frag in enumerate(fragments):
            if frag.meta.has_delete_meta:
                mine = source == k
                when = self._extra_cells(frag, "__delete_timestamps")
                deleted[mine] = when[order[mine] - bases[k]] <= last
                processed[k] = set(frag.meta.processed_conditions())
        deletes = read_deletes(self, self._list("__commits"))
        fields = {f.name: f for f in self._sparse_fields()}
        found = {}

        def cells(name):
            if name not in found:
                if name not in fields:
                    raise FormatError(f"a delete condition names {name!r}, no field of the "
                                      f"array")
                found[name] = self._cells_for_deletes(fragments, fields[name], order)
            return found[name]

        for name, when, condition in deletes:
            applies = written <= when
            for k, names in processed.items():
                if f"__commits/{name}" in names:
                    applies &= source != k
            if applies.any():
                deleted |= applies & ~matches(condition, cells, len(order))
        return deleted

    def _extra_cells(self, frag, name):
        """A uint64 field of a consolidated fragment (``__timestamps`` and the like)."""
        own = next(i for i, f in enumerate(frag.meta.fields) if f.name == name)
        data = b"".join(frag._tile(own, "data", i) for i in range(len(frag.cell_counts())))
        if len(data) != 8 * sum(frag.cell_counts()):
            raise FormatError(f"{frag.label}: {len(data)} bytes of {name} for "
                              f"{sum(frag.cell_counts())} cells")
        return np.frombuffer(data, "<u8")

    def _cells_for_deletes(self, fragments, field, order):
        """(field, values, validity) of ``field`` for the cells of ``order``."""
        values, validity = [], []
        for frag in fragments:
            own = self._own_field_named(frag, field)
            if own is None:
                raise FormatError(f"{frag.label}: written without {field.name!r}, which a "
                                  f"delete condition compares (not applied by ctdsfs)")
            part = self._field_cells(frag, field)
            values.append(np.array(part, dtype=object) if field.var else part)
            if field.nullable:
                validity += [np.frombuffer(frag._tile(own, "validity", i), np.uint8)
                             for i in range(len(frag.cell_counts()))]
            cells = sum(frag.cell_counts())
            if len(part) != cells or field.nullable and \
                    sum(map(len, validity)) != sum(len(v) for v in values):
                raise FormatError(f"{frag.label}: {len(part)} values of {field.name!r} for "
                                  f"{cells} cells")
        values = np.concatenate(values)[order]
        return field, values, np.concatenate(validity)[order] if field.nullable else None

    def _own_field_named(self, frag, want):
        for index, field in enumerate(frag.meta.fields):
            if field.kind == want.kind and field.name == want.name:
                return index
        return None

    def _sparse_merged(self, field_index):
        field = self._sparse_fields()[field_index]
        picks, fragments = self._sparse_order()
        remap, sources, base = [], [], 0
        for frag in fragments:
            cells = sum(frag.cell_counts())
            own = self._own_field_named(frag, field)
            if own is None:  # (written before the attribute was added: its fill)
                remap.append(np.full(cells, -1, np.int64))
                continue
            remap.append(np.arange(base, base + cells, dtype=np.int64))
            sources.append((frag, len(frag.cell_counts()), own))
            base += cells
        remap = np.concatenate(remap) if remap else np.zeros(0, np.int64)
        picks = remap[picks] + 1
        attr = next((a for a in self.schema["attributes"] if a["name"] == field.name), None)
        fill = attr["fill"] if attr and field.kind == "attribute" else None
        fill_validity = attr["fill_validity"] if attr else 1
        return self._gather(field, fill, fill_validity, picks, picks, sources)


def space_tile(values, low, extent):
    """The space tile of each coordinate along one dimension, as libtiledb computes it:
    integers as (v - low) // extent without overflow (an int8 dimension's 80 - -100 is
    180), floats in their own precision."""
    if not extent:
        return np.zeros(len(values), np.int64)
    if values.dtype.kind == "f":
        kind = values.dtype.type
        return np.floor((values - kind(low)) / kind(extent)).astype(np.int64)
    if values.dtype == np.uint64:
        return ((values - np.uint64(low)) // np.uint64(extent)).astype(np.int64)
    return (values.astype(np.int64) - low) // extent
