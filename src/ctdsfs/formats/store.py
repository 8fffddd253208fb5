"""Where a block container's bytes live: a real file, or a virtual file of a parent container.

This is casacore's layering (a MultiFile sits on a FiledesIO or on an MFFileIO
of its parent): a nested container does its block I/O through its parent, so
the parent's CRCs, copy-on-write and commit cover the child too.
"""

import errno
import fcntl
import os

from ..errors import CtdsfsError


class FileStore:
    """A real file, read and written with ``pread``/``pwrite`` (no shared file position)."""

    def __init__(self, path, writable=False, create=False):
        self.label = os.fspath(path)
        flags = os.O_CLOEXEC | (os.O_RDWR if writable else os.O_RDONLY)
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o644)
        self.writable = writable

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

    def truncate(self, size):
        self.parent.truncate(self.name, size)

    def fsync(self):
        """Durability comes from the parent's commit."""

    def size(self):
        return self.parent.entry_size(self.name)

    def close(self):
        """The parent owns the file."""
