"""bcolz carray and ctable rootdirs, and bloscpack files, shown as NumPy files.

A carray rootdir (as bcolz writes it; FORMAT-NOTES) holds ``meta/storage``
(JSON: dtype, cparams, chunklen), ``meta/sizes`` (JSON: shape, nbytes, cbytes),
``__attrs__`` (JSON) and ``data/__N.blp``: a 16-byte ``blpk`` header (u8
version, 3 reserved bytes, i64 chunk count 1) and one Blosc chunk of items
``N * chunklen`` onwards. A ctable rootdir holds ``__rootdirs__`` (the column
order), ``__attrs__`` and one carray rootdir per column. A standalone
bloscpack file has a 32-byte header (version, options, checksum kind,
typesize, chunk size, last chunk size, chunk count, spare offsets), an
optional metadata section, optional chunk offsets, then Blosc chunks each
followed by its checksum.

Shown as directories:

* carray: ``array.npy`` (a .npy header, then the decompressed items; a read
  decompresses only the chunks it touches, kept in a bounded cache),
  ``attrs.json``, ``meta.json`` (sizes, storage and every chunk's headers),
  ``chunks/N`` (each chunk decompressed) and ``raw/`` (the rootdir's own files);
* ctable: ``COLUMN.npy`` per column, ``table.npy`` (the rows as one structured
  array; ``table_.npy`` if a column is named ``table``), ``ctable.json`` (the row
  count, the rows file, each column's dtype and shape), ``attrs.json``, and
  ``COLUMN/`` as a carray;
* bloscpack file: ``data``, ``data.npy`` (if its metadata describes a NumPy array, as
  ``pack_ndarray_to_file`` writes it), ``header.json``, ``chunks/N``.

Everything read is untrusted: JSON files are small or refused, every needed
superchunk must exist before anything is shown (so no loop runs longer than
the files present), and a chunk's Blosc header must promise exactly the bytes
its place needs (never more than one chunk's worth, CHUNK_BYTES_MAX at most)
before python-blosc decompresses it (``blosc_chunk``); a bad chunk is EIO for
reads that touch it, with one log line naming its superchunk file and number.

With ``-o rw`` overwriting items of ``array.npy`` (or ``COLUMN.npy``)
recompresses each touched chunk with the array's own cparams and replaces
its superchunk file atomically (new file, fsync, rename, directory fsync);
writing whole items past the end of a carray appends them: the new chunks
first, ``meta/sizes`` last, so a crash leaves it never ahead of the data.
Everything else is refused (EPERM) with a log line.
"""

import os

from .bloscpack import BloscpackFile
from .carray import Carray
from .ctable import Ctable
from .view import CHUNK_BYTES_MAX, is_dir

__all__ = ["CHUNK_BYTES_MAX", "looks_like_directory", "open_file"]


def looks_like_directory(path):
    """A carray (meta/ and data/) or a ctable (__rootdirs__) rootdir."""
    if os.path.lexists(os.path.join(path, "__rootdirs__")):
        return True
    return is_dir(os.path.join(path, "meta")) and is_dir(os.path.join(path, "data"))


def open_file(path, *, verify_crc=True, writable=False):
    """A carray or ctable rootdir, or a bloscpack file (always read-only)."""
    path = os.fspath(path)
    if not is_dir(path):
        return BloscpackFile(path)
    if os.path.lexists(os.path.join(path, "__rootdirs__")):
        return Ctable(path, writable=writable)
    return Carray(path, writable=writable)
