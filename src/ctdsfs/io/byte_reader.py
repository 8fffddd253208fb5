"""A bounded reader of little-endian fields from an untrusted byte string.

TileDB's schemas, footers and filter pipelines and pycauset's metadata map
read through it: a length or count from the data is checked against what is
left before anything is taken or allocated.
"""

import functools
import struct

from ..errors import FormatError


@functools.lru_cache(maxsize=64)
def _little_endian(fmt):
    return struct.Struct("<" + fmt)


class Reader:
    """Little-endian fields from an untrusted byte string; running off its end is a FormatError
    (``truncated``, formatted with ``what``, ``wanted`` and ``left``, says so)."""

    def __init__(self, data, what, truncated="{what}: truncated (wanted {wanted} bytes, "
                                              "{left} left)"):
        self.data = memoryview(data)
        self.pos = 0
        self.what = what
        self.truncated = truncated

    def left(self):
        return len(self.data) - self.pos

    def take(self, n):
        if n < 0 or n > self.left():
            raise FormatError(self.truncated.format(what=self.what, wanted=n, left=self.left()))
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def unpack(self, fmt):
        st = _little_endian(fmt)
        values = st.unpack(self.take(st.size))
        return values[0] if len(values) == 1 else values

    def count(self, fmt, item_bytes):
        """A count read as ``fmt``, refused if that many items of ``item_bytes`` cannot be left."""
        n = self.unpack(fmt)
        if n * item_bytes > self.left():
            raise FormatError(f"{self.what}: count {n} exceeds the {self.left()} bytes left")
        return n
