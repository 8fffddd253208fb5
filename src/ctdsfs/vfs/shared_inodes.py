"""Inode numbers that every worker process of one mount agrees on.

Several processes serve one read-only mount (``-o workers=N``), and the kernel hands a
request naming an inode to whichever of them reads it first. So the numbers come
from one table the workers share: an append-only log in an anonymous file made before
the workers fork, of batches of names in one directory numbered in a row (a listing's
batch is one). A worker numbering nodes takes the log's lock, notes the headers of the
batches added since it last looked, and appends one of the names no worker numbered
yet; a worker asked about a number it has not seen finds its parent and name in the
log and looks the node up itself. A worker reads the names of a batch only once it
answers for their directory or one of their numbers: a walk that one worker answered
costs the others next to nothing.

The same file holds the digests of the lines logged once per mount (a bad block's),
so that the mount logs each once, whichever workers meet it; and a page the workers
share counts the reloads any of them made (another process committed to the
container): a worker reloads before it reads, if another did since it last looked.

The lock is ``flock`` on each worker's own opening of the file, so a worker killed
while holding it frees it; the log's length is written after the batch, so a batch
it was writing when it died is never read and is written over.
"""

import bisect
import fcntl
import hashlib
import mmap
import os
import struct
import threading

HEADER = struct.Struct("<QQ")  # next inode number, end of the records
# The first inode number, the parent's inode number, how many names, the bytes of the
# names that follow (joined by NUL; a name holding a NUL has a batch of its own).
BATCH = struct.Struct("<QQII")
READ_STEP = 1 << 20  # bytes of the log read at a time when catching up
LOGGED_SLOTS = 8192  # lines logged once per mount: a hash table of their digests
SLOT = struct.Struct("<Q")
RELOADS = struct.Struct("<Q")


class SharedInodes:
    """The table: ``number`` gives (or makes) the inode of a name in a directory, ``where``
    says which name in which directory an inode is."""

    def __init__(self, first_ino):
        """A new, empty table numbering from ``first_ino`` on (the root's is fixed)."""
        self._fd = os.memfd_create("ctdsfs-inodes", os.MFD_CLOEXEC)
        self._records = HEADER.size + LOGGED_SLOTS * SLOT.size  # where the records start
        os.pwrite(self._fd, HEADER.pack(first_ino, self._records), 0)
        os.ftruncate(self._fd, self._records)
        self._seen = self._records  # end of the records this process has read
        self._firsts = []  # the first inode number of each batch, in the log's order
        self._batches = []  # (parent ino, where its names are, their bytes, how many)
        self._unread = {}  # parent ino -> indexes of its batches whose names are not read
        self._by_parent = {}  # parent ino -> {name: ino}, of the batches read
        self._names = {}  # index of a batch read -> its names
        self._count = first_ino
        self._thread_lock = threading.Lock()
        self._lock_fd = None
        self._reloads = mmap.mmap(-1, mmap.PAGESIZE)  # (shared with the workers forked after)

    def after_fork(self):
        """In a worker: a lock of its own (an opening of the file flock tells from the
        other workers')."""
        self._lock_fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)

    def _locked(self, function, *args):
        with self._thread_lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                return function(*args)
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _catch_up(self):
        """Note the headers of the batches other workers appended since we last looked
        (both locks held; the log's end is written after a batch, so all before it is
        whole)."""
        next_ino, end = HEADER.unpack(os.pread(self._fd, HEADER.size, 0))
        self._count = next_ino
        offset = self._seen
        while offset < end:
            data = os.pread(self._fd, min(READ_STEP, end - offset), offset)
            at = 0
            while len(data) - at >= BATCH.size:
                first, parent, count, length = BATCH.unpack_from(data, at)
                index = self._note_batch(first, parent, offset + at + BATCH.size, length, count)
                self._unread.setdefault(parent, []).append(index)
                at += BATCH.size + length
            if at == 0:
                break
            offset += at
        self._seen = end
        return next_ino, end

    def _add(self, first, parent, names):
        """Know ``names`` (of directory ``parent``) as numbered from ``first`` on."""
        self._by_parent.setdefault(parent, {}).update(zip(names, range(first, first + len(names))))

    def _read(self, index):
        """The names of batch ``index`` (thread lock held; a batch is read once)."""
        names = self._names.get(index)
        if names is None:
            parent, offset, length, count = self._batches[index]
            text = os.pread(self._fd, length, offset).decode("utf-8", "surrogateescape")
            names = self._names[index] = text.split("\0") if count > 1 else [text]
            self._add(self._firsts[index], parent, names)
        return names

    def _children_of(self, parent):
        """``{name: ino}`` of directory ``parent``, as far as this process has the log."""
        for index in self._unread.pop(parent, ()):
            self._read(index)
        return self._by_parent.get(parent, {})

    def _note_batch(self, first, parent, offset, length, count):
        """Note a batch of the log (its names at ``offset``, ``length`` bytes): its index."""
        self._firsts.append(first)
        self._batches.append((parent, offset, length, count))
        return len(self._batches) - 1

    def _append(self, first, parent, names, offset, length):
        """Know a batch this process appends at ``offset`` (its names, ``length`` bytes)."""
        self._names[self._note_batch(first, parent, offset, length, len(names))] = names
        self._add(first, parent, names)

    def _number(self, parent, names):
        next_ino, end = self._catch_up()
        known = self._children_of(parent)
        new = [name for name in dict.fromkeys(names) if name not in known]
        joinable = [name for name in new if "\0" not in name]
        records, at = [], end
        for batch in ([joinable] if joinable else []) + [[n] for n in new if "\0" in n]:
            encoded = "\0".join(batch).encode("utf-8", "surrogateescape")
            records.append(BATCH.pack(next_ino, parent, len(batch), len(encoded)) + encoded)
            self._append(next_ino, parent, batch, at + BATCH.size, len(encoded))
            next_ino += len(batch)
            at += BATCH.size + len(encoded)
        if records:
            os.pwrite(self._fd, b"".join(records), end)
            os.pwrite(self._fd, HEADER.pack(next_ino, at), 0)
            self._seen = at
            self._count = next_ino
        known = self._by_parent[parent]
        return [known[name] for name in names]

    def number(self, parent, names, ahead=()):
        """The inode numbers of ``names`` in directory ``parent``, made for those no worker
        numbered yet; if any is made, those of the names ``ahead`` too (in one go)."""
        with self._thread_lock:
            known = self._children_of(parent)
            numbers = [known.get(name) for name in names]
        if None not in numbers:
            return numbers
        return self._locked(self._number, parent, [*names, *ahead])[:len(names)]

    def _where(self, ino):
        """``where`` as far as this process has the log (thread lock held)."""
        index = bisect.bisect_right(self._firsts, ino) - 1
        if index < 0 or ino - self._firsts[index] >= self._batches[index][3]:
            return None
        return self._batches[index][0], self._read(index)[ino - self._firsts[index]]

    def _caught_up_where(self, ino):
        self._catch_up()
        return self._where(ino)

    def where(self, ino):
        """``(parent ino, name)`` of inode ``ino``, or None if no worker numbered it."""
        with self._thread_lock:
            found = self._where(ino)
        if found is None:
            found = self._locked(self._caught_up_where, ino)
        return found

    def first_time(self, line):
        """Whether no worker logged ``line`` yet (if not, it counts as logged now); the
        table forgets every line once crowded (bounded memory)."""
        digest = int.from_bytes(hashlib.blake2b(line.encode("utf-8", "surrogateescape"),
                                                digest_size=8).digest(), "little") or 1
        return self._locked(self._note, digest)

    def _note(self, digest):
        slots = os.pread(self._fd, LOGGED_SLOTS * SLOT.size, HEADER.size)
        used = 0
        for i in range(LOGGED_SLOTS):
            at = (digest + i) % LOGGED_SLOTS
            value, = SLOT.unpack_from(slots, at * SLOT.size)
            if value == digest:
                return False
            if value == 0:
                break
            used += 1
        if used >= LOGGED_SLOTS // 2:
            os.pwrite(self._fd, bytes(LOGGED_SLOTS * SLOT.size), HEADER.size)
            at = digest % LOGGED_SLOTS
        os.pwrite(self._fd, SLOT.pack(digest), HEADER.size + at * SLOT.size)
        return True

    def reloaded(self):
        """This worker reloaded the tree: the others do before their next read."""
        RELOADS.pack_into(self._reloads, 0, self.reloads() + 1)

    def reloads(self):
        """How many reloads the workers counted (a number to compare with a later one)."""
        return RELOADS.unpack_from(self._reloads)[0]

    def count(self):
        """How many inode numbers the workers have given out (the root's included)."""
        self._locked(self._catch_up)
        return self._count - 1
