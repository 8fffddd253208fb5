"""casacore MultiHDF5 (``.mfh5``), read through h5py.

Layout (FORMAT-NOTES; ``h5dump`` of casacore's own files in the fixtures):
the root group holds ``__MultiHDF5_Header__`` with the attributes
``blockSize`` (int64), ``hdrCounter`` (int64), ``names`` (strings, in file
order) and ``sizes`` (int64). Each virtual file is a group of that name with a
2-D uint8 dataset ``FileData`` of one row per block (casacore allocates one
row more than it needs); sizes come from ``sizes``, never from the dataset
shape. A nested MultiHDF5 is a group holding its own header group.

This version reads MultiHDF5; writing it is refused with a clear message.
"""

import logging
import threading

import h5py
import numpy as np

from ..container import Container, Usage
from ..errors import FormatError, NotPermitted, ReadOnlyError
from .multifile import name_problem

log = logging.getLogger(__name__)

HEADER = "__MultiHDF5_Header__"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def looks_like_hdf5(first_bytes):
    return first_bytes[:8] == HDF5_SIGNATURE


class MultiHDF5(Container):
    """A MultiHDF5 container (or a nested one: a group with its own header)."""

    format_name = "MultiHDF5"
    writable = False

    def __init__(self, group, label, *, depth=0, lock=None):
        self.group = group
        self.label = label
        self.depth = depth
        self.problems = []
        self._lock = lock or threading.RLock()
        self._nested = {}
        try:
            header = group[HEADER].attrs
            self.block_size = int(header["blockSize"])
            self.counter = int(header["hdrCounter"])
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in header["names"]]
            sizes = [int(s) for s in np.atleast_1d(header["sizes"])]
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise FormatError(f"{label}: not a casacore MultiHDF5 container ({exc})") from None
        if self.block_size <= 0 or len(names) != len(sizes):
            raise FormatError(f"{label}: MultiHDF5 header is inconsistent")
        self._entries = {}
        for name, size in zip(names, sizes):
            why = name_problem(name) or ("duplicate name" if name in self._entries else None)
            if why is None and name not in group:
                why = "no group for it"
            if why is None and size < 0:
                why = f"negative size {size}"
            if why is None and HEADER not in group[name]:
                rows = group[name]["FileData"].shape[0] if "FileData" in group[name] else 0
                if rows * self.block_size < size:
                    why = f"size {size} larger than its {rows} rows of data"
            if why:
                self.problems.append(f"entry {name!r} hidden: {why}")
                log.warning("%s: entry %r hidden: %s", label, name, why)
                continue
            self._entries[name] = size

    @classmethod
    def open(cls, path):
        try:
            handle = h5py.File(path, "r")
        except OSError as exc:
            raise FormatError(f"{path}: cannot open as HDF5 ({exc})") from None
        try:
            container = cls(handle, str(path))
        except BaseException:
            handle.close()
            raise
        container.file = handle
        return container

    def names(self):
        return list(self._entries)

    def entry_size(self, key):
        try:
            return self._entries[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def entry_blocks(self, key):
        return -(-self.entry_size(key) // self.block_size)

    def usage(self):
        return Usage(self.block_size, sum(self.entry_blocks(n) for n in self._entries), 0)

    def read(self, key, offset, size):
        end = min(offset + size, self.entry_size(key))
        if offset >= end:
            return b""
        bs = self.block_size
        first, last = offset // bs, (end - 1) // bs
        with self._lock:
            rows = self.group[key]["FileData"][first:last + 1]
        data = rows.tobytes()
        return data[offset - first * bs:end - first * bs]

    def _open_nested(self, name):
        self.entry_size(name)  # FileNotFoundError for names the header does not list
        group = self.group[name]
        if HEADER not in group:
            return None
        return MultiHDF5(group, f"{self.label}/{name}", depth=self.depth + 1, lock=self._lock)

    def describe(self):
        return {"container": self.label, "format": "MultiHDF5", "block_size": self.block_size,
                "header_counter": self.counter,
                "files": [{"name": n, "size": s, "blocks": self.entry_blocks(n),
                           "nested": self.nested(n) is not None}
                          for n, s in self._entries.items()],
                "problems": list(self.problems)}

    def reload_if_changed(self):
        return False

    def _refuse(self, *args):
        raise ReadOnlyError(f"{self.label}: writing MultiHDF5 is not supported yet")

    create = write = truncate = remove = rename = make_nested = _refuse

    @property
    def dirty(self):
        return False

    def commit(self):
        return False

    def close(self):
        handle = getattr(self, "file", None)
        if handle is not None:
            handle.close()


def open_multihdf5(path, writable):
    if writable:
        raise NotPermitted(f"{path}: MultiHDF5 containers mount read-only in this version")
    return MultiHDF5.open(path)
