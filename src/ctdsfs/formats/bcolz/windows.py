"""Where a carray's chunks are decoded: side by side, in windows of consecutive chunks.

The kernel reads array.npy in pieces of up to 1 MiB that start on its pages, and the
.npy header shifts the items off them: nearly every piece takes the end of one chunk
and the start of the next. Chunks decoded next to each other in one buffer answer such
a piece with one view, where chunks decoded apart need a copy of the piece (and fresh
memory for it). A window starts on a huge page's border, so its memory comes in
huge pages (one page fault per 2 MiB, not per 4 KiB).
"""

import threading
from collections import OrderedDict

import numpy as np

from ...io.buffers import huge_page_buffer

WINDOW_BYTES = 4 << 20  # chunks per window: as many as fit this (one at least)
WINDOWS_BYTES_KEPT = 32 << 20  # windows still taking chunks (one at least); a chunk of an
# older one gets its own buffer (a window the cache no longer holds a chunk of is freed)


class ChunkWindows:
    """Buffers for the decoded chunks of one carray, ``chunk_bytes`` each. A slot of a
    window is handed out once only: bytes a reader may still hold are never written
    over (a chunk decoded again gets a buffer of its own)."""

    def __init__(self, chunk_bytes):
        self.chunk_bytes = chunk_bytes
        self.per_window = max(1, WINDOW_BYTES // chunk_bytes)
        self.kept = max(1, WINDOWS_BYTES_KEPT // (self.per_window * chunk_bytes))
        self._windows = OrderedDict()  # number -> (buffer, {slot: the view decoded there})
        self._lock = threading.Lock()

    def place(self, number, new_window):
        """``(buffer, keep)``: where chunk ``number`` is to be decoded, and ``keep(view)``
        to call with the view of its decoded bytes (what ``joined`` recognises). Without
        ``new_window`` (a reader jumping about: a window's fresh pages would cost more
        than the copy they save), a chunk whose window is not there gets a buffer of its
        own, which the allocator hands out again once it is dropped."""
        index, slot = divmod(number, self.per_window)
        with self._lock:
            window = self._windows.get(index)
            if window is None and not new_window:
                return np.empty(self.chunk_bytes, np.uint8), lambda view: None
            if window is None:
                window = self._windows[index] = (
                    huge_page_buffer(self.per_window * self.chunk_bytes), {})
                while len(self._windows) > self.kept:
                    self._windows.popitem(last=False)
            buffer, views = window
            if slot in views:
                return np.empty(self.chunk_bytes, np.uint8), lambda view: None
            views[slot] = None
        start = slot * self.chunk_bytes

        def keep(view):
            with self._lock:
                views[slot] = view
        return buffer[start:start + self.chunk_bytes], keep

    def joined(self, first, views):
        """One read-only view of the decoded chunks ``first``, ``first + 1``, ... whose
        views are ``views`` if they lie side by side in one window, else None."""
        index, slot = divmod(first, self.per_window)
        with self._lock:
            window = self._windows.get(index)
            if window is None or slot + len(views) > self.per_window:
                return None
            buffer, kept = window
            if any(kept.get(slot + k) is not view for k, view in enumerate(views)):
                return None
        start = slot * self.chunk_bytes
        end = start + (len(views) - 1) * self.chunk_bytes + len(views[-1])
        return memoryview(buffer[start:end]).toreadonly()
