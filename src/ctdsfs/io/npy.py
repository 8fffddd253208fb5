"""The ``.npy`` header that every NumPy view (pycauset, TileDB, bcolz) puts before its data.

Written as text, as numpy writes it, so opening a view needs no numpy import.
"""

import struct

MAGIC = b"\x93NUMPY"
ALIGN = 64  # the data starts at a multiple of this, so numpy.load(mmap_mode="r") maps it


def npy_header(descr, shape, fortran_order=False):
    """A .npy header as NumPy writes it: version 1.0, 2.0 when the text needs a 4-byte
    length, 3.0 (UTF-8 text) when it is not latin-1 (a field name such as 'δ')."""
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran_order}, 'shape': {tuple(shape)!r}, }}"
    for version, length, encoding in ((b"\x01\x00", struct.Struct("<H"), "latin-1"),
                                      (b"\x02\x00", struct.Struct("<I"), "latin-1"),
                                      (b"\x03\x00", struct.Struct("<I"), "utf-8")):
        try:
            raw = text.encode(encoding)
        except UnicodeEncodeError:
            continue
        start = len(MAGIC) + len(version) + length.size
        padded = raw + b" " * (-(start + len(raw) + 1) % ALIGN) + b"\n"
        if len(padded) < 1 << (8 * length.size):
            return MAGIC + version + length.pack(len(padded)) + padded
    raise ValueError("a .npy header longer than 4 GiB")
