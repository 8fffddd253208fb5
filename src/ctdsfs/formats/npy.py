"""The ``.npy`` header that every NumPy view (pycauset, TileDB, bcolz) puts before its data.

Written as text, as numpy writes it, so opening a view needs no numpy import.
"""

import struct

MAGIC = b"\x93NUMPY"
ALIGN = 64  # the data starts at a multiple of this, so numpy.load(mmap_mode="r") maps it


def npy_header(descr, shape, fortran_order=False):
    """A .npy header: version 1.0, or 2.0 when the text needs a 4-byte length."""
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran_order}, 'shape': {tuple(shape)!r}, }}"
    for version, length in ((b"\x01\x00", struct.Struct("<H")), (b"\x02\x00", struct.Struct("<I"))):
        start = len(MAGIC) + len(version) + length.size
        padded = text + " " * (-(start + len(text) + 1) % ALIGN) + "\n"
        if len(padded) < 1 << (8 * length.size):
            return MAGIC + version + length.pack(len(padded)) + padded.encode("latin-1")
    raise ValueError("a .npy header longer than 4 GiB")
