"""What every casacore storage-manager decoder shares: the table's files, endianness, types.

A table's files are reached through a *source*: any object with
``read(name, offset, size)`` (bytes-like, shorter at the end of the file) and
``entry_size(name)``. A :class:`~ctdsfs.formats.multifile.container.MultiFile` is one; a
:class:`TableDirectory` reads a table directory; a remote store can be another. So
the decoders work the same over all of them and read only the byte ranges they need.
A source of local files may also have ``read_into(name, offset, buffer)`` (the bytes
read into a writable buffer, their count): bulk reads then go into buffers of
:func:`read_aligned`'s alignment.

Everything here is untrusted input: every count, size and offset read from a file is
checked against the file's real size before anything is read or allocated.
"""

import os
import resource
import struct

import numpy as np

from ...errors import FormatError
from ...io.buffers import aligned_empty
from ...io.store import open_regular, preadv_all
from .aipsio import AipsReader

# casacore DataType codes (casa/Utilities/DataType.h) of the column types decoded.
TP_BOOL, TP_UCHAR, TP_SHORT, TP_USHORT, TP_INT, TP_UINT = 0, 2, 3, 4, 5, 6
TP_FLOAT, TP_DOUBLE, TP_COMPLEX, TP_DCOMPLEX, TP_STRING, TP_INT64 = 7, 8, 9, 10, 11, 29
# type -> (NumPy kind as getcol returns it, bytes per value on disk); Bool is a bit on disk.
# python-casacore 3.8 widens uChar to uint16 in getcol; the disk holds one byte.
NUMERIC_TYPES = {TP_UCHAR: ("u2", 1), TP_SHORT: ("i2", 2), TP_USHORT: ("u2", 2),
                 TP_INT: ("i4", 4), TP_UINT: ("u4", 4), TP_INT64: ("i8", 8),
                 TP_FLOAT: ("f4", 4), TP_DOUBLE: ("f8", 8), TP_COMPLEX: ("c8", 8),
                 TP_DCOMPLEX: ("c16", 16)}
# A bound for any single allocation a hostile file could ask for (cells, strings, maps).
MAX_ITEMS = 1 << 31
MAX_READ = 1 << 31  # bytes of one read_aligned (callers check their ranges against the file)


def process_memory():
    """Bytes this process can still take: the machine's memory, or what its address-space
    limit leaves beside what it maps already (what a count read from a table is checked
    against when nothing in the files bounds it)."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return memory
    return min(memory, max(0, limit - mapped_bytes()))


def mapped_bytes():
    """Bytes of address space this process maps (VmSize), which RLIMIT_AS bounds."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class TableDirectory:
    """The files of a table directory on a local file system (a link, FIFO, socket or
    device in place of a file is refused, never followed or opened)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def entry_size(self, name):
        return os.lstat(os.path.join(self.path, name)).st_size

    def read(self, name, offset, size):
        fd = open_regular(os.path.join(self.path, name))
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def read_into(self, name, offset, buffer):
        fd = open_regular(os.path.join(self.path, name))
        try:
            return preadv_all(fd, buffer, offset)
        finally:
            os.close(fd)


class LayeredSource:
    """Files found in the first of several sources that holds them: a MultiFile table keeps
    ``table.dat`` beside its ``table.mf``, and the storage managers' files inside it."""

    def __init__(self, *sources):
        self.sources = sources

    def _holder(self, name):
        for source in self.sources:
            try:
                source.entry_size(name)
            except (FileNotFoundError, KeyError):
                continue
            return source
        raise FormatError(f"{name}: no such file in the table")

    def entry_size(self, name):
        return self._holder(name).entry_size(name)

    def read(self, name, offset, size):
        return self._holder(name).read(name, offset, size)


def disk_dtype(data_type, big_endian):
    """The NumPy dtype of a numeric casacore type as stored in a table of that endianness."""
    kind = NUMERIC_TYPES[data_type][0]
    kind = "u1" if data_type == TP_UCHAR else kind
    return np.dtype(kind).newbyteorder(">" if big_endian else "<")


def unpack_bools(raw, first_bit, count):
    """``count`` Bools stored as bits (lowest bit first) from bit ``first_bit`` of ``raw``."""
    bits = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")
    if first_bit + count > bits.size:
        raise FormatError(f"{count} Bool bits from bit {first_bit} run past {bits.size} bits")
    return bits[first_bit:first_bit + count].astype(bool)


_LITTLE_ENDIAN = {code: struct.Struct("<" + code) for code in "IiqQ"}


class EndianAipsReader(AipsReader):
    """AipsIO in the table's byte order: casacore writes storage-manager headers and
    indexes little-endian in little-endian tables (``LECanonicalIO``)."""

    def __init__(self, data, big_endian, pos=0, end=None):
        super().__init__(data, pos, end)
        self.big_endian = big_endian

    def _le(self, code):
        st = _LITTLE_ENDIAN[code]
        return st.unpack(self.take(st.size))[0]

    def u32(self):
        return super().u32() if self.big_endian else self._le("I")

    def i32(self):
        return super().i32() if self.big_endian else self._le("i")

    def i64(self):
        return super().i64() if self.big_endian else self._le("q")

    def u64(self):
        return super().u64() if self.big_endian else self._le("Q")

    def block(self, kind):
        """A ``Block`` of ``kind`` ("u4", "i4", "i8", ...) as a NumPy array (native order)."""
        self.start("Block")
        n = self.u32()
        size = np.dtype(kind).itemsize
        if n * size > self.limit - self.pos:
            raise FormatError(f"Block of {n} items exceeds its object")
        order = ">" if self.big_endian else "<"
        values = np.frombuffer(self.take(n * size), np.dtype(kind).newbyteorder(order))
        self.end()
        return values.astype(kind)

    def skip_object(self):
        """Step over one object whose content is not needed (e.g. a free-space map)."""
        self.start()
        self.pos = self.limit
        self.end()


def read_exact(source, name, offset, size, what):
    """``size`` bytes at ``offset`` of ``name``, all of them inside the file, or FormatError."""
    if offset < 0 or size < 0:
        raise FormatError(f"{name}: {what} at a negative offset or size")
    end = source.entry_size(name)
    if offset + size > end:
        raise FormatError(f"{name}: {what} (bytes {offset}..{offset + size}) lies past the "
                          f"end of the file ({end} bytes)")
    data = source.read(name, offset, size)
    if len(data) != size:
        raise FormatError(f"{name}: {what} is short ({len(data)} of {size} bytes)")
    return data


def read_aligned(source, name, offset, size, what):
    """:func:`read_exact`'s bytes as a ``uint8`` array: from a source that reads into
    buffers (``read_into``), into an :func:`aligned_empty` one (a short read there says
    the range passes the end of the file: no size asked first)."""
    read_into = getattr(source, "read_into", None)
    if read_into is None:
        return np.frombuffer(read_exact(source, name, offset, size, what), np.uint8)
    if offset < 0 or size < 0 or size > MAX_READ:
        raise FormatError(f"{name}: {what} at offset {offset}, {size} bytes, is out of range")
    buffer = aligned_empty(size, offset)
    done = read_into(name, offset, buffer)
    if done != size:
        raise FormatError(f"{name}: {what} is short ({done} of {size} bytes)")
    return buffer


def read_pieces(source, name, first, step, count, length, what):
    """``count`` pieces of ``length`` bytes, the n-th at ``first + n * step``, as a ``uint8``
    array (count, length), read from the last piece back to the first (a remote store
    takes reads that step forward into its next chunk for a reader going through the
    file); from a source that reads into buffers, each into its place."""
    read_into = getattr(source, "read_into", None)
    if read_into is None:
        pieces = [read_exact(source, name, first + n * step, length, what)
                  for n in reversed(range(count))]
        return np.frombuffer(b"".join(pieces[::-1]), np.uint8).reshape(count, length)
    if first < 0 or step < 0 or length < 0 or count * length > MAX_READ:
        raise FormatError(f"{name}: {what} at offset {first}, {count} x {length} bytes, is "
                          "out of range")
    out = aligned_empty(count * length, first).reshape(count, length)
    for n in reversed(range(count)):
        done = read_into(name, first + n * step, out[n])
        if done != length:
            raise FormatError(f"{name}: {what} is short ({done} of {length} bytes)")
    return out


def checked_count(n, limit, what):
    """A count from a file, refused when negative or above ``limit``."""
    if n < 0 or n > limit:
        raise FormatError(f"{what} {n} is out of range (at most {limit})")
    return int(n)
