"""casacore's indirect array file (``table.f<N>i``, StManArrayFile).

It starts with ``uInt version`` and ``Int64 length`` (table byte order). Each array
sits at an offset a storage manager keeps: ``uInt refcount`` (version > 0), ``uInt
ndim``, ``Int`` per axis, then the values: numbers in the table's byte order, Bools as
bits, Strings as one ``uInt`` file offset per element, each pointing at ``uInt length``
and the characters (offset 0: an empty string).
"""

import numpy as np

from ..errors import FormatError
from .casacore_base import (
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


class ArrayFile:
    """Reads arrays out of one ``table.f<N>i`` file of ``source``."""

    def __init__(self, source, name, big_endian):
        self.source, self.name, self.big_endian = source, name, big_endian
        self.order = ">" if big_endian else "<"
        self.size = source.entry_size(name)
        head = read_exact(source, name, 0, 12, "array file header")
        self.version = int(np.frombuffer(head, self.order + "u4", 1)[0])

    def _uints(self, offset, count, what):
        raw = read_exact(self.source, self.name, offset, 4 * count, what)
        return np.frombuffer(raw, self.order + "u4").astype(np.int64)

    def shape_at(self, offset):
        """(casacore shape, offset of the values) of the array at ``offset``."""
        pos = offset + (4 if self.version > 0 else 0)
        ndim = checked_count(int(self._uints(pos, 1, "array rank")[0]), MAX_NDIM,
                             f"{self.name}: array rank at offset {offset}")
        shape = self._uints(pos + 4, ndim, "array shape")
        shape = shape.astype(np.int32).astype(np.int64)  # stored as Int
        if (shape < 0).any() or int(np.prod(shape, dtype=np.float64)) > self.size * 8:
            raise FormatError(f"{self.name}: array shape {shape.tolist()} at offset {offset} "
                              "does not fit the file")
        return tuple(int(n) for n in shape), pos + 4 + 4 * ndim

    def array_at(self, offset, data_type):
        """(Python-order shape, flat values) of the array at ``offset``: values in C order of
        the reversed casacore shape, as python-casacore gives them; Strings as bytes."""
        shape, at = self.shape_at(offset)
        count = int(np.prod(shape, dtype=np.int64))
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
