"""The files of derived views (a bcolz rootdir's, a TileDB array's, a casacore table's
``columns/``): bytes made when first read, and files made of pieces decoded as reads
reach them. A DerivedView's entries are these, plain bytes, or nested containers."""

import json
import threading

import numpy as np

from ..errors import BlockError, CtdsfsError


class LazyBytes:
    """A read-only file whose bytes ``make()`` makes on first use, and again once
    ``version()`` (what they derive from) has changed."""

    def __init__(self, make, version=lambda: 0):
        self._make, self._version = make, version
        self._made = (None, None)

    def data(self):
        version = self._version()
        if self._made[0] != version or self._made[1] is None:
            self._made = (version, self._make())
        return self._made[1]

    def made(self):
        """Whether the bytes are made for what they derive from now (a read needs no work)."""
        made_for, data = self._made
        return data is not None and made_for == self._version()

    def size(self):
        return len(self.data())

    def read(self, offset, size):
        return self.data()[offset:offset + size]


def json_file(make, version=lambda: 0):
    """A LazyBytes of ``make()``'s value as indented JSON."""
    return LazyBytes(lambda: (json.dumps(make(), indent=2) + "\n").encode(), version)


class PiecedFile:
    """A file whose bytes are a header followed by the concatenation of pieces.

    ``layout()`` gives the header and every piece's size, worked out when the
    size or the bytes are first asked for; ``load(i)`` gives piece i (a tile,
    decoded when a read first touches it), and ``held(i)``, where given, whether
    piece i is in memory already. A layout that cannot be worked out is EIO for
    that file.
    """

    def __init__(self, layout, load, held=None):
        self._layout = layout
        self.load = load
        self._held = held
        self._ready = None
        self._lock = threading.Lock()

    def _parts(self):
        with self._lock:
            if self._ready is None:
                try:
                    header, sizes = self._layout()
                except BlockError:
                    raise
                except CtdsfsError as exc:
                    raise BlockError(str(exc), str(exc)) from None
                ends = np.cumsum(np.asarray(sizes, dtype=np.int64)) if len(sizes) \
                    else np.zeros(0, np.int64)
                self._ready = header, ends, len(header) + (int(ends[-1]) if len(ends) else 0)
            return self._ready

    @property
    def size(self):
        return self._parts()[2]

    def held(self, offset, size):
        """Whether ``read(offset, size)`` needs no piece that is not in memory (False while
        the layout is not worked out)."""
        ready = self._ready
        if ready is None or self._held is None:
            return False
        header, ends, total = ready
        pos, stop = max(offset, len(header)) - len(header), min(offset + size, total) - len(header)
        if pos >= stop:
            return True
        first, last = np.searchsorted(ends, [pos, stop - 1], side="right").tolist()
        return all(self._held(i) for i in range(first, last + 1))

    def read(self, offset, size):
        header, ends, total = self._parts()
        end = min(offset + size, total)
        if end <= len(header):  # small files are all header: bytes, as parsers want
            return header[offset:end]
        if offset >= len(header) and offset < end:  # within one piece: one copy
            pos, stop = offset - len(header), end - len(header)
            i = int(np.searchsorted(ends, pos, side="right"))
            start = int(ends[i - 1]) if i else 0
            if stop <= int(ends[i]):  # handed over without a copy
                return memoryview(self.load(i)).toreadonly()[pos - start:stop - start]
        out = bytearray(header[offset:end])
        pos = max(offset, len(header)) - len(header)
        stop = end - len(header)
        while pos < stop:
            i = int(np.searchsorted(ends, pos, side="right"))
            start = int(ends[i - 1]) if i else 0
            piece = self.load(i)
            out += memoryview(piece)[pos - start:min(stop, int(ends[i])) - start]
            pos = int(ends[i])
        return memoryview(out).toreadonly()  # the contract's read-only view: no second copy
