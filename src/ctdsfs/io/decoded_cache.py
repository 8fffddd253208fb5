"""Decoded pieces of a container (Blosc chunks, TileDB tiles), bounded by bytes.

Decoding is the expensive part of reading a compressed format, and the
kernel's readahead asks for the same piece several times at once: the cache
keeps recently decoded pieces, lets parallel readers of one piece wait for a
single decoding, and has pieces nobody has asked for yet decoded ahead.
"""

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from ..errors import CtdsfsError

CACHE_BYTES = 64 << 20  # decoded pieces kept per cache

_POOLS = {}  # name -> the ThreadPoolExecutor of that name
_POOLS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_POOLS.clear)  # (a forked child has none of the threads)
_SHARERS = [1]  # processes whose caches share each cache's limit (worker processes)


def share_among(processes):
    """Keep each cache within ``1/processes`` of its limit: the mount's worker processes
    each have their own, and the mount as a whole stays within the limit."""
    _SHARERS[0] = processes


def shared_pool(name, workers):
    """The process's one pool of threads called ``name`` (``workers`` of them, at most one
    per core), made on first use: the containers of one kind share it to decode pieces
    ahead of their readers, and a mount that never reads ahead starts no thread."""
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(
                max_workers=min(workers, os.cpu_count() or 2), thread_name_prefix=name)
        return pool


class DecodedCache:
    """Decoded pieces, least recently used dropped first, at most ``limit`` bytes in all
    (one piece more than that fits is kept, so a piece larger than the limit is too).

    Every entry is valid for one ``identity`` of its source (for a file: inode, mtime,
    size; for a fragment: the object that read it): an entry of a source since
    replaced is never served, even if the inode is reused.
    """

    def __init__(self, limit=CACHE_BYTES):
        self.limit = limit
        self._pieces = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading = {}  # key -> the lock of the one thread decoding that piece

    def get(self, key, identity):
        with self._lock:
            entry = self._pieces.get(key)
            if entry is None or entry[0] != identity:
                return None
            self._pieces.move_to_end(key)
            return entry[1]

    def get_or_load(self, key, identity, load):
        """The cached piece, or ``load()``'s: reads of one piece in parallel (the kernel's
        readahead sends several) wait for one decoding instead of each doing it."""
        data = self.get(key, identity)
        if data is None:
            with self._lock:
                loading = self._loading.setdefault(key, threading.Lock())
            try:
                with loading:
                    data = self.get(key, identity)
                    if data is None:
                        data = load()
                        self.put(key, identity, data)
            finally:
                self._done_loading(key, loading)
        return data

    def load_ahead(self, key, identity, load, submit):
        """Have ``submit`` run ``load()`` for a piece nobody has asked for yet, unless it
        is cached or being decoded. It counts as being decoded from now on: readers
        that want it wait for that decoding, and asking again queues nothing."""
        with self._lock:
            entry = self._pieces.get(key)
            if key in self._loading or (entry is not None and entry[0] == identity):
                return
            loading = self._loading[key] = threading.Lock()
            loading.acquire()

        def run():
            try:
                self.put(key, identity, load())
            except CtdsfsError:
                pass  # a reader that wants the piece decodes it again and gets the error
            finally:
                self._done_loading(key, loading)
                loading.release()
        submit(run)

    def _done_loading(self, key, loading):
        """Forget ``loading`` as the lock of ``key``'s decoding, unless a newer decoding
        of the piece (one queued ahead since) holds that place now."""
        with self._lock:
            if self._loading.get(key) is loading:
                del self._loading[key]

    def put(self, key, identity, data):
        with self._lock:
            old = self._pieces.pop(key, None)
            if old is not None:
                self._bytes -= len(old[1])
            self._pieces[key] = (identity, data)
            self._bytes += len(data)
            while self._bytes > self.limit // _SHARERS[0] and len(self._pieces) > 1:
                self._bytes -= len(self._pieces.popitem(last=False)[1][1])
