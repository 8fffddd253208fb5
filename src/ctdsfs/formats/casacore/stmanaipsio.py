"""StManAipsIO: the whole column set in one big-endian AipsIO file ``table.f<N>``.

Facts used (tables/DataMan/StManAipsIO.cc, StArrAipsIO.cc, StIndArrAIO.cc, casa/IO/
TypeIO.cc): ``StManAipsIO`` (version > 1: its name), sequence number, unique number,
row count, column count and types, then per column a ``StManColumnAipsIO`` object
(wrapped in ``StManColumnArrayAipsIO`` for direct arrays, in
``StManColumnIndArrayAipsIO`` with a type and file number for indirect ones): the row
count, then chunks of ``uInt`` count, ``uInt`` count again and the values: numbers
big-endian, Bools as bits (per chunk; per cell for arrays), Strings as ``uInt`` length
and characters, indirect arrays as a ``uInt`` offset (``2**31 + 1``: an Int64 follows)
into the array file ``table.f<N>i<k>``. The file has no index, so it is parsed whole
once (it is meant for small tables); row ranges are then cut from memory.
"""

import numpy as np

from ...errors import FormatError
from .arrayfile import ArrayFile
from .base import (
    NUMERIC_TYPES,
    TP_BOOL,
    TP_STRING,
    EndianAipsReader,
    checked_count,
    disk_dtype,
    read_exact,
    unpack_bools,
)

MAX_FILE = 1 << 30
WIDE_OFFSET = 2 ** 31 + 1


class StManAipsIOReader:
    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.name = source, f"table.f{seqnr}"
        size = source.entry_size(self.name)
        if size > MAX_FILE:
            raise FormatError(f"{self.name}: {size} bytes is more than this reader parses")
        r = EndianAipsReader(read_exact(source, self.name, 0, size, "file"), True)
        version = r.start("StManAipsIO", outer=True)
        if version > 1:
            r.string()
        r.u32(), r.u32()  # sequence number, unique number
        nrow, ncol = r.u32(), r.u32()
        if nrow != table.nrow or ncol != len(columns):
            raise FormatError(f"{self.name}: {nrow} rows / {ncol} columns, table.dat has "
                              f"{table.nrow} / {len(columns)}")
        if [r.i32() for _ in range(ncol)] != [c.data_type for c in columns]:
            raise FormatError(f"{self.name}: column types differ from table.dat's")
        self.values = {}
        for col in columns:
            self.values[col.name] = self._column(r, col, nrow, seqnr)
        r.end()

    def _column(self, r, col, nrow, seqnr):
        if not col.is_array:
            return self._cells(r, col, nrow, lambda n, v: self._scalars(r, col, n))
        if col.direct:
            r.start("StManColumnArrayAipsIO")
            if col.cell_shape is None:
                raise FormatError(f"{self.name}: direct array {col.name} has no fixed shape")
            values = self._cells(r, col, nrow, lambda n, v: self._direct(r, col, n, v))
            r.end()
            return values
        version = r.start("StManColumnIndArrayAipsIO")
        r.i32()
        file_nr = r.u32()
        offsets = self._cells(r, col, nrow, lambda n, v: self._offsets(r, n))
        r.end()
        if not offsets.any():
            return [None] * nrow
        # one array file for the manager (version > 1), else one per column; big-endian
        arrays = ArrayFile(self.source, f"{self.name}i" + ("" if version > 1 else
                                                           str(file_nr)), True)
        return [None if off == 0 else arrays.array_at(int(off), col.data_type)
                for off in offsets.tolist()]

    def _cells(self, r, col, nrow, chunk_reader):
        version = r.start("StManColumnAipsIO")
        if r.u32() != nrow:
            raise FormatError(f"{self.name}: column {col.name} holds another row count")
        parts, done = [], 0
        while done < nrow:
            n = r.u32() or nrow - done
            if n > nrow - done:
                raise FormatError(f"{self.name}: column {col.name} chunk of {n} rows")
            parts.append(chunk_reader(n, version))
            done += n
        r.end()
        if parts and isinstance(parts[0], np.ndarray):
            return np.concatenate(parts)
        return [v for p in parts for v in p]

    def _scalars(self, r, col, n):
        r.u32()
        dt = col.data_type
        if dt == TP_BOOL:
            return unpack_bools(r.take((n + 7) // 8), 0, n)
        if dt == TP_STRING:
            return [bytes(r.take(r.u32())) for _ in range(n)]
        size = NUMERIC_TYPES[dt][1]
        return np.frombuffer(r.take(n * size), disk_dtype(dt, True)).astype(col.dtype)

    def _direct(self, r, col, n, version):
        if version > 1:
            r.u32()
        count = int(np.prod(col.cell_shape, dtype=np.int64))
        cells = []
        for _ in range(n):
            if version == 1:
                r.u32()
            if col.data_type == TP_BOOL:
                flat = unpack_bools(r.take((count + 7) // 8), 0, count)
            elif col.data_type == TP_STRING:
                flat = [bytes(r.take(r.u32())) for _ in range(
                    checked_count(count, r.limit - r.pos, "strings"))]
            else:
                size = NUMERIC_TYPES[col.data_type][1]
                flat = np.frombuffer(r.take(count * size), disk_dtype(col.data_type, True))
            cells.append((col.cell_shape, flat))
        return cells

    def _offsets(self, r, n):
        out = np.zeros(n, np.int64)
        for i in range(n):
            off = r.u32()
            out[i] = r.i64() if off == WIDE_OFFSET else off
        return out

    def read(self, col, start, stop):
        return self.values[col.name][start:stop]
