"""The merged dense view (``dense/``): every fragment of a dense array placed over the
domain, later fragments over earlier ones, as libtiledb reads ``A[:]``.

A mix-in of ``TileDBArray``: it needs the array's schema, fragments and lock, and
keeps the last merged attribute, since a reader usually reads one file to its end.
"""

import math
from collections import OrderedDict

import numpy as np

from ...container import name_problem
from ...errors import BlockError, CtdsfsError, FormatError
from ...io.lazy_files import PiecedFile
from ...io.npy import npy_header
from .fragment import TILES
from .fragment_meta import fields_of, timestamps
from .schema import MAX_TILE_BYTES

MAX_DENSE_BYTES = 256 << 20  # dense/ATTR.npy is merged in memory up to this size


class DenseView:
    """dense/ of a dense array (see the module)."""

    def _dense_folder(self):
        """ATTR.npy, or ATTR.offsets.npy + ATTR.data for var-sized attributes, and
        ATTR.validity.npy for nullable ones: one attribute at a time, served from the
        fragments' tiles where bands of them are the domain's cells in order (see
        ``_dense_bands``), else merged in memory when first read."""
        entries = OrderedDict()
        shape = self._dense_shape()
        if shape is None:
            return entries
        cells = math.prod(shape)
        col_major = self.schema["cell_order"] == 1
        for index, field in enumerate(fields_of(self.schema, False, False)[:len(
                self.schema["attributes"])]):
            too_big = cells * max(8, field.cell_size) > MAX_DENSE_BYTES
            if too_big and (field.var or self._bands_if_readable(index) is None):
                self.problems.append(f"dense/{field.name} not shown: {cells} cells are more "
                                     f"than ctdsfs merges in memory")
                continue
            files = {}
            if field.var:
                files[f"{field.name}.offsets.npy"] = \
                    ("offsets", npy_header("<u8", (cells + 1,), False), (cells + 1) * 8)
                files[f"{field.name}.data"] = ("data", b"", None)
            else:
                dtype, tail = field.user_dtype
                files[f"{field.name}.npy"] = ("values", npy_header(
                    dtype.str, tuple(shape) + tail, col_major), cells * field.cell_size)
            if field.nullable:
                files[f"{field.name}.validity.npy"] = \
                    ("validity", npy_header("|u1", tuple(shape), col_major), cells)
            for name, (part, header, size) in files.items():
                if not name_problem(name):
                    entries[name] = self._dense_file(index, part, header, size)
        return entries

    def _bands_if_readable(self, attr_index):
        """``_dense_bands``, or None where the fragments cannot be read to say (the merge,
        which meets the same fragment when read, is EIO then, saying why)."""
        try:
            return self._dense_bands(attr_index)
        except CtdsfsError:
            return None

    def _dense_file(self, attr_index, part, header, size):
        """The PiecedFile of one part: the fragments' decoded tiles one after another when
        ``_dense_bands`` finds them in cell order (no copy, decoded ahead as a
        fragment's file is), else one piece merged in memory."""
        bands = []

        def layout():
            plan = self._bands_if_readable(attr_index) if part in ("values", "validity") \
                else None
            if plan is None:
                return header, [len(self._merged_part(attr_index, part)) if size is None
                                else size]
            bands.append(plan)
            unit = 1 if part == "validity" else \
                fields_of(self.schema, False, False)[attr_index].cell_size
            return header, [n * unit for _, n in plan]

        def load(i):
            if not bands:
                return self._merged_part(attr_index, part)
            source, _ = bands[0][i]
            if source is None:  # (kept: a band is read a request at a time)
                return TILES.get_or_load((self.path, "dense fill", attr_index, part), self,
                                         lambda: self._fill_band(attr_index, part))
            frag, own, tile = source
            return frag._tile(own, "validity" if part == "validity" else "data", tile)

        def held(i):
            source = bands[0][i][0] if bands else None
            return source is not None and source[0].tile_held(
                source[1], "validity" if part == "validity" else "data", source[2])
        return PiecedFile(layout, load, held)

    def _fill_band(self, attr_index, part):
        """A whole band (one tile's cells) of the attribute's fill value."""
        attr = self.schema["attributes"][attr_index]
        per_tile = math.prod(d["tile_extent"] for d in self.schema["dimensions"])
        if part == "validity":
            return np.full(per_tile, attr["fill_validity"], np.uint8).tobytes()
        size = fields_of(self.schema, False, False)[attr_index].cell_size
        fill = attr["fill"]
        if fill is None or len(fill) != size:
            fill = bytes(size)
        return bytes(fill) * per_tile

    def _dense_bands(self, attr_index):
        """[(source, cells)] for every band of tiles along the slowest dimension of the
        cell order, when every other dimension is one tile: then a band's cells in cell
        order are the domain's next cells. source is (fragment, the attribute's index in
        it, tile index) of the newest fragment covering the band, or None for fill where
        no fragment reaches. None when that does not hold for every band (a fragment
        covering part of a band, or tiles not laid out so): the view is merged then."""
        schema, shape = self.schema, self._dense_shape()
        if shape is None or schema["cell_order"] not in (0, 1):
            return None
        dims = schema["dimensions"]
        lead = len(dims) - 1 if schema["cell_order"] == 1 else 0
        extents = [d["tile_extent"] for d in dims]
        if not all(isinstance(e, int) and e > 0 for e in extents) or any(
                e != n for k, (e, n) in enumerate(zip(extents, shape)) if k != lead):
            return None
        per_tile = math.prod(extents)
        if per_tile * max(8, fields_of(schema, False, False)[attr_index].cell_size) \
                > MAX_TILE_BYTES:
            return None
        low, extent, length = dims[lead]["domain"][0], extents[lead], shape[lead]
        band_count = -(-length // extent)
        sources = [None] * band_count
        decided = [False] * band_count
        for frag, meta in reversed(list(self._placed_fragments())):
            domain = meta.non_empty_domain
            if any(tuple(domain[k]) != tuple(d["domain"]) for k, d in enumerate(dims)
                   if k != lead):
                return None
            lo, hi = domain[lead]
            if not dims[lead]["domain"][0] <= lo <= hi <= dims[lead]["domain"][1]:
                return None
            first, last = (lo - low) // extent, (hi - low) // extent
            own = self._own_field(frag, attr_index)
            if own is not None and len(frag.cell_counts()) != last - first + 1:
                return None
            for band in range(first, last + 1):
                if decided[band]:
                    continue
                start = low + band * extent
                if lo > start or hi < min(start + extent - 1, low + length - 1):
                    return None  # (a part of the band: older fragments show through)
                decided[band] = True
                sources[band] = None if own is None else (frag, own, band - first)
        return [(source, min(extent, length - band * extent) * (per_tile // extent))
                for band, source in enumerate(sources)]

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
        for frag, meta in self._placed_fragments():
            own = self._own_field(frag, attr_index)
            cells = sum(frag.cell_counts())
            self._place(positions, np.full(cells, -1, np.int64) if own is None else
                        np.arange(base, base + cells, dtype=np.int64),
                        meta.non_empty_domain, schema["dimensions"], ())
            if own is not None:  # (a fragment written without the attribute gives its fill)
                sources.append((frag, len(frag.cell_counts()), own))
                base += cells
        return positions, sources

    def _placed_fragments(self):
        """(fragment, its metadata) of every dense fragment the view places, oldest first;
        one that another's time range contains is left out."""
        ranges = {n: timestamps(n) for n in self.fragment_names if timestamps(n)}
        for name in self.fragment_names:
            t = ranges.get(name)
            if t and any(o != t and o[0] <= t[0] and t[1] <= o[1] for o in ranges.values()):
                continue
            meta = self.fragment(name)._load_meta()  # (unreadable: the view cannot be merged)
            if not meta.dense or meta.non_empty_domain is None:
                continue
            yield self.fragment(name), meta

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
