"""Which files of a MultiFile are plain, shared live by the processes serving one mount.

Telling a nested container from a plain file takes a read of the file's first bytes
(``index.py`` says why). A mount served by several worker processes hands a walk's
requests to whichever worker is idle, so without sharing, every worker would read the
first bytes of every file it is asked about, though another read them already. Here
a worker that finds a file plain marks it in memory shared with the others, and a
worker about to read a file's first bytes looks there first.

The table is an anonymous shared mapping made before the workers fork
(``enable``): a log of records, one per container opened, each its key (the
container file's identity, the path of the nested container in it and its header's
fingerprint, as the persistent index keys them) followed by one byte per entry in
the container's order, 1 once found plain. Only ever set from 0 to 1, by a process
that read the file and found it plain: a process dying mid-write loses a mark (that
file is read again), never makes a nested container look plain. Records are appended
under a lock (``lockf``: released by the kernel if its holder dies), the log's end
written after the record. The table is bounded: once full, new containers are no
longer shared (each process reads for itself, as without the table).
"""

import fcntl
import mmap
import os
import stat
import struct
import threading

TABLE_BYTES = 64 << 20  # the mapping's size (memory is used only as records fill it)
END = struct.Struct("<Q")  # the end of the records, at the start of the table
RECORD = struct.Struct("<II")  # key length, entry count; the key and the flags follow

_table = None  # the SharedPlainTable of this mount's processes (``enable``), or None


def enable():
    """Share what each process finds among the processes forked from now on (a mount's
    workers: called before they fork)."""
    global _table
    if _table is None:
        _table = SharedPlainTable()


def file_key(fd):
    """The identity of the container file open as ``fd`` (None: nothing shared), the
    part of a key that tells one file, and one state of it, from another."""
    if _table is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return f"{st.st_dev:x}:{st.st_ino:x}:{st.st_size:x}:{st.st_mtime_ns:x}:{st.st_ctime_ns:x}"


def flags_of(key, count):
    """The :class:`SharedFlags` of the container ``key`` of ``count`` entries, or None
    (nothing shared: no table, or it is full)."""
    if _table is None or key is None:
        return None
    return _table.flags(key, count)


class SharedFlags:
    """One container's marks: ``plain(i)`` says whether entry ``i`` was found plain,
    ``mark_plain(i)`` says it was."""

    __slots__ = ("_view", "_start", "count")

    def __init__(self, view, start, count):
        self._view = view
        self._start = start
        self.count = count

    def plain(self, i):
        return self._view[self._start + i] == 1

    def mark_plain(self, i):
        self._view[self._start + i] = 1


class SharedPlainTable:
    def __init__(self, size=TABLE_BYTES):
        self._fd = os.memfd_create("ctdsfs-plain", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED)
        self._size = size
        END.pack_into(self._map, 0, END.size)
        self._seen = END.size  # end of the records this process has read
        self._found = {}  # key -> SharedFlags, of the records read
        self._thread_lock = threading.Lock()

    def flags(self, key, count):
        with self._thread_lock:
            found = self._found.get(key)
            if found is None:
                fcntl.lockf(self._fd, fcntl.LOCK_EX)
                try:
                    self._catch_up()
                    found = self._found.get(key) or self._append(key, count)
                finally:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN)
        return found if found is not None and found.count == count else None

    def _catch_up(self):
        end, = END.unpack_from(self._map, 0)
        at = self._seen
        while at < end:
            length, count = RECORD.unpack_from(self._map, at)
            start = at + RECORD.size + length
            key = bytes(self._map[at + RECORD.size:start]).decode("utf-8", "surrogateescape")
            self._found[key] = SharedFlags(self._map, start, count)
            at = start + count
        self._seen = end

    def _append(self, key, count):
        encoded = key.encode("utf-8", "surrogateescape")
        at = self._seen
        start = at + RECORD.size + len(encoded)
        if start + count > self._size:
            return None
        RECORD.pack_into(self._map, at, len(encoded), count)
        self._map[at + RECORD.size:start] = encoded
        self._map[start:start + count] = bytes(count)  # (a dead writer's marks, cleared)
        END.pack_into(self._map, 0, start + count)
        self._seen = start + count
        found = self._found[key] = SharedFlags(self._map, start, count)
        return found
