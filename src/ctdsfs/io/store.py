"""Where a block container's bytes live: a real file, or a virtual file of a parent container.

This is casacore's layering (a MultiFile sits on a FiledesIO or on an MFFileIO
of its parent): a nested container does its block I/O through its parent, so
the parent's CRCs, copy-on-write and commit cover the child too.
"""

import contextlib
import errno
import fcntl
import mmap
import os
import queue
import stat
import threading

from ..errors import CtdsfsError, FormatError

UNCACHED_MIN = 256 << 10  # smaller writes are better absorbed by the page cache
DIRECT_ALIGN = 4096  # O_DIRECT needs offsets, lengths and memory aligned to this
DIRECT_BUFFER = 8 << 20  # consecutive bulk writes are gathered up to this size
DIRECT_BUFFERS = 3
READ_AROUND = 128 << 10  # a small read of a read-only file brings in its whole window


class DirectWriter:
    """Large aligned writes done behind the caller's back, with O_DIRECT.

    Copying written data into the page cache costs a FUSE daemon more CPU
    than anything else it does per byte. Here the bytes are copied into one
    of a few page-aligned buffers (consecutive writes fill the same one) and
    a worker thread writes each buffer with O_DIRECT, so the daemon takes in
    the next request while the disk writes. ``drain()`` is the barrier that
    every other operation on the file passes first; a failed write stays
    reported until the container gives up (so no commit can follow it). A
    file system that refuses O_DIRECT (EINVAL) gets ordinary writes.
    """

    def __init__(self, direct_fd, fallback_fd):
        self.fd = direct_fd
        self.fallback_fd = fallback_fd
        self.error = None
        self._lock = threading.Lock()
        self._free = queue.Queue()
        for _ in range(DIRECT_BUFFERS):
            self._free.put(mmap.mmap(-1, DIRECT_BUFFER))
        self._work = queue.Queue()
        self._filling = None  # [file offset, buffer, bytes in it]
        self._thread = threading.Thread(target=self._run, name="ctdsfs-direct-writes",
                                         daemon=True)
        self._thread.start()

    def write(self, offset, data):
        view = memoryview(data).cast("B")
        with self._lock:
            while view:
                f = self._filling
                if f is not None and (f[0] + f[2] != offset or f[2] == DIRECT_BUFFER):
                    self._work.put(f)
                    f = self._filling = None
                if f is None:
                    f = self._filling = [offset, self._free.get(), 0]
                n = min(len(view), DIRECT_BUFFER - f[2])
                f[1][f[2]:f[2] + n] = view[:n]
                f[2] += n
                offset += n
                view = view[n:]

    def continues(self, offset):
        """Whether a write at ``offset`` would extend the buffer being gathered."""
        f = self._filling
        return f is not None and f[0] + f[2] == offset

    def drain(self, raise_error=True):
        """Wait until every write so far is on disk (or failed: then raise, if asked)."""
        with self._lock:
            if self._filling is not None:
                self._work.put(self._filling)
                self._filling = None
        self._work.join()
        if raise_error and self.error is not None:
            raise OSError(self.error.errno, f"an earlier write failed: {self.error.strerror}")

    def _run(self):
        while (item := self._work.get()) is not None:
            offset, buf, length = item
            try:
                if self.error is None:
                    self._write(offset, memoryview(buf)[:length])
            except OSError as exc:
                self.error = exc
            finally:
                self._free.put(buf)
                self._work.task_done()
        self._work.task_done()

    def _write(self, offset, view):
        if self.fd >= 0:
            try:
                n = os.pwrite(self.fd, view, offset)
                view, offset = view[n:], offset + n
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.fd)
                self.fd = -1  # the file system refuses O_DIRECT after all
        while view:
            n = os.pwrite(self.fallback_fd, view, offset)
            view, offset = view[n:], offset + n

    def close(self):
        self.drain(raise_error=False)
        self._work.put(None)
        self._thread.join()
        if self.fd >= 0:
            os.close(self.fd)


def fsync_path(path):
    """fsync a file or directory by its path (a directory: so a new or removed name lasts)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_KINDS = ((stat.S_ISLNK, "a symbolic link (never followed)"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode):
    """What a file of ``mode`` that is not a regular file is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def open_if_regular(path, flags=os.O_RDONLY, *, dir_fd=None, what=None, follow=False):
    """A descriptor of ``path`` opened with ``flags``, only if ``path`` itself is a regular
    file. It is first reached with ``O_PATH | O_NOFOLLOW``, which opens nothing (opening a
    FIFO would block the daemon, a device would run its driver), and a link, directory,
    FIFO, socket or device there is refused with a one-line FormatError naming ``what``
    (default: the path); a regular file is then opened through that same descriptor, so
    what is opened is what was looked at. A failure to reach ``path`` stays an OSError.
    With ``follow``, a link is followed to what it names (a container the user named, and
    the files beside it), which is then held to the same rule."""
    seen = os.open(path, os.O_PATH | (0 if follow else os.O_NOFOLLOW) | os.O_CLOEXEC,
                   dir_fd=dir_fd)
    try:
        mode = os.fstat(seen).st_mode
        if not stat.S_ISREG(mode):
            raise FormatError(f"{what or path}: {kind_of(mode)}, not read")
        # (the reopening follows /proc's link to that very file: O_NOFOLLOW would refuse it)
        return os.open(f"/proc/self/fd/{seen}", flags & ~os.O_NOFOLLOW | os.O_CLOEXEC)
    finally:
        os.close(seen)


def open_regular(path, what=None):
    """A read-only descriptor of ``path``, which must be a regular file. Links are never
    followed: a directory format's tree is untrusted, and a link in it could hand out any
    file the daemon may read. Failures are FormatErrors naming ``what`` (default: the path)."""
    what = what or path
    return regular_or_refused(lambda: open_if_regular(path, what=what), what)


def regular_or_refused(opener, what):
    """The descriptor ``opener()`` (:func:`open_if_regular`) gives; a failure to open is a
    one-line FormatError naming ``what`` too."""
    try:
        return opener()
    except OSError as exc:
        raise FormatError(f"{what}: {exc.strerror}") from None


def read_small(path, limit, what=None):
    """The whole of ``path`` (see open_regular), refused if it holds more than ``limit`` bytes."""
    what = what or path
    return read_whole(open_regular(path, what), limit, what)


def read_whole(fd, limit, what):
    """All bytes of open file ``fd`` (then closed), refused if more than ``limit``."""
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise FormatError(f"{what}: {size} bytes, more than the {limit} ctdsfs reads")
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def create_exclusive(path, mode=0o644):
    """A new file ``path`` open for writing: a leftover of that name (a crash's temporary,
    or a hard or symbolic link someone planted there) is unlinked first, never opened, and
    the file is made with O_EXCL, so no write can land in an existing file."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   mode)


def preadv_all(fd, buffer, offset):
    """Bytes of file descriptor ``fd`` from ``offset`` into ``buffer`` until it is full or
    the file ends: their count."""
    view, done = memoryview(buffer).cast("B"), 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def read_direct(fd, buffer):
    """Bytes of file descriptor ``fd`` from its start into ``buffer`` (page-aligned, its
    length a multiple of DIRECT_ALIGN) until it is full or the file ends, read past the
    page cache (O_DIRECT): their count, or None if the file system refuses direct reads.
    The descriptor's flags are left as they were."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:
        return None
    view, done = memoryview(buffer).cast("B"), 0
    try:
        while done < len(view):
            n = os.preadv(fd, [view[done:]], done)
            done += n
            if n == 0 or n % DIRECT_ALIGN:  # (the file's end; past it, offsets are unaligned)
                break
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return None
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done


def write_synced(path, data):
    """Write ``data`` as the whole content of a new file ``path`` (create_exclusive) and
    fsync it."""
    write_all_synced(create_exclusive(path), data)


def write_all_synced(fd, data):
    """Write all of ``data`` to new file ``fd``, fsync it, close it."""
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_for_writing(fd, label):
    """Take the writer's advisory lock on ``fd``, or fail with a clear message if another
    writer has it."""
    # flock, not lockf: the lock must survive the fork of a daemonizing mount.
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
            raise CtdsfsError(f"{label}: another writer holds the container's lock "
                              "(is it mounted read-write elsewhere?)") from None
        raise


def open_store(path, *, writable=False, create=False, lock=False):
    """A :class:`FileStore`, a failure to open said in one line naming the file; with
    ``lock`` the writer's advisory lock is taken too."""
    try:
        store = FileStore(path, writable=writable, create=create)
    except OSError as exc:
        raise CtdsfsError(f"{os.fspath(path)}: {exc.strerror}") from None
    if lock:
        try:
            store.lock()
        except BaseException:
            store.close()
            raise
    return store


class FileStore:
    """A real file, read and written with ``pread``/``pwrite`` (no shared file position)."""

    def __init__(self, path, writable=False, create=False):
        self.label = os.fspath(path)
        flags = os.O_CLOEXEC | (os.O_RDWR if writable else os.O_RDONLY)
        if create:
            self.fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        else:
            self.fd = open_if_regular(path, flags, follow=True)
        self.writable = writable
        self._direct = None  # a DirectWriter from the first bulk write on; False: none
        self._windows_read = None  # a bit per READ_AROUND window asked for (read-only)

    def pread(self, offset, size):
        self._settle(raise_error=False)
        if size < READ_AROUND and not self.writable:
            self._read_around(offset)
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

    view = pread  # (bytes: os.pread makes them anyway)

    def _read_around(self, offset):
        """Ask the kernel for the whole aligned window of a small read, once per window, as
        a compressed file system reads its whole block: random small reads of a cold file
        then cost one disk read per window instead of one each, and the window's later
        reads come from the page cache (the kernel's own readahead sees no pattern in
        them and reads only what is asked)."""
        window = offset // READ_AROUND
        if self._windows_read is None:
            self._windows_read = bytearray(-(-max(self.size(), 1) // READ_AROUND) + 7 >> 3)
        byte, bit = divmod(window, 8)
        if byte >= len(self._windows_read) or self._windows_read[byte] >> bit & 1:
            return
        self._windows_read[byte] |= 1 << bit
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, window * READ_AROUND, READ_AROUND,
                             os.POSIX_FADV_WILLNEED)

    def cached(self, offset, size):
        """Unknown (the page cache may have them or not): a read may wait for the disk."""
        return False


    def pwrite(self, offset, data):
        self._settle()
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def pwrite_bulk(self, offset, data):
        """A large write that may complete later, bypassing the page cache (DirectWriter).

        Unaligned writes, small ones (unless they continue the bulk run being
        gathered, like a partial block completed by the next request), and
        file systems without O_DIRECT (tmpfs) take the ordinary path.
        """
        n = len(data)
        if offset % DIRECT_ALIGN or n % DIRECT_ALIGN:
            return self.pwrite(offset, data)
        if n < UNCACHED_MIN and not (self._direct and self._direct.continues(offset)):
            return self.pwrite(offset, data)
        if self._direct is None:
            try:
                fd = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
                self._direct = DirectWriter(fd, self.fd)
            except OSError:
                self._direct = False
        if not self._direct:
            return self.pwrite(offset, data)
        self._direct.write(offset, data)

    def _settle(self, raise_error=True):
        """Bulk writes still in flight land before anything else touches the file."""
        if self._direct:
            self._direct.drain(raise_error)

    def truncate(self, size):
        self._settle()
        os.ftruncate(self.fd, size)

    def extend(self, size):
        """Grow the file to ``size`` bytes of zeros, its disk space allocated now.

        Later writes below ``size`` (the O_DIRECT worker's too) then cannot meet
        a full disk. A full disk (ENOSPC) or a size the file system refuses
        (EFBIG) raises OSError and leaves the file as it was. Writes in flight
        lie below the old size, so they need not be waited for.
        """
        old = os.fstat(self.fd).st_size
        if size <= old:
            return
        disk = os.fstatvfs(self.fd)
        if size - old > disk.f_bavail * disk.f_frsize:  # at once, not after allocating it all
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        try:
            os.posix_fallocate(self.fd, old, size - old)
        except OSError:
            os.ftruncate(self.fd, old)  # give back what a failed call allocated
            raise

    def room(self, count, block_size):
        """Writes in place need no new space in a real file."""

    def fsync(self):
        self._settle()
        os.fsync(self.fd)

    def size(self):
        self._settle(raise_error=False)
        return os.fstat(self.fd).st_size

    def replaced(self):
        """A local file is changed in place, never swapped under an open descriptor: its
        header counter tells (a remote store's answer is its ETag)."""
        return False

    def lock(self):
        lock_for_writing(self.fd, self.label)

    def close(self):
        if self._direct:
            self._direct.close()
        self._direct = None
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
        return bytes(self.view(offset, size))

    def view(self, offset, size):
        """The parent's read as it comes (bytes or a read-only memoryview), not copied."""
        return self.parent.read(self.name, offset, size)

    def cached(self, offset, size):
        return self.parent.cached(self.name, offset, size)

    def pwrite(self, offset, data):
        self.parent.write(self.name, offset, data)

    pwrite_bulk = pwrite

    def truncate(self, size):
        self.parent.truncate(self.name, size)

    def extend(self, size):
        """Grow the virtual file with zeros (the parent checks its room first)."""
        if size > self.parent.entry_size(self.name):
            self.parent.truncate(self.name, size)

    def room(self, count, block_size):
        """Make sure ``count`` writes of ``block_size`` bytes, at multiples of it, find room
        in the parent: each may land on committed blocks, which get fresh ones."""
        self.parent.make_room(self.name, count, block_size)

    def fsync(self):
        """Durability comes from the parent's commit."""

    def size(self):
        return self.parent.entry_size(self.name)

    def close(self):
        """The parent owns the file."""
