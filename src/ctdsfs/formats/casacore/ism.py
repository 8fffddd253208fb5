"""IncrementalStMan (``table.f<N>``, indirect arrays in ``table.f<N>i``).

Facts used (casacore note 260 and tables/DataMan/ISM*.cc): a 512-byte AipsIO header
(``IncrementalStMan``: bucket size, bucket count, ...) in the table's byte order, then
buckets at ``512 + n * bucket_size``, then the ``ISMIndex`` (first row of each bucket
and its bucket number). A bucket starts with a ``uInt`` index offset (high 4 bits set:
64-bit row numbers), its data part, then per column (table.dat's order) the number of
values, the first row (relative to the bucket) of each and its offset in the data part
(which starts after that first ``uInt``). A value holds for rows up to the next one.
Values: numbers in table byte order, Bools as bits, Strings as ``uInt`` total length
then characters (arrays: a length before each string), indirect arrays as an Int64
offset into the array file.
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
)

HEADER_SIZE = 512
MAX_BUCKET = 1 << 30
MAX_INDEX = 256 << 20


class ISMReader:
    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.big_endian = source, table.big_endian
        self.order = ">" if self.big_endian else "<"
        self.name, self.arrays_name = f"table.f{seqnr}", f"table.f{seqnr}i"
        self.column_number = {c.name: i for i, c in enumerate(columns)}
        self.ncol = len(columns)
        self.nrow = table.nrow
        self.ifile = None
        self.file_size = source.entry_size(self.name)
        r = EndianAipsReader(read_exact(source, self.name, 0, min(HEADER_SIZE, self.file_size),
                                        "header"), self.big_endian)
        version = r.start("IncrementalStMan", outer=True)
        if version >= 5 and r.bool() != self.big_endian:
            raise FormatError(f"{self.name}: endian flag differs from table.dat's")
        self.bucket_size = checked_count(r.u32(), MAX_BUCKET, f"{self.name}: bucket size")
        n_buckets = r.u32()
        if self.bucket_size < 8 or n_buckets > (self.file_size - HEADER_SIZE) // self.bucket_size:
            raise FormatError(f"{self.name}: {n_buckets} buckets of {self.bucket_size} bytes "
                              "exceed the file")
        self.n_buckets = n_buckets
        at = HEADER_SIZE + n_buckets * self.bucket_size
        size = self.file_size - at
        if size > MAX_INDEX:
            raise FormatError(f"{self.name}: index of {size} bytes is too large")
        r = EndianAipsReader(read_exact(source, self.name, at, size, "index"), self.big_endian)
        version = r.start("ISMIndex", outer=True)
        n_used = r.u32()
        rows = r.block("u4" if version == 1 else "i8").astype(np.int64)
        buckets = r.block("u4").astype(np.int64)
        r.end()
        if n_used + 1 > len(rows) or n_used > len(buckets):
            raise FormatError(f"{self.name}: index uses {n_used} of {len(buckets)} buckets")
        self.first_row, self.bucket_nr = rows[:n_used + 1], buckets[:n_used]
        if self.nrow and ((np.diff(self.first_row) <= 0).any() or self.first_row[0] != 0 or
                          self.first_row[-1] < self.nrow) or (self.bucket_nr >= n_buckets).any():
            raise FormatError(f"{self.name}: index rows or buckets are inconsistent")
        self._cache = {}

    def _bucket(self, i):
        """(data part, per column (row starts, offsets)) of the i-th bucket in the index."""
        cached = self._cache.get(i)  # (reads may come from several threads)
        if cached is not None:
            return cached
        number = int(self.bucket_nr[i])
        data = read_exact(self.source, self.name, HEADER_SIZE + number * self.bucket_size,
                          self.bucket_size, "bucket")
        head = int(np.frombuffer(data[:4], self.order + "u4")[0])
        wide, index_at = head & 0xF0000000, head & 0x0FFFFFFF
        if not 4 <= index_at <= self.bucket_size:
            raise FormatError(f"{self.name}: bucket {number} index offset {index_at}")
        pos, columns = index_at, []
        row_type = self.order + ("i8" if wide else "u4")
        for _ in range(self.ncol):
            if pos + 4 > self.bucket_size:
                raise FormatError(f"{self.name}: bucket {number} index is truncated")
            n = int(np.frombuffer(data[pos:pos + 4], self.order + "u4")[0])
            width = 8 if wide else 4
            end = pos + 4 + n * (width + 4)
            if n == 0 or end > self.bucket_size:
                raise FormatError(f"{self.name}: bucket {number} index has {n} values")
            starts = np.frombuffer(data[pos + 4:pos + 4 + n * width], row_type).astype(np.int64)
            offsets = np.frombuffer(data[pos + 4 + n * width:end], self.order + "u4")
            if starts[0] != 0 or (np.diff(starts) <= 0).any() or \
                    (offsets.astype(np.int64) + 4 > index_at).any():
                raise FormatError(f"{self.name}: bucket {number} index values are inconsistent")
            columns.append((starts, offsets.astype(np.int64)))
            pos = end
        if len(self._cache) > 16:
            self._cache.clear()
        parsed = self._cache[i] = (data[4:index_at], columns)
        return parsed

    def _runs(self, col, start, stop):
        """(data part, value offsets, repeat counts) per bucket covering ``start..stop``."""
        k = self.column_number[col.name]
        i = int(np.searchsorted(self.first_row, start, side="right")) - 1
        while start < stop:
            b_first, b_end = int(self.first_row[i]), int(self.first_row[i + 1])
            end = min(stop, b_end)
            data, columns = self._bucket(i)
            starts, offsets = columns[k]
            rel = np.arange(start - b_first, end - b_first)
            which = np.searchsorted(starts, rel, side="right") - 1
            chosen, counts = np.unique(which, return_counts=True)
            yield data, offsets[chosen], counts
            start, i = end, i + 1

    def read(self, col, start, stop):
        dt = col.data_type
        if col.is_array and not col.direct:
            cells = []
            for data, offsets, counts in self._runs(col, start, stop):
                for off, n in zip(offsets.tolist(), counts.tolist()):
                    at = self._check(data, off, 8)
                    value = int(np.frombuffer(data[at:at + 8], self.order + "i8")[0])
                    cells.extend([self._indirect(col, value)] * n)
            return cells
        if dt == TP_STRING:
            count = int(np.prod(col.cell_shape, dtype=np.int64)) if col.is_array else 1
            cells = []
            for data, offsets, counts in self._runs(col, start, stop):
                for off, n in zip(offsets.tolist(), counts.tolist()):
                    items = self._strings(data, off, count)
                    cells.extend([items[0] if not col.is_array else
                                  (col.cell_shape, items)] * n)
            return cells
        nelem = int(np.prod(col.cell_shape, dtype=np.int64))
        size = (nelem + 7) // 8 if dt == TP_BOOL else nelem * NUMERIC_TYPES[dt][1]
        parts = []
        for data, offsets, counts in self._runs(col, start, stop):
            buf = np.frombuffer(data, np.uint8)
            if (offsets + size > len(buf)).any():
                raise FormatError(f"{self.name}: a value lies past its bucket's data")
            values = buf[offsets[:, None] + np.arange(size)]
            parts.append(np.repeat(values, counts, axis=0))
        raw = np.concatenate(parts) if parts else np.zeros((0, size), np.uint8)
        shape = (stop - start,) + tuple(col.cell_shape)
        if dt == TP_BOOL:
            bits = np.unpackbits(raw, axis=1, bitorder="little")[:, :nelem].astype(bool)
            return bits.reshape(shape)
        return raw.view(disk_dtype(dt, self.big_endian)).astype(col.dtype).reshape(shape)

    def _check(self, data, at, size):
        if at < 0 or at + size > len(data):
            raise FormatError(f"{self.name}: a value lies past its bucket's data")
        return at

    def _uint(self, data, at):
        at = self._check(data, at, 4)
        return int(np.frombuffer(data[at:at + 4], self.order + "u4")[0])

    def _strings(self, data, at, count):
        total = self._uint(data, at)
        if total < 4 or at + total > len(data):
            raise FormatError(f"{self.name}: string of {total} bytes exceeds its bucket")
        if count == 1:
            return [bytes(data[at + 4:at + total])]
        items, pos = [], at + 4
        for _ in range(checked_count(count, total // 4, f"{self.name}: strings")):
            n = self._uint(data, pos)
            if pos + 4 + n > at + total:
                raise FormatError(f"{self.name}: string length {n} exceeds its value")
            items.append(bytes(data[pos + 4:pos + 4 + n]))
            pos += 4 + n
        return items

    def _indirect(self, col, offset):
        if offset == 0:
            return None
        if self.ifile is None:
            self.ifile = ArrayFile(self.source, self.arrays_name, self.big_endian)
        return self.ifile.array_at(offset, col.data_type)

