"""casacore's indirect array file (``table.f<N>i``, StManArrayFile).

It starts with ``uInt version`` and ``Int64 length`` (table byte order). Each array
sits at an offset a storage manager keeps: ``uInt refcount`` (version > 0), ``uInt
ndim``, ``Int`` per axis, then the values: numbers in the table's byte order, Bools as
bits, Strings as one ``uInt`` file offset per element, each pointing at ``uInt length``
and the characters (offset 0: an empty string).
"""

import math
import struct

import numpy as np

from ...errors import FormatError
from .base import (
    MAX_ITEMS,
    NUMERIC_TYPES,
    TP_BOOL,
    TP_STRING,
    checked_count,
    disk_dtype,
    read_exact,
    unpack_bools,
)

MAX_NDIM = 32
WINDOW = 256 << 10  # bytes of the file read at once for the small reads of cells
PASS_BYTES = 8 << 20  # bytes of the file read at once by a vectorised pass over many cells
PASS_CELLS = 1 << 18  # cells gathered at once by such a pass (bounds its index arrays)


class _Windowed:
    """The file's small reads (a cell's rank, shape and values, one after the other)
    served from one window read ahead: one read, or one GET, for many cells."""

    def __init__(self, source, name):
        self.source, self.name = source, name
        self.size = source.entry_size(name)
        self._window = (0, b"")

    def entry_size(self, name):
        return self.size

    def read(self, name, offset, size):
        start, data = self._window
        if start <= offset and offset + size <= start + len(data):
            return data[offset - start:offset - start + size]
        if size > WINDOW // 4:
            return self.source.read(name, offset, size)
        data = bytes(self.source.read(name, offset, min(WINDOW, self.size - offset)))
        self._window = (offset, data)
        return data[:size]

    def forget(self):
        self._window = (0, b"")


class ArrayFile:
    """Reads arrays out of one ``table.f<N>i`` file of ``source``."""

    def __init__(self, source, name, big_endian):
        self.name, self.big_endian = name, big_endian
        self.source = _Windowed(source, name)
        self.order = ">" if big_endian else "<"
        self.size = self.source.size
        head = read_exact(source, name, 0, 12, "array file header")
        self.version = int(np.frombuffer(head, self.order + "u4", 1)[0])

    def _uints(self, offset, count, what):
        raw = read_exact(self.source, self.name, offset, 4 * count, what)
        return np.frombuffer(raw, self.order + "u4").astype(np.int64)

    def shape_at(self, offset):
        """(casacore shape, offset of the values) of the array at ``offset`` (struct, not
        NumPy: this runs once per cell)."""
        pos = offset + (4 if self.version > 0 else 0)
        (ndim,) = struct.unpack(self.order + "I", read_exact(self.source, self.name, pos, 4,
                                                             "array rank"))
        if checked_count(ndim, MAX_NDIM, f"{self.name}: array rank at offset {offset}") == 0:
            raise FormatError(f"{self.name}: array of rank 0 at offset {offset} (a defined "
                              "cell has at least one axis)")
        shape = struct.unpack(f"{self.order}{ndim}i",
                              read_exact(self.source, self.name, pos + 4, 4 * ndim, "array shape"))
        if any(n < 0 for n in shape) or math.prod(shape) > self.size * 8:
            raise FormatError(f"{self.name}: array shape {list(shape)} at offset {offset} "
                              "does not fit the file")
        return shape, pos + 4 + 4 * ndim

    def _gathered(self, starts, length):
        """Rows of ``length`` bytes from each of ``starts`` (sorted), as uint8 matrices
        ``(cells, length)``, each pass reading one span of the file of at most PASS_BYTES
        (or one cell) and gathering at most PASS_CELLS cells."""
        if len(starts) and (starts[0] < 0 or starts[-1] + length > self.size):
            raise FormatError(f"{self.name}: an array offset lies outside the file "
                              f"({self.size} bytes)")
        columns = np.arange(length, dtype=np.int64)
        i = 0
        while i < len(starts):
            lo = int(starts[i])
            j = int(np.searchsorted(starts, lo + max(PASS_BYTES - length, 0), "right"))
            j = min(max(j, i + 1), i + PASS_CELLS)
            hi = int(starts[j - 1]) + length
            data = np.frombuffer(read_exact(self.source.source, self.name, lo, hi - lo,
                                            "arrays"), np.uint8)
            yield i, j, data[(starts[i:j] - lo)[:, None] + columns]
            i = j

    def common_shape(self, offsets):
        """The casacore shape of every array at ``offsets`` (int64, none 0) when they all
        have the same one, else None: their rank and shape words compared with the first's
        in vectorised passes, not cell by cell."""
        shape, _ = self.shape_at(int(offsets[0]))
        head = np.frombuffer(struct.pack(f"{self.order}I{len(shape)}i", len(shape), *shape),
                             np.uint8)
        starts = np.unique(offsets) + (4 if self.version > 0 else 0)
        for _, _, rows in self._gathered(starts, len(head)):
            if not (rows == head).all():
                return None
        return shape

    def arrays_of_shape(self, offsets, shape, data_type):
        """The arrays at ``offsets`` (all of casacore shape ``shape``, see common_shape) as
        one ndarray ``(len(offsets), *shape[::-1])`` of the values' native dtype."""
        count = math.prod(shape)
        skip = (4 if self.version > 0 else 0) + 4 + 4 * len(shape)
        size = (count + 7) // 8 if data_type == TP_BOOL else count * NUMERIC_TYPES[data_type][1]
        order = np.argsort(offsets, kind="stable")
        starts = offsets[order] + skip
        out = np.empty((len(offsets), size), np.uint8)
        for i, j, rows in self._gathered(starts, size):
            out[order[i:j]] = rows
        if data_type == TP_BOOL:
            values = np.unpackbits(out, axis=1, bitorder="little")[:, :count].astype(bool)
        else:
            values = out.view(disk_dtype(data_type, self.big_endian))
        return values.reshape((len(offsets),) + tuple(shape[::-1]))

    def value_places(self, offsets, data_type):
        """Where the values of the arrays at ``offsets`` (int64, all of one shape) lie:
        shape (len(offsets), *Python shape), each value's first byte in the file, or for
        Bools its bit (byte * 8 + bit). Refused (FormatError) for an undefined cell, for
        cells that share an array (a write would change them all), and for a shared one
        (its reference count, in files of version > 0, is not 1)."""
        if (offsets == 0).any():
            raise FormatError(f"{self.name}: an undefined cell has no array")
        if len(np.unique(offsets)) != len(offsets):
            raise FormatError(f"{self.name}: cells share an array")
        shape = self.common_shape(offsets)
        if shape is None:
            raise FormatError(f"{self.name}: the cells do not have one shape")
        if self.version > 0:
            ones = np.frombuffer(struct.pack(self.order + "I", 1), np.uint8)
            for _, _, rows in self._gathered(np.sort(offsets), 4):
                if not (rows == ones).all():
                    raise FormatError(f"{self.name}: an array is shared by several cells")
        count = math.prod(shape)
        starts = offsets.astype(np.int64) + (4 if self.version > 0 else 0) + 4 + 4 * len(shape)
        items = np.arange(count, dtype=np.int64)
        if data_type == TP_BOOL:
            places = starts[:, None] * 8 + items
        else:
            places = starts[:, None] + items * NUMERIC_TYPES[data_type][1]
        end = int(places.max(initial=0)) // (8 if data_type == TP_BOOL else 1)
        if end >= self.size:
            raise FormatError(f"{self.name}: an array runs past the end of the file")
        return places.reshape((len(offsets),) + tuple(shape[::-1]))

    def forget_window(self):
        """Drop the bytes read ahead: the file was written."""
        self.source.forget()

    def array_at(self, offset, data_type):
        """(Python-order shape, flat values) of the array at ``offset``: values in C order of
        the reversed casacore shape, as python-casacore gives them; Strings as bytes."""
        shape, at = self.shape_at(offset)
        count = math.prod(shape)
        if data_type == TP_BOOL:
            raw = read_exact(self.source, self.name, at, (count + 7) // 8, "Bool array")
            values = unpack_bools(raw, 0, count)
        elif data_type == TP_STRING:
            values = [self.string_at(int(p)) for p in self._uints(at, count, "string offsets")]
        else:
            size = NUMERIC_TYPES[data_type][1]
            raw = read_exact(self.source, self.name, at, count * size, "array values")
            values = np.frombuffer(raw, disk_dtype(data_type, self.big_endian))
        return shape[::-1], values

    def string_at(self, offset):
        if offset == 0:
            return b""
        n = checked_count(int(self._uints(offset, 1, "string length")[0]),
                          min(MAX_ITEMS, self.size), f"{self.name}: string length")
        return bytes(read_exact(self.source, self.name, offset + 4, n, "string"))
