"""Decoded pieces of a container (Blosc chunks, TileDB tiles), bounded by bytes.

Decoding is the expensive part of reading a compressed format, and the
kernel's readahead asks for the same piece several times at once: the cache
keeps recently decoded pieces, lets parallel readers of one piece wait for a
single decoding, and has pieces nobody has asked for yet decoded ahead. The worker
processes of a mount also share the pieces of the caches given a name, through the
mount's arena (``shared_arena``): a piece is decoded once for the mount, whichever
worker a reader's requests reach, and served from the arena's pages.
"""

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from ..errors import CtdsfsError
from .shared_arena import digest_of

CACHE_BYTES = 64 << 20  # decoded pieces kept per cache
ARENA_BYTES = 128 << 20  # decoded pieces the worker processes of a mount share

_POOLS = {}  # name -> the ThreadPoolExecutor of that name
_POOLS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_POOLS.clear)  # (a forked child has none of the threads)
_SHARERS = [1]  # processes whose caches share each cache's limit (worker processes)
_ARENA = [None]  # the SharedArena of the mount's worker processes, or None


def share_among(processes):
    """Keep each cache within ``1/processes`` of its limit: the mount's worker processes
    each have their own, and the mount as a whole stays within the limit."""
    _SHARERS[0] = processes


def share_through(arena):
    """Have the caches with a name share their pieces through ``arena`` (made before the
    worker processes fork; None: each process keeps its own)."""
    _ARENA[0] = arena


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
    size; for a fragment: its folder and its metadata file's): an entry of a source
    since replaced is never served, even if the inode is reused.

    A cache given a ``name`` shares its pieces with the other worker processes of the
    mount (those whose key and identity are plain values, the same in every process:
    strings, numbers, tuples of them): they are kept in the arena, not here, and what
    ``get`` gives of them is valid until the worker's next request. Pieces the arena
    does not take stay here.
    """

    def __init__(self, limit=CACHE_BYTES, name=None):
        self.limit = limit
        self.name = name
        self._pieces = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading = {}  # key -> the lock of the one thread decoding that piece

    def get(self, key, identity):
        """The piece, here or in the mount's arena; None if neither holds it."""
        with self._lock:
            entry = self._pieces.get(key)
            if entry is not None and entry[0] == identity:
                self._pieces.move_to_end(key)
                return entry[1]
        digest = self._digest(key, identity)
        return None if digest is None else _ARENA[0].get(digest)

    def joined(self, pieces):
        """One view of ``pieces`` (``get``'s) if the mount's arena holds them one after
        another, else None."""
        return None if _ARENA[0] is None or self.name is None else _ARENA[0].joined(pieces)

    def has(self, key, identity):
        """Whether the piece is decoded, here or in the mount's arena (nothing served)."""
        with self._lock:
            entry = self._pieces.get(key)
            if entry is not None and entry[0] == identity:
                return True
        digest = self._digest(key, identity)
        return digest is not None and _ARENA[0].held(digest)

    def get_or_load(self, key, identity, load, ahead=False):
        """The cached piece, or ``load()``'s: reads of one piece in parallel (the kernel's
        readahead sends several, other workers' readers too) wait for one decoding
        instead of each doing it. ``ahead`` (a piece decoded ahead of its reader): None,
        at once, if the mount's arena holds it or another worker decodes it."""
        data = self.get(key, identity)
        if data is None:
            with self._lock:
                loading = self._loading.setdefault(key, threading.Lock())
            try:
                with loading:
                    data = self.get(key, identity)
                    if data is None:
                        data = self._shared_or_loaded(key, identity, load, ahead)
            finally:
                self._done_loading(key, loading)
        return data

    def _digest(self, key, identity):
        """The piece's name in the mount's arena, or None if it is not shared."""
        if self.name is None or _ARENA[0] is None:
            return None
        return digest_of(self.name, key, identity)

    def _shared_or_loaded(self, key, identity, load, ahead=False):
        """The piece from the arena (another worker decoded it: it may be waited for while
        it does), or ``load()``'s, then shared through the arena or, if the arena cannot
        take it, kept here. ``ahead`` (nobody asked for the piece yet): None if the arena
        holds it or another worker decodes it."""
        digest = self._digest(key, identity)
        if digest is None:
            data = load()
            self.put(key, identity, data)
            return data
        arena = _ARENA[0]
        what, found = arena.look(digest, ahead)
        if what == "held":
            return found
        if what == "elsewhere":
            return None
        if what == "alone":
            data = load()
            self.put(key, identity, data)
            return data
        try:
            data = load()
        except BaseException:
            arena.abandon(found)
            raise
        if not arena.publish(found, data):
            self.put(key, identity, data)
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
                self._shared_or_loaded(key, identity, load, ahead=True)
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
