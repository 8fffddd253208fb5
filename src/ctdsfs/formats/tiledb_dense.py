"""The merged dense view (``dense/``): every fragment of a dense array placed over the
domain, later fragments over earlier ones, as libtiledb reads ``A[:]``.

A mix-in of ``TileDBArray``: it needs the array's schema, fragments and lock, and
keeps the last merged attribute, since a reader usually reads one file to its end.
"""

import math
from collections import OrderedDict

import numpy as np

from ..container import name_problem
from ..errors import BlockError, CtdsfsError, FormatError
from .npy import npy_header
from .tiledb_fragment import LazyFile
from .tiledb_fragment_meta import fields_of, timestamps

MAX_DENSE_BYTES = 256 << 20  # dense/ATTR.npy is built in memory up to this size


class DenseView:
    """dense/ of a dense array (see the module)."""

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
                dtype, tail = field.user_dtype
                files[f"{field.name}.npy"] = ("values", npy_header(
                    dtype.str, tuple(shape) + tail, col_major), cells * field.cell_size)
            if field.nullable:
                files[f"{field.name}.validity.npy"] = \
                    ("validity", npy_header("|u1", tuple(shape), col_major), cells)
            for name, (part, header, size) in files.items():
                if not name_problem(name):
                    entries[name] = LazyFile(
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
            if self._merged_cache is None or self._merged_cache[0] != attr_index:
                try:
                    self._merged_cache = None
                    self._merged_cache = attr_index, self._merged(attr_index)
                except BlockError:
                    raise
                except CtdsfsError as exc:
                    raise BlockError(f"{self.label}: dense view: {exc}",
                                     f"dense view: {exc}") from None
            return self._merged_cache[1][part]

    def _dense_sources(self, attr_index):
        """Where every cell of the domain comes from: an array of the domain's shape holding
        -1 (fill) or the cell's index in the fragments' cells taken one after another, and
        those fragments with their tile counts and the attribute's index among their
        fields. Fragments go in timestamp order, later ones over earlier ones; one that
        another's time range contains is left out."""
        schema = self.schema
        positions = np.full(self._dense_shape(), -1, np.int64)
        sources, base = [], 0
        ranges = {n: timestamps(n) for n in self.fragment_names if timestamps(n)}
        for name in self.fragment_names:
            t = ranges.get(name)
            if t and any(o != t and o[0] <= t[0] and t[1] <= o[1] for o in ranges.values()):
                continue
            frag = self.fragment(name)
            frag.names()  # (listing reads its metadata)
            meta = frag.meta
            if meta is None or not meta.dense or meta.non_empty_domain is None:
                continue
            own = self._own_field(frag, attr_index)
            cells = sum(frag.cell_counts())
            self._place(positions, np.full(cells, -1, np.int64) if own is None else
                        np.arange(base, base + cells, dtype=np.int64),
                        meta.non_empty_domain, schema["dimensions"], ())
            if own is not None:  # (a fragment written without the attribute gives its fill)
                sources.append((frag, len(frag.cell_counts()), own))
                base += cells
        return positions, sources

    def _own_field(self, frag, attr_index):
        """The index of attribute ``attr_index`` (of the newest schema) among the fields
        of ``frag``, written under its own schema (attributes are added and dropped by
        schema evolution: found by name); None if the fragment has no such attribute."""
        want = fields_of(self.schema, False, False)[attr_index]
        for index, field in enumerate(frag.meta.fields):
            if field.kind == "attribute" and field.name == want.name:
                if (field.type, field.cell_val_num, field.nullable) != \
                        (want.type, want.cell_val_num, want.nullable):
                    raise FormatError(f"{frag.label}: {want.name!r} is stored with another "
                                      f"type than the array's schema gives")
                return index
        return None

    def _merged(self, attr_index):
        """The attribute over the whole domain, as libtiledb reads it: {part: bytes}.
        Fixed-sized values and validity in the cell order (what the .npy headers say);
        var-sized cells in row-major order, their offsets (and the end) into the data."""
        schema = self.schema
        field = fields_of(schema, False, False)[attr_index]
        attr = schema["attributes"][attr_index]
        positions, sources = self._dense_sources(attr_index)
        order = "F" if schema["cell_order"] == 1 else "C"
        return self._gather(field, attr["fill"], attr["fill_validity"],
                            positions.ravel(order) + 1, positions.ravel() + 1, sources)

    def _gather(self, field, fill, fill_validity, picks, var_picks, sources):
        """{part: bytes} of ``field`` for the cells ``picks`` (fixed-sized values and
        validity) and ``var_picks`` (var-sized cells): indexes into the fill value (0)
        followed by every cell of ``sources`` (fragment, tile count, the field's index
        in it). Shared by dense/ and sparse/."""
        parts = {}
        if field.nullable:
            validity = [np.array([fill_validity], np.uint8)] + [
                np.frombuffer(frag._tile(own, "validity", i), np.uint8)
                for frag, tiles, own in sources for i in range(tiles)]
            parts["validity"] = np.concatenate(validity)[picks].tobytes()
        if field.var:
            parts["offsets"], parts["data"] = self._merged_var(fill, var_picks, sources)
            return parts
        tail = () if field.cell_val_num == 1 else (field.cell_val_num,)
        if fill is None or len(fill) != field.cell_size:
            fill = bytes(field.cell_size)  # (libtiledb always stores one cell)
        values = [fill] + [frag._tile(own, "data", i)
                           for frag, tiles, own in sources for i in range(tiles)]
        if sum(map(len, values)) > MAX_DENSE_BYTES:
            raise FormatError("the fragments' cells are more than ctdsfs merges in memory")
        values = np.frombuffer(b"".join(values), field.dtype).reshape((-1,) + tail)
        parts["values"] = values[picks].tobytes()
        return parts

    def _merged_var(self, fill, picks, sources):
        """(offsets, data) of var-sized cells: cell k is cell ``picks[k]`` of the fill value
        (0) followed by every source fragment's cells."""
        fill = fill or b""
        sizes, starts, blobs, base = [np.array([len(fill)], np.int64)], \
            [np.zeros(1, np.int64)], [fill], len(fill)
        for frag, tiles, own in sources:
            if not tiles:
                continue
            offsets = np.frombuffer(b"".join(frag._offsets_piece(own, i)
                                             for i in range(tiles)), "<u8").astype(np.int64)
            data = b"".join(frag._tile(own, "var", i) for i in range(tiles))
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
