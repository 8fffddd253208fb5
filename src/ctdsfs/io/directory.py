"""A real directory as a container: its files' bytes and its subdirectories, nothing
translated. The translating directory source (``sources.directory``) builds on it, and
the formats show a directory's raw files with it (a TileDB fragment's, a bcolz rootdir's).

Symbolic links are never followed: entries are examined with ``lstat`` and opened
with ``O_NOFOLLOW``, a link shows as a link (``symlink_target``). FIFOs, sockets and
device nodes are hidden (one problem line each) and never opened: opening a FIFO
blocks until a writer comes, which would hang the whole mount, and a device's driver
would run. A file that turns into one after it was listed fails its reads with EIO
(see :func:`~ctdsfs.io.store.open_if_regular`).
"""

import errno
import logging
import os
import stat
import threading
from collections import OrderedDict

from ..container import Container, Usage
from ..errors import BlockError, CtdsfsError, FormatError, FSError, ReadOnlyError
from .store import kind_of, open_if_regular, preadv_all

log = logging.getLogger(__name__)

OPEN_FILES = 64  # file descriptors kept open for reads and writes


class UnlinkedFile:
    """A file removed while open: it lives on through its descriptor."""

    def __init__(self, fd):
        self.fd = fd


class PlainDirectory(Container):
    """A real directory. Entries are its files and subdirectories, sorted by name; no
    file in it is shown as anything but its bytes."""

    format_name = "directory"
    holds_links = True
    shown_raw = None  # why a recognised container is shown as this raw directory instead

    def __init__(self, path, *, writable=False, hide=()):
        self.path = os.fspath(path)
        self.label = self.path
        self.writable = writable
        # Real paths never shown (the mount point, when it lies inside the source:
        # looking at it would ask this very file system).
        self.hide = frozenset(hide)
        self.problems = []
        self.raw_reasons = {}  # name -> why a container there is shown raw (read-only)
        self._special = set()  # names of FIFOs, sockets and devices hidden (told once)
        self._lock = threading.RLock()
        self._fds = OrderedDict()  # name -> fd (O_RDWR when writable)
        self._nested = {}

    def _real(self, name):
        return os.path.join(self.path, name)

    def _fd(self, name):
        with self._lock:
            fd = self._fds.get(name)
            if fd is not None:
                self._fds.move_to_end(name)
                return fd
            shown_raw = self._shown_raw(name)
            flags = (os.O_RDWR if self.writable and not shown_raw else os.O_RDONLY) \
                | os.O_CLOEXEC | os.O_NOFOLLOW
            try:
                fd = open_if_regular(self._real(name), flags, what=f"{self.label}/{name}")
            except FormatError as exc:  # a FIFO, socket, device or link now: EIO, one line
                raise BlockError(str(exc)) from None
            self._fds[name] = fd
            while len(self._fds) > OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
            return fd

    def _forget_fd(self, name):
        fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def _check_writable(self):
        if not self.writable:
            raise ReadOnlyError(f"{self.label} is read-only")

    def _shown_raw(self, name):
        """Why file ``name`` is shown as its raw bytes though a format recognises it
        (None: it is not; a plain directory recognises nothing)."""
        return None

    def _check_file_writable(self, key):
        self._check_writable()
        why = self._shown_raw(key)
        if why:
            raise ReadOnlyError(f"{self.label}/{key}: read-only, shown raw ({why})")

    # -- reading

    def names(self):
        try:
            with os.scandir(self.path) as found:
                listed = [(e.name, _special_mode(e)) for e in found
                          if self._real(e.name) not in self.hide]
        except OSError as exc:
            raise CtdsfsError(f"{self.path}: {exc.strerror}") from None
        for name, mode in listed:
            if mode:
                self._hide_special(name, mode)
        return sorted(name for name, mode in listed if not mode)

    def _hide_special(self, name, mode):
        """Say once that ``name``, a FIFO, socket or device, is not shown."""
        with self._lock:
            if name in self._special:
                return
            self._special.add(name)
        why = f"{name!r} hidden: {kind_of(mode)}, never opened"
        self.problems.append(why)
        log.warning("%s: %s", self.label, why)

    def contains(self, name):
        real = self._real(name)
        if name in ("", ".", "..") or real in self.hide:
            return False
        try:
            return not _is_special(os.lstat(real).st_mode)
        except OSError:
            return False

    def _stat(self, key):
        if isinstance(key, UnlinkedFile):
            return os.fstat(key.fd)
        try:
            st = os.lstat(self._real(key))
        except FileNotFoundError:
            raise FileNotFoundError(key) from None
        if _is_special(st.st_mode):  # hidden from the listing
            raise FileNotFoundError(errno.ENOENT, f"{kind_of(st.st_mode)}, hidden", key)
        return st

    def entry_size(self, key):
        return self._stat(key).st_size

    def entry_blocks(self, key):
        return -(-self._stat(key).st_blocks * 512 // 4096)

    def usage(self):
        st = os.statvfs(self.path)
        return Usage(st.f_frsize, st.f_blocks, st.f_bfree)

    def read(self, key, offset, size):
        fd = key.fd if isinstance(key, UnlinkedFile) else self._fd(key)
        return os.pread(fd, size, offset)

    def read_into(self, key, offset, buffer):
        """``read`` into a writable buffer (the caller's, aligned as it likes): the count.
        A subclass whose files are not all the directory's sets it to None."""
        return preadv_all(key.fd if isinstance(key, UnlinkedFile) else self._fd(key), buffer,
                          offset)

    def symlink_target(self, name):
        try:
            return os.readlink(self._real(name))
        except OSError:  # not a link (EINVAL), or gone
            return None

    def _open_nested(self, name):
        real = self._real(name)
        if not is_kind(real, stat.S_ISDIR):
            return None
        return type(self)(real, writable=self.writable, hide=self.hide)

    def describe(self):
        files = [{"name": n, "size": self.entry_size(n), "nested": self.nested(n) is not None}
                 for n in self.names()]
        for entry in files:
            child = self.nested(entry["name"])
            why = getattr(child, "shown_raw", None) or self.raw_reasons.get(entry["name"])
            if child is not None and not why:
                entry["format"] = child.format_name
            if why:
                entry["shown_raw"] = why
        return {"container": self.label, "format": "directory", "files": files,
                "problems": list(self.problems)}

    def info_lines(self, info):
        """``ctdsfs info`` of a tree: each entry, the format it is shown as, or why it is raw."""
        def shown(entry):
            if entry.get("shown_raw"):
                return f"  (shown raw and read-only: {entry['shown_raw']})"
            return f"  ({entry['format']})" if entry.get("format") else ""
        return ([f"{info['container']}: {info['format']}"]
                + [f"    {f['size']:>10}  {f['name']}{'/' if f['nested'] else ''}{shown(f)}"
                   for f in info["files"]]
                + [f"  problem: {p}" for p in info["problems"]])

    def reload_if_changed(self):
        return False  # the kernel asks again for what a real directory holds

    # -- writing

    def _io(self, func, *args, key=None):
        with self._lock:
            self._check_file_writable(key)
            try:
                return func(*args)
            except OSError as exc:  # the real file system's answer, errno and all
                raise FSError(exc.errno, f"{self.path}: {exc.strerror}") from None

    def create(self, name):
        def run():
            os.close(os.open(self._real(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return self._io(run)

    def write(self, key, offset, data):
        def run():
            fd = key.fd if isinstance(key, UnlinkedFile) else self._fd(key)
            return os.pwrite(fd, data, offset)
        return self._io(run, key=key)

    def truncate(self, key, size):
        def run():
            os.ftruncate(key.fd if isinstance(key, UnlinkedFile) else self._fd(key), size)
        return self._io(run, key=key)

    def remove(self, name, keep_open=False):
        def run():
            real = self._real(name)
            child = self._nested.pop(name, None)
            if is_kind(real, stat.S_ISDIR):
                os.rmdir(real)
                return None
            keep = UnlinkedFile(os.dup(self._fd(name))) if keep_open else None
            self._forget_fd(name)
            os.unlink(real)
            if child is not None:
                child.close()
            return keep
        return self._io(run)

    def release(self, key):
        os.close(key.fd)

    def rename(self, old, new):
        def run():
            self._forget_fd(old)
            self._forget_fd(new)
            os.replace(self._real(old), self._real(new))
            self._nested.pop(new, None)
            if old in self._nested:
                self._nested.pop(old).close()
        return self._io(run)

    def make_nested(self, name):
        def run():
            os.mkdir(self._real(name))
            return self.nested(name)
        return self._io(run)

    @property
    def dirty(self):
        return any(c is not None and c.dirty for c in list(self._nested.values()))

    def commit(self):
        changed = False
        for child in list(self._nested.values()):
            if child is not None and child.dirty:
                changed |= bool(child.commit())
        return changed

    def close(self):
        with self._lock:
            for child in self._nested.values():
                if child is not None:
                    child.close()
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _is_special(mode):
    """Whether ``mode`` is a FIFO's, a socket's or a device's (what a directory hides)."""
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def _special_mode(entry):
    """The mode of listed ``entry`` if it is a FIFO, socket or device, else 0 (the
    directory's own file types tell, without a stat on most file systems)."""
    if entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False) \
            or entry.is_symlink():
        return 0
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:  # gone since
        return 0
    return mode if _is_special(mode) else 0


def is_kind(path, test):
    """Whether ``path`` itself (a link is not followed) passes ``test`` (stat.S_ISDIR, ...)."""
    try:
        return test(os.lstat(path).st_mode)
    except OSError:
        return False


def mark_shown_raw(directory, why):
    """``directory`` (a directory shown as its files because a format that recognised it
    could not open it) marked so, with ``why`` among its problems and in the log."""
    log.warning("%s: shown raw and read-only: %s", directory.path, why)
    directory.shown_raw = why
    directory.problems.append(f"shown raw and read-only: {why}")
    return directory
