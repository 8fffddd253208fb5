"""casacore AipsIO in its canonical (big-endian) form.

An object is ``[magic] uInt length, String type, uInt version, payload``: only the
outermost object carries the magic ``0xBEBEBEBE``, and ``length`` counts from the
length word itself to the end of the payload. ``std::vector``/``Block`` values are
nested objects of type ``"Block"`` holding ``uInt n`` and the elements.

The reader never trusts a length: every read is checked against the end of the
innermost open object, so a hostile length cannot make it read past its data or
allocate more than the input holds; and objects nest at most ``MAX_DEPTH`` deep.
"""

import struct
import sys
from array import array

from ...errors import FormatError

MAGIC = 0xBEBEBEBE
# Objects open at once. casacore's own records rarely nest beyond ten; a hostile
# file nesting thousands deep must not exhaust the (recursive) decoders' stack.
MAX_DEPTH = 64

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
BIG_ENDIAN_HOST = sys.byteorder == "big"


def big_endian_bytes(values, typecode="q"):
    """``values`` as big-endian bytes of ``typecode`` items (what casacore writes)."""
    items = array(typecode, values)
    if not BIG_ENDIAN_HOST:
        items.byteswap()
    return items.tobytes()


def from_big_endian(data, typecode="q"):
    """Big-endian ``typecode`` items in ``data`` as an ``array`` (native order)."""
    items = array(typecode)
    items.frombytes(data)
    if not BIG_ENDIAN_HOST:
        items.byteswap()
    return items


class AipsReader:
    """Sequential reader over a bytes-like buffer."""

    def __init__(self, data, pos=0, end=None):
        self.buf = memoryview(data).cast("B")
        self.pos = pos
        self._limits = [len(self.buf) if end is None else end]

    @property
    def limit(self):
        """End of the innermost open object (or of the buffer)."""
        return self._limits[-1]

    def take(self, n):
        if n < 0 or self.pos + n > self.limit:
            raise FormatError(
                f"AipsIO data truncated: need {n} bytes at offset {self.pos}, "
                f"object ends at {self.limit}")
        start = self.pos
        self.pos += n
        return self.buf[start:self.pos]

    def _unpack(self, st):
        return st.unpack(self.take(st.size))[0]

    def u8(self):
        return self._unpack(_U8)

    def bool(self):
        return self._unpack(_U8) != 0

    def u32(self):
        return self._unpack(_U32)

    def i32(self):
        return self._unpack(_I32)

    def i64(self):
        return self._unpack(_I64)

    def u64(self):
        return self._unpack(_U64)

    def f64(self):
        return self._unpack(_F64)

    def string_bytes(self):
        return bytes(self.take(self.u32()))

    def string(self):
        """A String, decoded as UTF-8; undecodable bytes survive as surrogate escapes."""
        return self.string_bytes().decode("utf-8", "surrogateescape")

    def start(self, expected_type=None, outer=False):
        """Open an object and return its version; ``outer`` objects start with the magic."""
        if outer:
            magic = self.u32()
            if magic != MAGIC:
                raise FormatError(f"AipsIO magic missing (found 0x{magic:08x})")
        if len(self._limits) > MAX_DEPTH:
            raise FormatError(f"AipsIO objects nested more than {MAX_DEPTH} deep")
        length_at = self.pos
        length = self.u32()
        end = length_at + length
        if length < 12 or end > self.limit:
            raise FormatError(f"AipsIO object length {length} at offset {length_at} is invalid")
        self._limits.append(end)
        type_name = self.string()
        if expected_type is not None and type_name != expected_type:
            self._limits.pop()
            raise FormatError(f"AipsIO object is {type_name!r}, expected {expected_type!r}")
        self.last_type = type_name  # for callers that accept several object types
        return self.u32()

    def end(self):
        """Close the innermost object; it must have been consumed exactly."""
        end = self._limits.pop()
        if self.pos != end:
            raise FormatError(
                f"AipsIO object ends at offset {end} but its content ends at {self.pos}")

    def block_i64(self):
        """A ``Block<Int64>`` (std::vector<Int64>) as an ``array("q")``."""
        self.start("Block")
        n = self.u32()
        values = from_big_endian(self.take(8 * n))
        self.end()
        return values


class AipsWriter:
    """Builds canonical AipsIO bytes; ``start``/``end`` patch object lengths."""

    def __init__(self):
        self.out = bytearray()
        self._open = []

    def _pack(self, st, value):
        self.out += st.pack(value)

    def u8(self, v):
        self._pack(_U8, v)

    def bool(self, v):
        self._pack(_U8, 1 if v else 0)

    def u32(self, v):
        self._pack(_U32, v)

    def i32(self, v):
        self._pack(_I32, v)

    def i64(self, v):
        self._pack(_I64, v)

    def u64(self, v):
        self._pack(_U64, v)

    def f64(self, v):
        self._pack(_F64, v)

    def string(self, s):
        data = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
        self.u32(len(data))
        self.out += data

    def start(self, type_name, version, outer=False):
        if outer:
            self.u32(MAGIC)
        self._open.append(len(self.out))
        self.u32(0)
        self.string(type_name)
        self.u32(version)

    def end(self):
        at = self._open.pop()
        self.out[at:at + 4] = _U32.pack(len(self.out) - at)

    def block_i64(self, values):
        self.start("Block", 1)
        self.u32(len(values))
        self.out += big_endian_bytes(values)
        self.end()

    def getvalue(self):
        if self._open:
            raise ValueError("AipsIO object still open")
        return bytes(self.out)
