"""Atomic commits for a file that a library rewrites in place (HDF5), by a redo journal.

HDF5 updates its metadata in place and writes evicted cache entries whenever
it likes, so a process killed between two flushes leaves a file mixing two
states. :class:`JournaledFile` is the file object h5py's ``fileobj`` driver
talks to instead of the real file:

* between commits, nothing the committed state uses is touched: writes below
  the committed size land in an in-memory overlay of pages; writes past it go
  straight to the file (the committed state does not reach there), and a
  shrink only lowers the logical size;
* ``commit()`` fsyncs the file, writes every overlay page and the new size to
  ``PATH.ctdsfs-journal`` with a CRC, fsyncs it and its directory (the commit
  point), copies the pages into the file, sets its size, fsyncs, and removes
  the journal (fsyncing the directory again, so an old journal can never
  come back and be replayed over a newer state);
* whoever opens the file next replays a complete journal (a writer into the
  file, a reader only into its view) and ignores an incomplete one.

A crash at any moment thus leaves the last commit or the next one, as
MultiFile's copy-on-write does. The journal is as untrusted as the file: it is
replayed only when its CRC holds and every page lies inside the file.
"""

import errno
import os
import struct
import zlib

from ..errors import ContainerFull, CtdsfsError, FormatError
from .store import fsync_path, lock_for_writing, open_if_regular, write_synced

PAGE = 4096
JOURNAL_SUFFIX = ".ctdsfs-journal"
MAGIC = b"CTDSFSJ1"
HEAD = struct.Struct("<8sQQQQ")  # magic, new size, zeroed range (from, to), page count
TAIL = struct.Struct("<8sI")  # magic again, CRC-32 of everything before it
PAGE_HEAD = struct.Struct("<Q")  # page number; PAGE bytes follow
ZERO_CHUNK = 1 << 20


def journal_path(path):
    return os.fspath(path) + JOURNAL_SUFFIX


def _fsync_directory(path):
    """The directory holding ``path``: so the journal's appearing or going lasts."""
    fsync_path(os.path.dirname(os.path.abspath(path)))


def read_journal(path, file_size):
    """``(new size, (zero from, zero to), {page: bytes})`` of a complete journal, or None.

    An incomplete journal (torn by a crash before its commit point) is None;
    one that is complete but does not fit the file is refused.
    """
    try:
        with os.fdopen(open_if_regular(journal_path(path), follow=True), "rb") as f:
            # A journal of this file holds at most one record per page of it.
            pages = -(-file_size // PAGE)
            data = f.read(HEAD.size + pages * (PAGE_HEAD.size + PAGE) + TAIL.size + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CtdsfsError(f"{journal_path(path)}: {exc.strerror}") from None
    if len(data) < HEAD.size + TAIL.size:
        return None
    magic, size, zero_from, zero_to, count = HEAD.unpack_from(data)
    end_magic, crc = TAIL.unpack_from(data, len(data) - TAIL.size)
    if magic != MAGIC or end_magic != MAGIC or zlib.crc32(data[:-TAIL.size]) != crc:
        return None
    record = PAGE_HEAD.size + PAGE
    if len(data) != HEAD.size + count * record + TAIL.size:
        raise FormatError(f"{journal_path(path)}: journal length does not match its page count")
    if size > file_size or not zero_from <= zero_to <= size:
        raise FormatError(f"{journal_path(path)}: journal reaches past the file "
                          f"({file_size} bytes): not this file's journal")
    pages = {}
    for i in range(count):
        at = HEAD.size + i * record
        page = PAGE_HEAD.unpack_from(data, at)[0]
        if page * PAGE >= size:
            raise FormatError(f"{journal_path(path)}: journal page {page} lies past its size")
        pages[page] = data[at + PAGE_HEAD.size:at + record]
    return size, (zero_from, zero_to), pages


def recover(path, fd):
    """Finish a commit a crash interrupted (replay a complete journal), drop a torn one.

    The caller holds the file's write lock. True if a commit was replayed.
    """
    found = read_journal(path, os.fstat(fd).st_size)
    if found is not None:
        _apply(fd, *found)
    if os.path.lexists(journal_path(path)):
        os.unlink(journal_path(path))
        _fsync_directory(path)
    return found is not None


def _apply(fd, size, zeroed, pages):
    """The journal's changes into the file: the zeroed range, the pages, the size."""
    zeros = bytes(ZERO_CHUNK)
    for offset in range(zeroed[0], zeroed[1], ZERO_CHUNK):
        os.pwrite(fd, zeros[:min(ZERO_CHUNK, zeroed[1] - offset)], offset)
    for page, data in sorted(pages.items()):
        os.pwrite(fd, data[:max(0, min(PAGE, size - page * PAGE))], page * PAGE)
    os.ftruncate(fd, size)
    os.fsync(fd)


class JournaledFile:
    """The file object h5py reads and writes through (``h5py.File(JournaledFile(...))``).

    Writable: takes an exclusive advisory lock (a second writer is refused),
    replays what a crashed writer left, and keeps changes in memory until
    :meth:`commit`. Read-only: shows the file as a complete journal beside it
    says it is (a writer died while copying its pages in), changing nothing.
    """

    def __init__(self, path, writable):
        self.path = os.fspath(path)
        self.writable = writable
        self.fd = open_if_regular(self.path, os.O_RDWR if writable else os.O_RDONLY,
                                  follow=True)
        try:
            if writable:
                lock_for_writing(self.fd, self.path)
                recover(self.path, self.fd)
                replayed = None
            else:
                replayed = read_journal(self.path, os.fstat(self.fd).st_size)
        except BaseException:
            os.close(self.fd)
            raise
        self.committed_size = os.fstat(self.fd).st_size
        self.pages = {}  # page number -> bytearray, for pages below committed_size
        self.cut = (self.committed_size, self.committed_size)  # committed bytes cut off
        if replayed is not None:
            self.committed_size, self.cut, pages = replayed
            self.pages = {p: bytearray(d) for p, d in pages.items()}
        self.size = self.committed_size
        self.pos = 0

    @property
    def pending_bytes(self):
        """Memory the overlay holds until the next commit."""
        return len(self.pages) * PAGE

    # -- the file-object protocol of h5py's fileobj driver

    def seek(self, offset, whence=os.SEEK_SET):
        if whence == os.SEEK_END:
            offset += self.size
        elif whence == os.SEEK_CUR:
            offset += self.pos
        self.pos = offset
        return offset

    def tell(self):
        return self.pos

    def read(self, size=-1):
        buf = bytearray(max(0, self.size - self.pos) if size < 0 else size)
        self.readinto(buf)
        return bytes(buf)

    def readinto(self, buf):
        """Fill ``buf`` from the current position; bytes past the end read as zeros
        (as HDF5's own drivers do)."""
        view = memoryview(buf).cast("B")
        offset, n = self.pos, len(view)
        self.pos += n
        end = min(offset + n, self.size)
        view[max(0, end - offset):] = bytes(n - max(0, end - offset))
        if offset >= end:
            return n
        cut_from, cut_to = self.cut
        if not self.pages and (end <= cut_from or offset >= cut_to):
            self._pread_into(view[:end - offset], offset)
            return n
        pos = offset
        while pos < end:
            page, start = divmod(pos, PAGE)
            stop = min(end, (page + 1) * PAGE)
            out = view[pos - offset:stop - offset]
            data = self.pages.get(page)
            if data is not None:
                out[:] = data[start:start + len(out)]
            else:
                self._pread_into(out, pos)
                zero_from, zero_to = max(cut_from, pos), min(cut_to, stop)
                if zero_from < zero_to:
                    out[zero_from - pos:zero_to - pos] = bytes(zero_to - zero_from)
            pos = stop
        return n

    def _pread_into(self, view, offset):
        got = 0
        while got < len(view):
            part = os.preadv(self.fd, [view[got:]], offset + got)
            if part == 0:
                view[got:] = bytes(len(view) - got)
                return
            got += part

    def write(self, data):
        if not self.writable:
            raise OSError(errno.EBADF, "the file is open read-only")
        view = memoryview(data).cast("B")
        offset, n = self.pos, len(view)
        self.pos += n
        # Pages the committed state reaches into go to the overlay, whole.
        split = min(max(offset, -(-self.committed_size // PAGE) * PAGE), offset + n)
        pos = offset
        while pos < split:
            page, start = divmod(pos, PAGE)
            stop = min(split, (page + 1) * PAGE)
            self._page(page)[start:start + stop - pos] = view[pos - offset:stop - offset]
            pos = stop
        tail = view[split - offset:]
        while tail:  # past the committed size, where the committed state never looks
            done = os.pwrite(self.fd, tail, split)
            tail, split = tail[done:], split + done
        self.size = max(self.size, offset + n)
        return n

    def _page(self, page):
        """The overlay page, loaded with what the file (as seen now) holds there."""
        data = self.pages.get(page)
        if data is None:
            data = bytearray(PAGE)
            saved, self.pos = self.pos, page * PAGE
            self.readinto(data)
            self.pos = saved
            self.pages[page] = data
        return data

    def truncate(self, size=None):
        size = self.pos if size is None else size
        if size < self.size:
            partial = self.pages.get(size // PAGE)
            if partial is not None:
                partial[size % PAGE:] = bytes(PAGE - size % PAGE)
            for page in [p for p in self.pages if p * PAGE >= size]:
                del self.pages[page]
            if size < self.committed_size:  # committed bytes past it now read as zeros
                self.cut = (min(self.cut[0], size), self.committed_size)
        # Past the committed size the file itself follows (zeros when it grows).
        os.ftruncate(self.fd, max(size, self.committed_size))
        self.size = size
        return size

    def flush(self):
        """Nothing: durability is :meth:`commit`'s business."""

    # -- committing

    def commit(self):
        """Make the current state the committed one, atomically (module docstring)."""
        if not self.writable:
            return
        os.fsync(self.fd)
        zeroed = (min(self.cut[0], self.size), min(self.cut[1], self.size))
        pages = {p: d for p, d in self.pages.items() if p * PAGE < self.size}
        if pages or zeroed[0] < zeroed[1] or self.size < self.committed_size:
            try:
                self._write_journal(zeroed, pages)
            except OSError as exc:  # before the commit point: the file is as it was
                if os.path.lexists(journal_path(self.path)):
                    os.unlink(journal_path(self.path))
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ContainerFull(f"{self.path}: no space left on the disk for the "
                                        f"commit's journal ({len(pages) * PAGE} bytes)") from None
                raise
            _apply(self.fd, self.size, zeroed, pages)
            os.unlink(journal_path(self.path))
            _fsync_directory(self.path)
        self.pages = {}
        self.committed_size = self.size
        self.cut = (self.size, self.size)

    def _write_journal(self, zeroed, pages):
        parts = [HEAD.pack(MAGIC, self.size, *zeroed, len(pages))]
        for page in sorted(pages):
            parts += (PAGE_HEAD.pack(page), bytes(pages[page]))
        body = b"".join(parts)
        body += TAIL.pack(MAGIC, zlib.crc32(body))
        write_synced(journal_path(self.path), body)
        _fsync_directory(self.path)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
