"""The tiled storage managers: TiledColumnStMan, TiledShapeStMan, TiledCellStMan,
TiledDataStMan.

Facts used (tables/DataMan/TiledStMan.cc, TSMCube.cc, TSMFile.cc, Tiled*StMan.cc):
the header ``table.f<N>`` is big-endian AipsIO: the manager's object (TiledColumnStMan:
default tile shape first; TiledCellStMan: tile shape first; TiledShapeStMan: after the
base part its default tile shape and three row maps), holding a ``TiledStMan`` part
(endian flag from version 2, 64-bit counts in version 3): row and column counts, the
column types, the hypercolumn name, the number of dimensions, the ``_TSM<k>`` files and
the hypercubes (version, value record, extensible flag, rank, cube shape, tile shape,
file number, offset in the file). A cube's tiles are numbered in Fortran order of the
tile grid and lie at ``offset + n * tile_bytes`` of ``table.f<N>_TSM<file>``; a tile
holds each data column's pixels back to back (Fortran order; Bools as bits), columns
ordered by descending pixel size (stable over the hypercolumn's data columns).
TiledColumnStMan keeps one cube whose last axis is the row; TiledShapeStMan maps row
intervals to (cube, position) (cube 0: no value); TiledCellStMan keeps a cube per row.
TiledDataStMan (object version 1 or 2) follows its base part with the number of rows
its cubes hold (Int, Int64 from version 2 or a version 3 base) and three maps, one entry
per added or extended stretch of a cube: its first row (Block of Int64; version 1: a
count, then Block of uInt), its cube, its first position along the cube's last axis.
Its cubes may have more axes than a cell plus one: the axes after a cell's (as many as
the hypercolumn's first data column has) all walk the rows, the first fastest.
"""

import math

import numpy as np

from ...errors import FormatError
from . import tabledat
from .base import (
    NUMERIC_TYPES,
    TP_BOOL,
    EndianAipsReader,
    checked_count,
    disk_dtype,
    read_aligned,
    read_exact,
    read_pieces,
)
from .tsm_axes import HypercubeAxisValues

MAX_NDIM = 32
MAX_HEADER = 256 << 20
MAX_CUBES = 1 << 24
MAX_TILE_BYTES = 1 << 31
MERGE_GAP = 4096  # bytes between two tiles' wanted parts read rather than a read apart
TILED_MANAGERS = ("TiledColumnStMan", "TiledShapeStMan", "TiledCellStMan", "TiledDataStMan")


def _iposition(r):
    version = r.start("IPosition")
    n = checked_count(r.u32(), MAX_NDIM, "IPosition rank")
    values = [r.i32() if version == 1 else r.i64() for _ in range(n)]
    r.end()
    return values


class Cube:
    def __init__(self, r, v3):
        version = r.u32()
        start = r.pos
        r.skip_object()  # value record: decoded when read (see casacore_tsm_axes)
        self.record_span = (start, r.pos)  # where it lies in the header
        r.bool()  # extensible
        self.ndim = checked_count(r.u32(), MAX_NDIM, "hypercube rank")
        self.shape, self.tile = _iposition(r), _iposition(r)
        self.file = r.i32()
        self.offset = r.u32() if version == 1 else r.i64()
        if len(self.shape) != self.ndim or len(self.tile) != self.ndim or \
                min(self.shape, default=0) < 0 or min(self.tile, default=1) < 1 or \
                self.offset < 0:
            raise FormatError(f"hypercube shape {self.shape} / tile shape {self.tile} / "
                              f"offset {self.offset} is invalid")
        self.grid = [-(-n // t) for n, t in zip(self.shape, self.tile)]
        self.tile_pixels = int(np.prod(self.tile, dtype=np.float64))
        self.n_tiles = int(np.prod(self.grid, dtype=np.float64))


class TiledReader:
    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.big_endian, self.nrow = source, table.big_endian, table.nrow
        self.name = f"table.f{seqnr}"
        size = source.entry_size(self.name)
        if size > MAX_HEADER:
            raise FormatError(f"{self.name}: header of {size} bytes is too large")
        r = EndianAipsReader(read_exact(source, self.name, 0, size, "header"), True)
        version = r.start(outer=True)
        self.kind = manager = r.last_type
        if manager not in TILED_MANAGERS:
            raise FormatError(f"{self.name}: {manager[:40]!r} is not a tiled manager decoded "
                              "here")
        if manager in ("TiledColumnStMan", "TiledCellStMan"):
            _iposition(r)
        base_version = self._read_base(r, columns)
        self.cell_ndim = None  # TiledDataStMan: a cell's rank (the cubes' other axes: rows)
        if manager == "TiledShapeStMan":
            _iposition(r)
            used = r.u32()
            maps = [r.block("u4").astype(np.int64) for _ in range(3)]
            if any(len(m) < used for m in maps):
                raise FormatError(f"{self.name}: row maps shorter than their {used} entries")
            self.row_map, self.cube_map, self.pos_map = (m[:used] for m in maps)
            if (np.diff(self.row_map) <= 0).any() or (self.cube_map >= len(self.cubes)).any():
                raise FormatError(f"{self.name}: row maps are inconsistent")
        if manager == "TiledDataStMan":
            self._read_data_maps(r, version, base_version)
        r.end()
        self._order_columns(table, columns)
        self.axis_values = HypercubeAxisValues(self, table, columns)  # id, coordinate columns

    def _read_base(self, r, columns):
        version = r.start("TiledStMan")
        if version >= 2 and r.bool() != self.big_endian:
            raise FormatError(f"{self.name}: endian flag differs from table.dat's")
        v3 = version >= 3
        r.u32()  # sequence number
        nrow = r.u64() if v3 else r.u32()
        ncol = r.u32()
        if nrow != self.nrow or ncol != len(columns):
            raise FormatError(f"{self.name}: {nrow} rows / {ncol} columns, table.dat has "
                              f"{self.nrow} / {len(columns)}")
        types = [r.i32() for _ in range(ncol)]
        if types != [c.data_type for c in columns]:
            raise FormatError(f"{self.name}: column types differ from table.dat's")
        self.hypercolumn = r.string()
        r.u64() if v3 else r.u32()  # cache size
        r.u32()  # rank
        self.files = {}
        for k in range(checked_count(r.u64() if v3 else r.u32(), MAX_CUBES, "file count")):
            if r.bool():
                file_version = r.u32()
                number = r.u32()
                r.u32() if file_version == 1 else r.i64()  # length
                self.files[number] = f"{self.name}_TSM{number}"
        n_cubes = checked_count(r.u64() if v3 else r.u32(), MAX_CUBES, "hypercube count")
        if n_cubes > (r.limit - r.pos) // 16:
            raise FormatError(f"{self.name}: {n_cubes} hypercubes cannot fit the header")
        self.cubes = [Cube(r, v3) for _ in range(n_cubes)]
        r.end()
        return version

    def _read_data_maps(self, r, version, base_version):
        """TiledDataStMan's rows in its cubes: ``rows_held`` and, per stretch, its first
        row (``row_map``, ascending from 0), cube and first position on the last axis."""
        self.rows_held = r.u32() if version == 1 and base_version < 3 else r.u64()
        if version == 1:
            r.u32()  # entries used (casacore reads the whole Blocks)
        maps = [r.block("u4" if version == 1 or k else "u8").astype(np.int64)
                for k in range(3)]
        if len({len(m) for m in maps}) != 1 or self.rows_held > self.nrow:
            raise FormatError(f"{self.name}: row maps of {[len(m) for m in maps]} entries "
                              f"for {self.rows_held} of {self.nrow} rows")
        self.row_map, self.cube_map, self.pos_map = maps
        if len(self.row_map) and (self.row_map[0] != 0 or (np.diff(self.row_map) <= 0).any()
                                  or self.row_map[-1] >= self.rows_held
                                  or (self.cube_map >= len(self.cubes)).any()):
            raise FormatError(f"{self.name}: row maps are inconsistent")
        if not len(self.row_map) and self.rows_held:
            raise FormatError(f"{self.name}: {self.rows_held} rows without a row map")

    def _order_columns(self, table, columns):
        """Each data column's byte offset and length in a tile of every cube."""
        hyper = tabledat.record_dict(table.dat.desc.private_keywords).get(
            "Hypercolumn_" + self.hypercolumn)
        names = [c.name for c in columns]
        if isinstance(hyper, dict) and isinstance(hyper.get("data"), dict):
            names = [n for n in hyper["data"]["values"] if n in names]
        by_name = {c.name: c for c in columns}
        pixel = {n: 0 if by_name[n].data_type == TP_BOOL else
                 NUMERIC_TYPES[by_name[n].data_type][1] for n in names}
        self.data_columns = sorted(names, key=lambda n: -pixel[n])
        self.pixel = pixel
        self.disk_dtypes = {n: disk_dtype(by_name[n].data_type, self.big_endian)
                            for n in names if pixel[n]}
        if self.kind == "TiledDataStMan":
            self.cell_ndim = by_name[names[0]].ndim if names else 0  # as casacore does
            if self.cell_ndim < 1 or any(c.ndim <= self.cell_ndim for c in self.cubes):
                raise FormatError(f"{self.name}: cells of rank {self.cell_ndim} in "
                                  f"hypercubes of rank {[c.ndim for c in self.cubes]}")
        for cube in self.cubes:
            cube.layout, at = {}, 0
            for n in self.data_columns:
                length = (cube.tile_pixels + 7) // 8 if pixel[n] == 0 else \
                    cube.tile_pixels * pixel[n]
                cube.layout[n] = (at, length)
                at += length
            cube.tile_bytes = at
            if cube.n_tiles and (at > MAX_TILE_BYTES or at == 0):
                raise FormatError(f"{self.name}: tiles of {at} bytes")
            if cube.file < 0:  # a cube without storage (TiledShapeStMan's cube 0)
                continue
            if cube.n_tiles and cube.file not in self.files:
                raise FormatError(f"{self.name}: hypercube in unknown file {cube.file}")
            if cube.n_tiles:
                end = cube.offset + cube.n_tiles * at
                size = self.source.entry_size(self.files[cube.file])
                if end > size:
                    raise FormatError(f"{self.files[cube.file]}: hypercube {cube.shape} with "
                                      f"tiles {cube.tile} needs {end} bytes, file has {size}")

    # ------------------------------------------------------------ reading

    def _slab(self, col, cube, first, stop, places=False):
        """Positions ``first..stop`` along the last axis of ``cube`` (all of a cube without a
        row axis when ``first`` is None), as a C-order array (positions, ...reversed axes):
        the values, or with ``places`` where each lies in the file (its first byte, or for
        a Bool column its bit: byte * 8 + bit, lowest bit first), a write's map."""
        if col.name not in cube.layout:
            raise FormatError(f"{self.name}: {col.name} is not a data column of its cube")
        if first is None:
            first, stop = 0, cube.shape[-1]
        dtype = np.int64 if places else col.dtype
        if cube.n_tiles == 0 or first == stop:
            if places:
                raise FormatError(f"{self.name}: no stored cells at positions {first}..{stop}")
            return np.zeros([stop - first] + cube.shape[-2::-1], dtype)
        runs = _tile_runs(cube.tile[-1], first, stop)
        grid, tile = cube.grid[-2::-1], cube.tile[-2::-1]
        whole = [g * t for g, t in zip(grid, tile)]
        cut = (slice(None),) + tuple(slice(0, n) for n in cube.shape[-2::-1])
        if len(runs) == 1:  # decoded in place where the tiles' order allows (no copy)
            values = self._tile_items(col, cube, *runs[0], places)
            full = values.reshape([stop - first] + whole)
            return np.ascontiguousarray(full[cut], dtype=dtype)
        out, end = np.empty([stop - first] + cube.shape[-2::-1], dtype), stop - first
        for t0, t1, lo, hi in reversed(runs):  # backwards: see _read_tiles
            values = self._tile_items(col, cube, t0, t1, lo, hi, places)
            part = out[end - (t1 - t0) * (hi - lo):end]
            end -= len(part)
            if whole == list(part.shape[1:]):  # no edge tiles to cut: one copy
                part.reshape([t1 - t0, hi - lo] + [n for p in zip(grid, tile) for n in p])[
                    ...] = values
            else:
                part[...] = values.reshape([len(part)] + whole)[cut]
        return out

    def _tile_items(self, col, cube, t0, t1, lo, hi, places=False):
        """Positions ``lo..hi`` inside each tile of the tile rows ``t0..t1`` (along the last
        axis), the cube's other axes whole: an array (tile row, position, then each other
        axis's tile index beside its pixel index, slowest axis first) of the values, or
        with ``places`` of their places in the file (see _slab)."""
        nd, rows = cube.ndim, hi - lo
        inner = cube.tile_pixels // cube.tile[-1]  # a position's pixels in one tile
        pixel = self.pixel[col.name]
        if pixel == 0:  # Bools as bits: the whole bytes around the positions' bits
            lo_byte, hi_byte = lo * inner // 8, -(-hi * inner // 8)
            first_bit = lo * inner - 8 * lo_byte
            if places:
                bytes_at = self._tile_places(col, cube, t0, t1, lo_byte, hi_byte)
                bits = (bytes_at[:, :, None] * 8 + np.arange(8)).reshape(len(bytes_at), -1)
            else:
                tiles = self._read_tiles(col, cube, t0, t1, lo_byte, hi_byte)
                bits = np.unpackbits(tiles, axis=1, bitorder="little").view(bool)
            values = bits[:, first_bit:first_bit + rows * inner]
        elif places:
            values = self._tile_places(col, cube, t0, t1, lo * inner * pixel,
                                       hi * inner * pixel)[:, ::pixel]
        else:
            tiles = self._read_tiles(col, cube, t0, t1, lo * inner * pixel, hi * inner * pixel)
            values = np.ascontiguousarray(tiles).reshape(-1).view(self.disk_dtypes[col.name])
        values = values.reshape([t1 - t0] + cube.grid[-2::-1] + [rows] + cube.tile[-2::-1])
        return values.transpose([0, nd] + [i for d in range(1, nd) for i in (d, nd + d)])

    def _tile_rows(self, col, cube, t0, t1):
        """(file, where ``col``'s part of the first tile of tile row ``t0`` begins, the
        tile count of tile rows ``t0..t1``)."""
        across = cube.n_tiles // cube.grid[-1]
        return (self.files[cube.file], cube.offset + t0 * across * cube.tile_bytes
                + cube.layout[col.name][0], (t1 - t0) * across)

    def _tile_places(self, col, cube, t0, t1, lo_byte, hi_byte):
        """Where the bytes ``_read_tiles`` reads lie in the file: (tiles, bytes) offsets."""
        _, start, count = self._tile_rows(col, cube, t0, t1)
        return (start + lo_byte + np.arange(count, dtype=np.int64)[:, None] * cube.tile_bytes
                + np.arange(hi_byte - lo_byte, dtype=np.int64))

    def _read_tiles(self, col, cube, t0, t1, lo_byte, hi_byte):
        """Bytes ``lo_byte..hi_byte`` of ``col``'s part of every tile in the tile rows
        ``t0..t1``: a ``uint8`` array, one line per tile. The positions of a tile row lie
        together in each of its tiles (the last axis is a tile's slowest), so only those
        bytes are read: in one read across the tiles when they fill them or the gaps
        between are under MERGE_GAP bytes, else one read per tile. Reads of one range go
        from its end back to its start (see read_pieces), and a remote store fetches
        chunks ahead past the range (a reader going through a column reads whole tile
        rows, in one read per block, and is still read ahead for)."""
        file, start, count = self._tile_rows(col, cube, t0, t1)
        length = hi_byte - lo_byte
        if length == cube.tile_bytes or count == 1 or cube.tile_bytes - length <= MERGE_GAP:
            span = (count - 1) * cube.tile_bytes + length
            raw = read_aligned(self.source, file, start + lo_byte, span, "tiles")
            if length == cube.tile_bytes:
                return raw.reshape(count, length)
            return np.lib.stride_tricks.as_strided(raw, (count, length),
                                                   (cube.tile_bytes, 1), writeable=False)
        return read_pieces(self.source, file, start + lo_byte, cube.tile_bytes, count, length,
                           "tiles")

    def _pieces(self, start, stop):
        """(cube index or None, first row of the cube, row count) per interval of
        ``start..stop``; a cube's rows are its positions along the axes after a cell's
        (the last one only, but in TiledDataStMan), the first axis fastest."""
        if self.kind == "TiledColumnStMan":
            yield (0, start, stop - start) if self.cubes else (None, 0, stop - start)
            return
        if self.kind == "TiledCellStMan":
            for row in range(start, stop):
                yield row, None, 1
            return
        if self.kind == "TiledDataStMan":
            yield from self._data_pieces(start, stop)
            return
        i = int(np.searchsorted(self.row_map, start))
        while start < stop:
            if i >= len(self.row_map):
                yield None, 0, stop - start
                return
            last = int(self.row_map[i])
            end = min(stop, last + 1)
            cube = int(self.cube_map[i])
            pos = int(self.pos_map[i]) - (last - start)
            yield (cube if cube else None), pos, end - start
            start, i = end, i + 1

    def _data_pieces(self, start, stop):
        """TiledDataStMan's ``_pieces``: rows past its cubes' have no cell (casacore
        refuses to read them)."""
        i = int(np.searchsorted(self.row_map, start, side="right")) - 1
        while start < stop:
            if start >= self.rows_held:
                yield None, 0, stop - start
                return
            first = int(self.row_map[i])
            end = min(stop, int(self.row_map[i + 1]) if i + 1 < len(self.row_map)
                      else self.rows_held)
            cube = int(self.cube_map[i])
            per_position = self._rows_per_position(self.cubes[cube])
            yield cube, int(self.pos_map[i]) * per_position + start - first, end - start
            start, i = end, i + 1

    def _cell_axes(self, cube):
        return self.cell_ndim if self.kind == "TiledDataStMan" else cube.ndim - 1

    def _rows_per_position(self, cube):
        """Rows at one position of the cube's last axis (1 but in TiledDataStMan)."""
        return math.prod(cube.shape[self._cell_axes(cube):-1])

    def _row_slab(self, slab, cube, first, n):
        """Rows ``first..first + n`` of a cube, as (rows, ...reversed cell axes), from the
        ``slab`` (a ``_slab`` result, values or places) of the positions on the last
        axis that hold them."""
        per_position = self._rows_per_position(cube)
        if per_position == 1:
            return slab
        cell = slab.shape[slab.ndim - self._cell_axes(cube):]
        skip = first - first // per_position * per_position
        return slab.reshape((len(slab) * per_position,) + cell)[skip:skip + n]

    def _positions(self, cube, first, n):
        """The positions on the cube's last axis that hold rows ``first..first + n``."""
        per_position = self._rows_per_position(cube)
        if first < 0 or first + n > per_position * cube.shape[-1]:
            raise FormatError(f"{self.name}: rows map to positions {first}..{first + n} of "
                              f"a hypercube of {per_position * cube.shape[-1]}")
        return first // per_position, -(-(first + n) // per_position)

    def uniform_shape(self, col):
        """The one cell shape (Python order) of every row, or None, from the cubes alone."""
        if self.axis_values.holds(col):
            return self.axis_values.uniform_shape(col)
        shapes = set()
        for cube_nr, pos, n in self._pieces(0, self.nrow):
            if cube_nr is None or self.cubes[cube_nr].file < 0:
                return None
            cube = self.cubes[cube_nr]
            shapes.add(tuple(cube.shape[::-1]) if pos is None else
                       tuple(cube.shape[:self._cell_axes(cube)][::-1]))
            if len(shapes) > 1:
                return None
        return shapes.pop() if shapes else col.cell_shape

    def read(self, col, start, stop):
        if self.axis_values.holds(col):
            return self.axis_values.read(col, start, stop)
        if self.kind == "TiledCellStMan" and len(self.cubes) != self.nrow:
            raise FormatError(f"{self.name}: {len(self.cubes)} cells for {self.nrow} rows")
        arrays = []
        for cube_nr, pos, n in self._pieces(start, stop):
            if cube_nr is None:
                arrays.append((None, n))
                continue
            cube = self.cubes[cube_nr]
            if cube.file < 0:
                arrays.append((None, n))
                continue
            if pos is None:
                if not cube.ndim:
                    raise FormatError(f"{self.name}: a cell hypercube of rank 0")
                arrays.append((self._slab(col, cube, None, None)[None], 1))
                continue
            slab = self._slab(col, cube, *self._positions(cube, pos, n))
            arrays.append((self._row_slab(slab, cube, pos, n), n))
        shapes = {a.shape[1:] for a, _ in arrays if a is not None}
        if all(a is not None for a, _ in arrays) and len(shapes) <= 1:
            if not arrays:
                return np.zeros((0,) + tuple(col.cell_shape or ()), col.dtype)
            return np.concatenate([a for a, _ in arrays]) if len(arrays) > 1 else arrays[0][0]
        cells = []
        for a, n in arrays:
            if a is None:
                cells.extend([None] * n)
            else:
                cells.extend((a.shape[1:], a[i].reshape(-1)) for i in range(n))
        return cells

    def places(self, col, start, stop):
        """Where the cells of rows ``start..stop`` lie: [(file, places)], each ``places`` of
        shape (rows, *cell_shape) (see _slab), for consecutive rows; FormatError when
        a row has no stored cell (an undefined cell, a cube without storage)."""
        if self.axis_values.holds(col):
            raise FormatError(f"{self.name}: {col.name}'s values are in the hypercubes' "
                              "records, not in tiles")
        out = []
        for cube_nr, pos, n in self._pieces(start, stop):
            cube = None if cube_nr is None else self.cubes[cube_nr]
            if cube is None or cube.file < 0 or cube.n_tiles == 0:
                raise FormatError(f"{self.name}: rows {start}..{stop} hold undefined cells")
            file = self.files[cube.file]
            if pos is None:
                out.append((file, self._slab(col, cube, None, None, places=True)[None]))
                continue
            places = self._slab(col, cube, *self._positions(cube, pos, n), places=True)
            out.append((file, self._row_slab(places, cube, pos, n)))
        return out


def _tile_runs(per_tile, first, stop):
    """``(t0, t1, lo, hi)``: positions ``first..stop`` of a cube's last axis as runs of tile
    rows ``t0..t1`` each holding positions ``lo..hi`` of its tiles: a partial first tile
    row, the whole ones together, a partial last one."""
    t0, t1 = first // per_tile, -(-stop // per_tile)
    lo, hi = first - t0 * per_tile, stop - (t1 - 1) * per_tile
    if t1 - t0 == 1:
        return [(t0, t1, lo, hi)]
    head, tail = t0 + (lo > 0), t1 - (hi < per_tile)
    return ([(t0, t0 + 1, lo, per_tile)] if lo else []) + \
        ([(head, tail, 0, per_tile)] if tail > head else []) + \
        ([(t1 - 1, t1, 0, hi)] if hi < per_tile else [])
