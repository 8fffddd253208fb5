"""Where a block container's bytes live: a real file, or a virtual file of a parent container.

This is casacore's layering (a MultiFile sits on a FiledesIO or on an MFFileIO
of its parent): a nested container does its block I/O through its parent, so
the parent's CRCs, copy-on-write and commit cover the child too.
"""

import errno
import fcntl
import mmap
import os

from ..errors import CtdsfsError


UNCACHED_MIN = 256 << 10  # smaller writes are better absorbed by the page cache
DIRECT_ALIGN = 4096  # O_DIRECT needs offsets, lengths and memory aligned to this


class FileStore:
    """A real file, read and written with ``pread``/``pwrite`` (no shared file position)."""

    def __init__(self, path, writable=False, create=False):
        self.label = os.fspath(path)
        flags = os.O_CLOEXEC | (os.O_RDWR if writable else os.O_RDONLY)
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o644)
        self.writable = writable
        self._direct_fd = None  # opened on the first bulk write; -1 where O_DIRECT fails
        self._bounce = None  # page-aligned copy of the data for O_DIRECT

    def pread(self, offset, size):
        data = os.pread(self.fd, size, offset)
        if len(data) == size or not data:
            return data
        parts, got = [data], len(data)  # a short read before EOF: keep reading
        while got < size:
            more = os.pread(self.fd, size - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def pwrite(self, offset, data):
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def pwrite_bulk(self, offset, data):
        """A large write, bypassing the page cache (O_DIRECT) where the file system allows.

        Copying into the page cache costs more CPU than anything else a FUSE
        daemon does per written byte; an aligned bounce buffer and O_DIRECT
        replace that copy with a cheap memcpy. Unaligned or small writes, and
        file systems without O_DIRECT (tmpfs), take the ordinary path.
        """
        n = len(data)
        if n < UNCACHED_MIN or offset % DIRECT_ALIGN or n % DIRECT_ALIGN or self._direct_fd == -1:
            return self.pwrite(offset, data)
        if self._direct_fd is None:
            try:
                self._direct_fd = os.open(f"/proc/self/fd/{self.fd}",
                                          os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:
                self._direct_fd = -1
                return self.pwrite(offset, data)
        if self._bounce is None or len(self._bounce) < n:
            self._bounce = mmap.mmap(-1, max(n, 4 << 20))
        self._bounce[:n] = data
        try:
            written = os.pwrite(self._direct_fd, memoryview(self._bounce)[:n], offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            os.close(self._direct_fd)
            self._direct_fd = -1  # the file system refuses O_DIRECT after all
            written = 0
        if written < n:
            self.pwrite(offset + written, memoryview(data)[written:])

    def truncate(self, size):
        os.ftruncate(self.fd, size)

    def fsync(self):
        os.fsync(self.fd)

    def size(self):
        return os.fstat(self.fd).st_size

    def lock(self):
        """Take the advisory write lock, or fail with a clear message if another writer has it."""
        # flock, not lockf: the lock must survive the fork of a daemonizing mount.
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
                raise CtdsfsError(f"{self.label}: another writer holds the container's lock "
                                  "(is it mounted read-write elsewhere?)") from None
            raise

    def close(self):
        if self._direct_fd is not None and self._direct_fd >= 0:
            os.close(self._direct_fd)
        self._direct_fd = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class VirtualFileStore:
    """A virtual file of a parent container: how nested containers are read and written."""

    writable = True

    def __init__(self, parent, name):
        self.parent = parent
        self.name = name
        self.label = f"{parent.label}/{name}"

    def pread(self, offset, size):
        return self.parent.read(self.name, offset, size)

    def pwrite(self, offset, data):
        self.parent.write(self.name, offset, data)

    pwrite_bulk = pwrite

    def truncate(self, size):
        self.parent.truncate(self.name, size)

    def fsync(self):
        """Durability comes from the parent's commit."""

    def size(self):
        return self.parent.entry_size(self.name)

    def close(self):
        """The parent owns the file."""
