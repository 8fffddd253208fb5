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

import logging
import os
import stat

from ..errors import (
    BlockError,
    CtdsfsError,
    FormatError,
    NotAContainer,
    NotPermitted,
)
from ..formats import directory_format, open_container
from ..formats.casacore import tabledat
from ..io.directory import PlainDirectory, UnlinkedFile, is_kind, mark_shown_raw
from ..io.store import create_exclusive, read_small

log = logging.getLogger(__name__)

CONTAINER_SUFFIXES = (".mf", ".mfh5", ".pycauset", ".blp")
TABLE_CONTAINERS = ("table.mf", "table.mfh5")


class DirectorySource(PlainDirectory):
    """A real directory whose container files and format directories are shown translated."""

    def __init__(self, path, *, writable=False, recurse=True, verify_crc=True, hide=(),
                 timestamp=None):
        super().__init__(path, writable=writable, hide=hide)
        self.timestamp = timestamp  # -o timestamp=: the TileDB arrays in the tree at it
        self.recurse = recurse
        self.verify_crc = verify_crc

    def _shown_raw(self, name):
        """Why container file ``name`` is shown as its raw bytes (None: it is not): it is
        recognised (opened) first, so a write can never come before that answer."""
        if not isinstance(name, str) or not self.recurse \
                or not name.endswith(CONTAINER_SUFFIXES):
            return None
        self.nested(name)
        return self.raw_reasons.get(name)

    def _open_nested(self, name):
        real = self._real(name)
        if is_kind(real, stat.S_ISDIR):
            return directory_or_table(real, writable=self.writable, recurse=self.recurse,
                                      verify_crc=self.verify_crc, hide=self.hide,
                                      timestamp=self.timestamp)
        if not (self.recurse and name.endswith(CONTAINER_SUFFIXES)
                and is_kind(real, stat.S_ISREG)):
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


def is_table_directory(path):
    return is_kind(os.path.join(path, "table.dat"), stat.S_ISREG) and any(
        is_kind(os.path.join(path, name), stat.S_ISREG) for name in TABLE_CONTAINERS)


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
    raw = DirectorySource(path, **dict(options, writable=False, recurse=False))
    return mark_shown_raw(raw, why)


class TableView(DirectorySource):
    """A MultiFile-stored casacore table shown as a table stored in separate files."""

    format_name = "casacore table view"
    read_into = None  # (most files are the container's)

    def __init__(self, path, **options):
        super().__init__(path, **options)
        name = next(n for n in TABLE_CONTAINERS if is_kind(self._real(n), stat.S_ISREG))
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
        if isinstance(key, UnlinkedFile):
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
        if isinstance(key, UnlinkedFile):
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
