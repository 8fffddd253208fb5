"""Directory sources: a real directory tree as a container, with translating views.

``DirectorySource`` passes plain files and directories through (reads and
writes go to the real files). Inside it two translations apply:

* a casacore table directory stored as MultiFile (``table.dat`` plus
  ``table.mf``) is a :class:`TableView`: the container's files appear next to
  ``table.dat``, the container itself is hidden, and ``table.dat`` reads as the
  table stored in separate files, exactly as casacore writes such a table. So
  casacore versions that cannot read MultiFile v2 (3.5) open it. What they
  write comes back: storage manager files go into the container, and a new
  ``table.dat`` (written in place, or as ``table.dat_tmp`` renamed over it, as
  casacore does) is stored with the table's original storage option again;
* any other container file (``.mf``, ``.mfh5``, ``.pycauset``, ``.blp``) shows as
  a directory of the same name, unless recursion is off.

Say what you show: a directory or file a format recognises but cannot open as
promised (held by another writer, encrypted, an unsupported feature, over a
limit) is shown raw and read-only inside a tree, with the reason among the
tree's problems (``ctdsfs info``) and in the log; as the source named on the
command line it is an error. A read-write mount never writes the raw files of
such a container: they are not what the user asked to change.

Symbolic links are never followed: entries are examined with ``lstat`` and
opened with ``O_NOFOLLOW``, a link shows as a link (``symlink_target``), and a
link to a directory or a container file is neither. A link inside the tree
could otherwise hand out any file the daemon can read (``/etc/shadow``).

FIFOs, sockets and device nodes are hidden (one problem line each) and never
opened: opening a FIFO blocks until a writer comes, which would hang the whole
mount, and a device's driver would run. A file that turns into one after it was
listed fails its reads with EIO (see :func:`~ctdsfs.io.store.open_if_regular`).
"""

import errno
import logging
import os
import stat
import threading
from collections import OrderedDict

from ..container import Container, Usage
from ..errors import (
    BlockError,
    CtdsfsError,
    FormatError,
    NotAContainer,
    NotPermitted,
    ReadOnlyError,
)
from ..formats import directory_format, open_container
from ..formats.casacore import tabledat
from ..io.store import create_exclusive, kind_of, open_if_regular, preadv_all, read_small
from ..vfs.filesystem import FSError

log = logging.getLogger(__name__)

CONTAINER_SUFFIXES = (".mf", ".mfh5", ".pycauset", ".blp")
TABLE_CONTAINERS = ("table.mf", "table.mfh5")
OPEN_FILES = 64  # file descriptors kept open for reads and writes


class _Unlinked:
    """A file removed while open: it lives on through its descriptor."""

    def __init__(self, fd):
        self.fd = fd


class DirectorySource(Container):
    """A real directory. Entries are its files and subdirectories, sorted by name."""

    format_name = "directory"
    holds_links = True
    shown_raw = None  # why a recognised container is shown as this raw directory instead

    def __init__(self, path, *, writable=False, recurse=True, verify_crc=True, hide=(),
                 timestamp=None):
        self.path = os.fspath(path)
        self.timestamp = timestamp  # -o timestamp=: the TileDB arrays in the tree at it
        self.label = self.path
        self.writable = writable
        self.recurse = recurse
        self.verify_crc = verify_crc
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
        """Why container file ``name`` is shown as its raw bytes (None: it is not): it is
        recognised (opened) first, so a write can never come before that answer."""
        if not isinstance(name, str) or not self.recurse \
                or not name.endswith(CONTAINER_SUFFIXES):
            return None
        self.nested(name)
        return self.raw_reasons.get(name)

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
        if isinstance(key, _Unlinked):
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
        fd = key.fd if isinstance(key, _Unlinked) else self._fd(key)
        return os.pread(fd, size, offset)

    def read_into(self, key, offset, buffer):
        """``read`` into a writable buffer (the caller's, aligned as it likes): the count.
        A subclass whose files are not all the directory's sets it to None."""
        return preadv_all(key.fd if isinstance(key, _Unlinked) else self._fd(key), buffer,
                          offset)

    def symlink_target(self, name):
        try:
            return os.readlink(self._real(name))
        except OSError:  # not a link (EINVAL), or gone
            return None

    def _open_nested(self, name):
        real = self._real(name)
        if _is_kind(real, stat.S_ISDIR):
            return directory_or_table(real, writable=self.writable, recurse=self.recurse,
                                      verify_crc=self.verify_crc, hide=self.hide,
                                      timestamp=self.timestamp)
        if not (self.recurse and name.endswith(CONTAINER_SUFFIXES)
                and _is_kind(real, stat.S_ISREG)):
            return None
        try:
            return open_container(real, verify_crc=self.verify_crc, writable=self.writable)
        except NotAContainer as exc:  # (a plain file, or one being written: a file still)
            self.problems.append(f"{name!r} shown as a file: {exc}")
            log.warning("%s: %r shown as a file: %s", self.label, name, exc)
            return None
        except CtdsfsError as exc:  # recognised, but not shown as promised
            why = str(exc)
            self.raw_reasons[name] = why
            self.problems.append(f"{name!r} shown raw and read-only: {why}")
            log.warning("%s: %r shown raw and read-only: %s", self.label, name, why)
            return None

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
            fd = key.fd if isinstance(key, _Unlinked) else self._fd(key)
            return os.pwrite(fd, data, offset)
        return self._io(run, key=key)

    def truncate(self, key, size):
        def run():
            os.ftruncate(key.fd if isinstance(key, _Unlinked) else self._fd(key), size)
        return self._io(run, key=key)

    def remove(self, name, keep_open=False):
        def run():
            real = self._real(name)
            child = self._nested.pop(name, None)
            if _is_kind(real, stat.S_ISDIR):
                os.rmdir(real)
                return None
            keep = _Unlinked(os.dup(self._fd(name))) if keep_open else None
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


def _is_kind(path, test):
    """Whether ``path`` itself (a link is not followed) passes ``test`` (stat.S_ISDIR, ...)."""
    try:
        return test(os.lstat(path).st_mode)
    except OSError:
        return False


def is_table_directory(path):
    return _is_kind(os.path.join(path, "table.dat"), stat.S_ISREG) and any(
        _is_kind(os.path.join(path, name), stat.S_ISREG) for name in TABLE_CONTAINERS)


def directory_or_table(path, *, source=False, **options):
    """A directory a format translates (a TileDB array, a bcolz rootdir) opens as that
    format, a table directory stored in a container gets the table view; others pass through.

    One that is recognised but fails to open is an error if it is the ``source`` named
    on the command line; inside a tree it is shown raw and read-only (``shown_raw``)."""
    fmt = directory_format(path) if options.get("recurse", True) else None
    if fmt is not None:
        try:
            return fmt.open_directory(path, verify_crc=options.get("verify_crc", True),
                                      writable=options.get("writable", False),
                                      timestamp=options.get("timestamp"))
        except CtdsfsError as exc:
            if source:
                raise
            return _raw_directory(path, f"not shown as a {fmt.name}: {exc}", options)
    if is_table_directory(path):
        try:
            return TableView(path, **options)
        except CtdsfsError as exc:
            if source:
                raise
            return _raw_directory(path, f"not shown as a table: {exc}", options)
    return DirectorySource(path, **options)


def _raw_directory(path, why, options):
    """The directory as it is, read-only, no translation inside, saying why."""
    log.warning("%s: shown raw and read-only: %s", path, why)
    raw = DirectorySource(path, **dict(options, writable=False, recurse=False))
    raw.shown_raw = why
    raw.problems.append(f"shown raw and read-only: {why}")
    return raw


class TableView(DirectorySource):
    """A MultiFile-stored casacore table shown as a table stored in separate files."""

    format_name = "casacore table view"
    read_into = None  # (most files are the container's)

    def __init__(self, path, **options):
        super().__init__(path, **options)
        name = next(n for n in TABLE_CONTAINERS if _is_kind(self._real(n), stat.S_ISREG))
        self.container_name = name
        self.container = open_container(self._real(name), verify_crc=self.verify_crc,
                                        writable=self.writable)
        self._staged = None  # a table.dat being written through the view
        self._translated = None  # (stat key, bytes) of table.dat in separate-file form

    def commits_atomically(self, name):
        """The container's files are committed with it; the directory's own (table.dat,
        table.info, table.lock) are written in place."""
        return name != "table.dat" and self._in_container(name) and \
            self.container.commits_atomically(name)

    def _in_container(self, key):
        if isinstance(key, _Unlinked):
            return False
        if not isinstance(key, str):
            return True  # a file of the container unlinked while open
        return self.container.contains(key)

    def _stored_table_dat(self):
        return read_small(self._real("table.dat"), tabledat.MAX_BYTES)

    def _original(self):
        return tabledat.decode(self._stored_table_dat(), self._real("table.dat"))

    def _table_dat_version(self):
        st = os.lstat(self._real("table.dat"))
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _table_dat(self):
        """table.dat as casacore writes the table in separate files (cached per file state).

        One that does not decode (damaged, or hostile) is shown as it is, with
        one log line per state of the file: the rest of the table stays usable.
        One that is no longer a regular file (a link or a FIFO put in its place)
        is a BlockError: its reads fail with EIO.
        """
        if self._staged is not None:
            return bytes(self._staged)
        key = self._table_dat_version()
        if self._translated is None or self._translated[0] != key:
            try:
                stored = self._stored_table_dat()
            except FormatError as exc:
                raise BlockError(str(exc)) from None
            try:
                shown = tabledat.decode(stored, self._real("table.dat")) \
                    .with_storage("SepFile").encode()
            except FormatError as exc:
                log.warning("table.dat shown as it is: %s", exc)
                shown = stored
            self._translated = (key, shown)
        return self._translated[1]

    # -- reading

    def names(self):
        hidden = {self.container_name, self.container_name + "_hdrext"}
        own = [n for n in super().names() if n not in hidden]
        return sorted(set(own) | set(self.container.names()))

    def contains(self, name):
        if name in (self.container_name, self.container_name + "_hdrext"):
            return False
        return self.container.contains(name) or super().contains(name)

    def entry_size(self, key):
        if key == "table.dat":
            try:
                return len(self._table_dat())
            except BlockError:
                return 0  # (its reads say why)
        if self._in_container(key):
            return self.container.entry_size(key)
        return super().entry_size(key)

    def entry_blocks(self, key):
        if self._in_container(key):
            return self.container.entry_blocks(key)
        return super().entry_blocks(key)

    def read(self, key, offset, size):
        if key == "table.dat":
            return self._table_dat()[offset:offset + size]
        if self._in_container(key):
            return self.container.read(key, offset, size)
        return super().read(key, offset, size)

    def nested(self, name):
        if self.container.contains(name):
            return None
        return super().nested(name)

    def symlink_target(self, name):
        if name == "table.dat" or self._in_container(name):
            return None
        return super().symlink_target(name)

    # -- writing

    def _store_table_dat(self, data):
        """Store a table.dat written through the view with the table's own storage option."""
        try:
            written = tabledat.decode(bytes(data), self._real("table.dat"))
        except FormatError as exc:
            raise CtdsfsError(f"table.dat not stored: {exc}") from None
        original = self._original()
        if written.storage == "SepFile":
            written = written.with_storage(original.storage, original.column_set.block_size)
        tmp = self._real("table.dat.ctdsfs-new")
        with os.fdopen(create_exclusive(tmp), "wb") as f:  # (never a planted link)
            f.write(written.encode())
            f.flush()
            os.fsync(f.fileno())
        self._forget_fd("table.dat")
        os.replace(tmp, self._real("table.dat"))

    def create(self, name):
        with self._lock:
            self._check_writable()
            if name.startswith("table.f") and name not in ("table.f",):
                return self.container.create(name)
            return super().create(name)

    def write(self, key, offset, data):
        with self._lock:
            self._check_writable()
            if key == "table.dat":
                if self._staged is None:
                    self._staged = bytearray(self._table_dat())
                if offset > len(self._staged):
                    self._staged.extend(bytes(offset - len(self._staged)))
                self._staged[offset:offset + len(data)] = data
                return len(data)
            if self._in_container(key):
                return self.container.write(key, offset, data)
            return super().write(key, offset, data)

    def truncate(self, key, size):
        with self._lock:
            self._check_writable()
            if key == "table.dat":
                if self._staged is None:
                    self._staged = bytearray(self._table_dat())
                del self._staged[size:]
                self._staged.extend(bytes(size - len(self._staged)))
                return None
            if self._in_container(key):
                return self.container.truncate(key, size)
            return super().truncate(key, size)

    def remove(self, name, keep_open=False):
        with self._lock:
            if name == "table.dat":
                raise NotPermitted("table.dat of a table view cannot be removed")
            if self.container.contains(name):
                return self.container.remove(name, keep_open)
            return super().remove(name, keep_open)

    def release(self, key):
        if isinstance(key, _Unlinked):
            return super().release(key)
        return self.container.release(key)

    def rename(self, old, new):
        with self._lock:
            self._check_writable()
            if new == "table.dat":  # casacore writes table.dat_tmp, then renames it
                data = self.read(old, 0, self.entry_size(old))
                self._store_table_dat(data)
                self._staged = None
                if self.container.contains(old):
                    self.container.remove(old)
                else:
                    self._forget_fd(old)
                    os.unlink(self._real(old))
                return None
            if self.container.contains(old):
                if not new.startswith("table.f"):
                    raise NotPermitted(f"{old} lives in {self.container_name}: "
                                       "it keeps a table.f* name")
                return self.container.rename(old, new)
            return super().rename(old, new)

    @property
    def dirty(self):
        return self._staged is not None or self.container.dirty or super().dirty

    def commit(self):
        with self._lock:
            changed = False
            if self._staged is not None:
                staged, self._staged = self._staged, None
                self._store_table_dat(staged)
                changed = True
            changed |= bool(self.container.commit())
            return super().commit() or changed

    def close(self):
        with self._lock:
            try:
                self.commit()
            except CtdsfsError as exc:
                log.error("%s: %s", self.label, exc)
            finally:
                self.container.close()
                super().close()
