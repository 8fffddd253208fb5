"""StandardStMan (``table.f<N>``, indirect arrays in ``table.f<N>i``).

Facts used (casacore note 260 and tables/DataMan/SSM*.cc): a 512-byte AipsIO header
(``StandardStMan``: bucket size, bucket count, index bucket chain, index length,
number of indices) in the table's byte order, then equal buckets at ``512 + n *
bucket_size``. The index (one ``SSMIndex`` per column group: rows per bucket, the last
row and the bucket number of each data bucket) is serialised over a chain of index
buckets whose first 8 bytes name the next one (big-endian), or sits at an offset of a
single bucket. The DM info in table.dat (``SSM``: column offsets in a bucket and each
column's index) places a column. A bucket holds each column's rows back to back: numbers
in table byte order, Bools as bits, Strings as 12 bytes (up to 8 characters plus an Int
length, or bucket/offset/length of the string in the heap buckets, whose 16-byte header
holds the used length and next bucket, big-endian), indirect arrays as an Int64 offset
into the array file.
"""

import numpy as np

from ...errors import FormatError
from .arrayfile import ArrayFile
from .base import (
    MAX_ITEMS,
    NUMERIC_TYPES,
    TP_BOOL,
    TP_STRING,
    EndianAipsReader,
    checked_count,
    disk_dtype,
    read_exact,
    unpack_bools,
)

HEADER_SIZE = 512
HEAP_HEADER = 16
MAX_BUCKET = 1 << 30
RUN_BYTES = 8 << 20  # buckets read at once when they follow each other


class SSMIndex:
    """One column group: which rows each data bucket holds."""

    def __init__(self, r, nrow):
        version = r.start("SSMIndex", outer=True)
        n_used = r.u32()
        self.rows_per_bucket = r.u32()
        r.i32()  # number of columns
        r.skip_object()  # free space map
        last = r.block("u4" if version == 1 else "i8").astype(np.int64)
        buckets = r.block("u4").astype(np.int64)
        r.end()
        if n_used > min(len(last), len(buckets)):
            raise FormatError(f"SSM index uses {n_used} of {len(last)} buckets")
        self.last_row, self.bucket = last[:n_used], buckets[:n_used]
        if n_used and ((np.diff(self.last_row) <= 0).any() or self.last_row[0] < 0
                       or self.last_row[-1] != nrow - 1):
            raise FormatError("SSM index rows are not increasing to the table's last row")
        if not n_used and nrow:
            raise FormatError(f"SSM index holds no bucket for {nrow} rows")

    def spans(self, start, stop):
        """(bucket number, first row in it, rows from..to) for the buckets of ``start..stop``."""
        yield from zip(*(a.tolist() for a in self.span_arrays(start, stop)))

    def span_arrays(self, start, stop):
        """``spans`` as four arrays (bucket numbers, their first rows, rows from, rows to)."""
        if start >= stop:
            return tuple(np.zeros((4, 0), np.int64))
        lo = int(np.searchsorted(self.last_row, start))
        hi = int(np.searchsorted(self.last_row, stop - 1)) + 1
        last = self.last_row[lo:hi]
        first = np.concatenate([[0], self.last_row[:-1] + 1])[lo:hi]
        crowded = np.flatnonzero(last + 1 - first > self.rows_per_bucket)
        if crowded.size:
            raise FormatError(f"bucket {int(self.bucket[lo + crowded[0]])} holds more rows "
                              f"than fit")
        return (self.bucket[lo:hi], first, np.maximum(first, start),
                np.minimum(last + 1, stop))


class SSMReader:
    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.big_endian = source, table.big_endian
        self.name = f"table.f{seqnr}"
        self.nrow = table.nrow
        self.ifile = None
        self.arrays_name = f"table.f{seqnr}i"
        r = EndianAipsReader(dm_info, True)
        r.start("SSM", outer=True)
        r.string()
        offsets, groups = r.block("u4"), r.block("u4")
        r.end()
        # (casacore removes a column's entries by moving the later ones down, and keeps
        # the blocks' length: entries past the bound columns are left over)
        if len(offsets) < len(columns) or len(groups) < len(columns):
            raise FormatError(f"{self.name}: DM info places {len(offsets)} columns, "
                              f"table.dat binds {len(columns)}")
        self.place = {c.name: (int(o), int(g)) for c, o, g in zip(columns, offsets, groups)}
        self._read_header()
        self.indexes = self._read_indexes(table.nrow)
        for name, (_, g) in self.place.items():
            if g >= len(self.indexes):
                raise FormatError(f"{self.name}: column {name} uses index {g} of "
                                  f"{len(self.indexes)}")

    def _read_header(self):
        self.file_size = self.source.entry_size(self.name)
        r = EndianAipsReader(read_exact(self.source, self.name, 0,
                                        min(HEADER_SIZE, self.file_size), "header"),
                             self.big_endian)
        version = r.start("StandardStMan", outer=True)
        if version >= 3 and r.bool() != self.big_endian:
            raise FormatError(f"{self.name}: endian flag differs from table.dat's")
        self.bucket_size = checked_count(r.u32(), MAX_BUCKET, f"{self.name}: bucket size")
        self.n_buckets = r.u32()
        r.u32(), r.u32(), r.i32()  # cache size, free bucket count, first free bucket
        self.n_index_buckets, self.first_index_bucket = r.u32(), r.i32()
        self.index_offset = r.u32() if version >= 2 else 0
        r.i32()  # last string heap bucket
        self.index_length, self.n_indexes = r.u32(), r.u32()
        if self.bucket_size < HEAP_HEADER + 1:
            raise FormatError(f"{self.name}: bucket size {self.bucket_size} is too small")
        room = (self.file_size - HEADER_SIZE) // self.bucket_size
        if self.n_buckets > room or self.index_length > self.file_size:
            raise FormatError(f"{self.name}: {self.n_buckets} buckets of {self.bucket_size} "
                              f"bytes (index {self.index_length}) exceed the file")

    def bucket(self, number, offset=0, size=None):
        if not 0 <= number < self.n_buckets:
            raise FormatError(f"{self.name}: bucket {number} is not one of {self.n_buckets}")
        size = self.bucket_size - offset if size is None else size
        if offset + size > self.bucket_size:
            raise FormatError(f"{self.name}: read past the end of bucket {number}")
        return read_exact(self.source, self.name,
                          HEADER_SIZE + number * self.bucket_size + offset, size, "bucket")

    def _read_indexes(self, nrow):
        parts, left, number = [], self.index_length, self.first_index_bucket
        if self.index_offset > 0:
            if self.n_index_buckets != 1:
                raise FormatError(f"{self.name}: an index at an offset spans buckets")
            parts.append(self.bucket(number, self.index_offset, left))
        else:
            for _ in range(self.n_index_buckets):
                if left <= 0:
                    break
                data = self.bucket(number)
                take = min(left, self.bucket_size - 8)
                parts.append(data[8:8 + take])
                left -= take
                number = int(np.frombuffer(data[4:8], ">i4")[0])
            if left > 0:
                raise FormatError(f"{self.name}: index buckets hold less than the index")
        r = EndianAipsReader(b"".join(bytes(p) for p in parts), self.big_endian)
        count = checked_count(self.n_indexes, self.index_length // 16, f"{self.name}: indexes")
        return [SSMIndex(r, nrow) for _ in range(count)]

    # ------------------------------------------------------------ cells

    def _external_size(self, col):
        """Bits a row of ``col`` takes in a bucket."""
        nelem = int(np.prod(col.cell_shape or (), dtype=np.int64)) if col.is_array else 1
        if col.data_type == TP_STRING:  # arrays of strings always live in the heap
            return 8 * (col.max_length if col.max_length > 0 and not col.is_array else 12)
        if col.is_array and not col.direct:
            return 64
        if col.data_type == TP_BOOL:
            return nelem
        return 8 * nelem * NUMERIC_TYPES[col.data_type][1]

    def uniform_shape(self, col):
        """The one cell shape (Python order) of an indirect array column, from its cells'
        shapes alone (their values are not read), or None; NotImplemented for an empty
        table (the caller decodes to find out)."""
        if not col.is_array or col.direct or col.data_type == TP_STRING or self.nrow == 0:
            return col.cell_shape if self.nrow else NotImplemented
        offsets = self._cell_offsets(col, 0, self.nrow)
        if (offsets == 0).any():
            return None
        shape = self._array_file().common_shape(offsets)
        return None if shape is None else tuple(shape[::-1])

    def forget_cached(self):
        """Drop what was read ahead of the array file: it was written."""
        if self.ifile is not None:
            self.ifile.forget_window()

    def _array_file(self):
        if self.ifile is None:
            self.ifile = ArrayFile(self.source, self.arrays_name, self.big_endian)
        return self.ifile

    def _cell_offsets(self, col, start, stop):
        pieces = self._pieces(col, start, stop)
        return np.concatenate([np.frombuffer(raw, self._order + "i8") for raw, _, _ in
                               pieces]).astype(np.int64) if pieces else np.zeros(0, np.int64)

    def _pieces(self, col, start, stop):
        """(bytes, first bit, rows) of the column's rows ``start..stop`` in each run of
        buckets holding them; buckets that follow each other in the file are read at once
        (up to RUN_BYTES), not one read per bucket, and a column of whole bytes per row
        comes out of a run in one piece, cut out in one NumPy pass."""
        offset, bits, index, (numbers, firsts, froms, tos) = \
            self._checked_spans(col, start, stop)
        per_run = max(1, RUN_BYTES // self.bucket_size)
        breaks = np.flatnonzero(np.diff(numbers) != 1) + 1
        pieces = []
        for i, j in zip(np.concatenate([[0], breaks]).tolist(),
                        np.concatenate([breaks, [len(numbers)]]).tolist()):
            for a in range(i, j, per_run):
                b = min(j, a + per_run)
                run = self.buckets(int(numbers[a]), b - a)
                if bits and bits % 8 == 0:
                    rows = _run_rows(run, self.bucket_size, offset, bits // 8,
                                     index.rows_per_bucket, froms[a:b] - firsts[a:b],
                                     tos[a:b] - firsts[a:b])
                    pieces.append((rows, 0, int((tos[a:b] - froms[a:b]).sum())))
                    continue
                run = memoryview(run)
                for bucket, b_first, lo, hi in zip(numbers[a:b].tolist(),
                                                   firsts[a:b].tolist(),
                                                   froms[a:b].tolist(), tos[a:b].tolist()):
                    place, bit, size = self._span_place(offset, bits, bucket, b_first, lo, hi)
                    at = place - HEADER_SIZE - int(numbers[a]) * self.bucket_size
                    pieces.append((run[at:at + size], bit, hi - lo))
        return pieces

    def _span_place(self, offset, bits, bucket, b_first, a, b):
        """(byte in the file, first bit in that byte, byte count) of rows ``a..b`` of a
        column at ``offset`` in a bucket whose first row is ``b_first``, rows of ``bits``."""
        first_bit = (a - b_first) * bits
        return (HEADER_SIZE + bucket * self.bucket_size + offset + first_bit // 8,
                first_bit % 8, ((b - a) * bits + first_bit % 8 + 7) // 8)

    def _checked_spans(self, col, start, stop):
        offset, group = self.place[col.name]
        index = self.indexes[group]
        bits = self._external_size(col)
        if bits * index.rows_per_bucket + 8 * offset > 8 * self.bucket_size:
            raise FormatError(f"{self.name}: the column does not fit its buckets")
        return offset, bits, index, index.span_arrays(start, stop)

    def places(self, col, start, stop):
        """Where the cells of rows ``start..stop`` lie: [(file, places)], ``places`` of
        shape (rows, *cell_shape): each value's first byte in the file, or for Bools its
        bit (byte * 8 + bit, lowest bit first). Cells kept in the buckets (scalars, arrays
        kept directly): the same spans as ``_pieces`` reads; indirect arrays: where the
        array file holds their values (see ``ArrayFile.value_places``)."""
        if col.data_type == TP_STRING:
            raise FormatError(f"{self.name}: column {col.name} holds Strings")
        if col.is_array and not col.direct:  # arrays in the array file, at offsets kept here
            offsets = self._cell_offsets(col, start, stop)
            return [(self.arrays_name, self._array_file().value_places(offsets, col.data_type))]
        offset, bits, _, spans = self._checked_spans(col, start, stop)
        spans = zip(*(a.tolist() for a in spans))
        shape = tuple(col.cell_shape)
        per_row = int(np.prod(shape, dtype=np.int64))
        parts = []
        for bucket, b_first, a, b in spans:
            place, bit, _ = self._span_place(offset, bits, bucket, b_first, a, b)
            items = np.arange((b - a) * per_row, dtype=np.int64)
            if col.data_type == TP_BOOL:
                parts.append(place * 8 + bit + items)
            else:
                parts.append(place + items * NUMERIC_TYPES[col.data_type][1])
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return [(self.name, flat.reshape((stop - start,) + shape))]

    def buckets(self, first, count):
        """``count`` whole buckets from bucket number ``first``, in one read."""
        if not (0 <= first and first + count <= self.n_buckets):
            raise FormatError(f"{self.name}: buckets {first}..{first + count} are not among "
                              f"{self.n_buckets}")
        return read_exact(self.source, self.name, HEADER_SIZE + first * self.bucket_size,
                          count * self.bucket_size, "buckets")

    def read(self, col, start, stop):
        return self._decode(col, self._pieces(col, start, stop), stop - start)

    def _decode(self, col, pieces, nrow):
        dt = col.data_type
        if col.is_array and not col.direct and dt != TP_STRING:
            offsets = np.concatenate([np.frombuffer(raw, self._order + "i8") for raw, _, _ in
                                      pieces]).astype(np.int64) if pieces else np.zeros(0, np.int64)
            return self._indirect_cells(col, offsets)
        if dt == TP_STRING:
            raw = b"".join(bytes(p[0]) for p in pieces)
            if col.max_length > 0 and not col.is_array:
                cells = np.frombuffer(raw, f"S{col.max_length}")
                return [bytes(s) for s in cells]  # NumPy's S type stops at the first NUL
            return self._strings(col, np.frombuffer(raw, self._order + "i4").reshape(-1, 3),
                                 raw)
        shape = (nrow,) + tuple(col.cell_shape)
        if dt == TP_BOOL:
            per_row = int(np.prod(col.cell_shape, dtype=np.int64))
            parts = [unpack_bools(raw, bit, n * per_row) for raw, bit, n in pieces]
            flat = np.concatenate(parts) if parts else np.zeros(0, bool)
            return flat.reshape(shape)
        raw = b"".join(bytes(p[0]) for p in pieces)
        return np.frombuffer(raw, disk_dtype(dt, self.big_endian)).astype(
            col.dtype).reshape(shape)

    @property
    def _order(self):
        return ">" if self.big_endian else "<"

    def _indirect_cells(self, col, offsets):
        """The cells at ``offsets`` of the array file: one ndarray when all are defined with
        one shape (read in vectorised passes), else a list of (shape, values) or None."""
        ifile = self._array_file()
        if len(offsets) and not (offsets == 0).any():
            shape = ifile.common_shape(offsets)
            if shape is not None:
                return ifile.arrays_of_shape(offsets, shape, col.data_type).astype(col.dtype)
        return [None if off == 0 else ifile.array_at(int(off), col.data_type)
                for off in offsets.tolist()]

    def _strings(self, col, refs, raw):
        heap = HeapReader(self)
        if not col.is_array:
            out = []
            for i, (bucket, offset, length) in enumerate(refs.tolist()):
                if length <= 8:
                    if length < 0:
                        raise FormatError(f"string length {length}")
                    out.append(raw[12 * i:12 * i + length])
                else:
                    out.append(heap.get(bucket, offset, length))
            return out
        cells = []
        for bucket, offset, length in refs.tolist():
            if col.direct:  # fixed shape: no shape in the heap
                count = int(np.prod(col.cell_shape, dtype=np.int64))
                cells.append((col.cell_shape, heap.string_array(bucket, offset, length, count)))
            else:
                cells.append(heap.shaped_string_array(bucket, offset, length))
        return cells


def _run_rows(run, bucket_size, offset, row_bytes, rows_per_bucket, froms, tos):
    """The bytes of rows ``froms[i]..tos[i]`` (counted in bucket ``i``) of a column at
    ``offset`` in a run of whole buckets, in order: one mask over every row place."""
    buckets = np.frombuffer(run, np.uint8).reshape(len(froms), bucket_size)
    places = buckets[:, offset:offset + rows_per_bucket * row_bytes].view(f"V{row_bytes}")
    slot = np.arange(rows_per_bucket)
    return places[(slot >= froms[:, None]) & (slot < tos[:, None])].view(np.uint8)


class HeapReader:
    """Strings in SSM's string heap buckets, followed across continuation buckets."""

    def __init__(self, ssm):
        self.ssm = ssm
        self.cache = {}

    def _bucket(self, number):
        if number not in self.cache:
            data = self.ssm.bucket(number)
            used, _, nxt = np.frombuffer(data[4:16], ">i4").tolist()
            if not 0 <= used <= self.ssm.bucket_size - HEAP_HEADER:
                raise FormatError(f"string bucket {number} claims {used} bytes used")
            if len(self.cache) > 64:
                self.cache.clear()
            self.cache[number] = (data[HEAP_HEADER:HEAP_HEADER + used], nxt)
        return self.cache[number]

    def get(self, bucket, offset, length):
        """``length`` bytes from ``offset`` in heap bucket ``bucket``; the cursor is kept."""
        if length < 0 or length > min(MAX_ITEMS, self.ssm.file_size):
            raise FormatError(f"string length {length} is out of range")
        self.at = (bucket, offset)
        return self.take(length)

    def take(self, length):
        bucket, offset = self.at
        out = bytearray()
        for _ in range(self.ssm.n_buckets + 1):
            data, nxt = self._bucket(bucket)
            if not 0 <= offset <= len(data):
                raise FormatError(f"string offset {offset} is outside bucket {bucket}")
            piece = data[offset:offset + length - len(out)]
            out += piece
            offset += len(piece)
            if len(out) == length:
                self.at = (bucket, offset)
                return bytes(out)
            bucket, offset = nxt, 0
        raise FormatError("string continuation buckets loop")

    def _int(self):
        return int(np.frombuffer(self.take(4), ">i4")[0])

    def string_array(self, bucket, offset, length, count):
        if length == 0:
            return [b""] * count
        self.get(bucket, offset, 0)
        return self._items(count, length)

    def _items(self, count, length):
        if count * 4 > length:
            raise FormatError(f"{count} strings cannot fit {length} bytes")
        items = []
        for _ in range(count):
            n = self._int()
            if not 0 <= n <= length:
                raise FormatError(f"string length {n} exceeds its array's {length} bytes")
            items.append(self.take(n))
        return items

    def shaped_string_array(self, bucket, offset, length):
        if length == 0:
            return None
        self.get(bucket, offset, 0)
        ndim = self._int()
        if not 1 <= ndim <= 32 or 4 * (ndim + 2) > length:
            raise FormatError(f"string array rank {ndim} is out of range")
        shape = [self._int() for _ in range(ndim)]
        if min(shape, default=0) < 0:
            raise FormatError(f"string array shape {shape} is negative")
        count = int(np.prod(shape, dtype=np.int64))
        filled = self._int()
        items = self._items(count, length) if filled else [b""] * count
        return tuple(shape[::-1]), items
