"""casacore MultiHDF5 (``.mfh5``), read and written through h5py.

Layout (FORMAT-NOTES; ``h5dump`` of casacore's own files in the fixtures):
the root group holds ``__MultiHDF5_Header__`` with the attributes
``blockSize`` (int64), ``hdrCounter`` (int64), ``names`` (variable-length
ASCII strings, in slot order; a deleted file leaves an empty name) and
``sizes`` (int64). casacore writes an empty vector as a scalar compound
``{emptyarray, rank, casatype}``. Each virtual file is a group of that name with
a 2-D uint8 dataset ``FileData``, one row per block, chunked one row per chunk;
casacore extends it to one row more than it needs, so sizes come from
``sizes``, never from the dataset shape. A nested MultiHDF5 is a file group
that also holds a header group of its own.

Trust: the file is untrusted. Only bytes stored inside it are served: a
FileData kept in external files, a virtual dataset, a filter pipeline
(casacore writes none; a filter could be a decompression bomb) and any link
that is not a hard link (a soft or external link may lead out of the file)
hide the entry, with the reason in ``problems``. Every HDF5 object may appear
once in the tree (hard links can make cycles and aliases), and one opened file
shows at most MAX_TREE_ENTRIES entries. The HDF5 C library itself can crash or
spin on damaged bytes, so ``open`` first has a child process read everything
ctdsfs will touch (``probe``).

Crash safety: HDF5 updates its metadata in place and has no atomic commit of
its own, so a writable file is opened through a :class:`JournaledFile`
(h5py's ``fileobj`` driver): nothing the committed state uses is overwritten
between commits, and a commit goes through a redo journal beside the file
(``io/journal.py``). A crash at any moment leaves the last commit or the
next one, as with MultiFile.
"""

import contextlib
import itertools
import logging
import os
import threading
import weakref

import h5py
import numpy as np

from ...container import MAX_NESTING, Container, Usage, name_problem
from ...errors import BlockError, ContainerFull, CtdsfsError, FormatError, ReadOnlyError
from ...io.journal import JournaledFile, journal_path
from ...io.store import fsync_path
from . import hdf5_exit, probe

log = logging.getLogger(__name__)

HEADER = "__MultiHDF5_Header__"
HEADER_LINK, DATA_LINK = HEADER.encode(), b"FileData"
ORPHAN_PREFIX = "__ctdsfs_unlinked_"  # a file unlinked while open; never listed in a header
# casacore's HDF5Record cuts a string attribute to 4000 values (the old-format
# 64 KiB attribute limit), which would lose names: ctdsfs stops at that count.
MAX_SLOTS = 4000
EMPTY_ARRAY = np.dtype([("emptyarray", "<i4"), ("rank", "<i4"), ("casatype", "<i4")])
TP_STRING, TP_INT64 = 11, 29  # casacore DataType values, used in empty-array attributes
NAMES_TYPE = h5py.string_dtype("ascii")
LIBVER = ("earliest", "v110")  # what casacore's HDF5 1.10 reads; superblock 0 as casacore's
CHUNK_CACHE_BYTES = 64 << 20
# Changed pages of the committed state wait in memory for the commit; past this
# the pending changes are committed early (an earlier commit is always allowed).
PENDING_LIMIT = 64 << 20
# Room a change must leave on the disk for HDF5's own metadata and the journal's framing.
DISK_MARGIN = 1 << 20
MAX_TREE_ENTRIES = 1_000_000  # entries one opened file may show, nested ones included
IN_FILE_LAYOUTS = (h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED)
# What h5py raises for HDF5 structures it cannot follow (a damaged or hostile file).
HDF5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def _link(name):
    return name.encode("utf-8", "surrogateescape")


def _text(value):
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _attribute(attrs, key, most=1):
    """An attribute's value; one holding more than ``most`` values is refused unread (the
    file sets its size, so reading it first could cost any memory)."""
    count = int(np.prod(attrs.get_id(key).shape or ()))
    if count > most:
        raise ValueError(f"{key} holds {count} values, more than the {most} casacore writes")
    return attrs[key]


def _vector(attrs, key):
    """An attribute as a list; casacore's empty-array marker gives []."""
    value = _attribute(attrs, key, MAX_SLOTS)
    names = getattr(value, "dtype", np.dtype(object)).names
    if names and "emptyarray" in names:
        return []
    return list(np.atleast_1d(value))


def _link_type(group, link):
    """The HDF5 link type (h5py.h5l.TYPE_*) of ``link`` in ``group``, or None if there is
    none; found without following the link (an external one would open another file)."""
    links = group.id.links
    return links.get_info(link).type if links.exists(link) else None


def _link_problem(group, link):
    """Why the link may lead outside the container (anything but a hard link), or None."""
    kind = _link_type(group, link)
    if kind in (None, h5py.h5l.TYPE_HARD):
        return None
    names = {h5py.h5l.TYPE_SOFT: "a soft", h5py.h5l.TYPE_EXTERNAL: "an external"}
    return f"{_text(link)} is {names.get(kind, 'a user-defined')} link, which may point " \
        "outside the container"


def _storage_problem(data):
    """Why FileData's bytes may not be plainly stored inside this file, or None."""
    plist = data.id.get_create_plist()
    if plist.get_layout() not in IN_FILE_LAYOUTS:
        return "FileData is a virtual dataset (its bytes come from other datasets or files)"
    if plist.get_external_count():
        return "FileData keeps its bytes in external files"
    if plist.get_nfilters():
        names = [_text(plist.get_filter(i)[3]) or "unnamed" for i in range(plist.get_nfilters())]
        return f"FileData has filters ({', '.join(names)}); casacore writes none"
    return None


class _Tree:
    """What the walk of one opened file has met: each HDF5 object once, a bounded entry count."""

    def __init__(self, progress=None):
        self.addresses = set()
        self.entries = 0
        self.progress = progress  # the probe child's CPU budget: called at each step forward

    def step(self):
        """One more HDF5 object or entry got past."""
        if self.progress is not None:
            self.progress()

    def first_visit(self, obj):
        """False if ``obj`` (a group or dataset) was met before: a hard-link cycle or alias."""
        self.step()
        address = h5py.h5o.get_info(obj.id).addr
        if address in self.addresses:
            return False
        self.addresses.add(address)
        return True

    def spend(self):
        """Count one entry; False once the tree holds MAX_TREE_ENTRIES."""
        self.entries += 1
        return self.entries <= MAX_TREE_ENTRIES


class _File:
    """One virtual file: the link name of its group and its size."""

    __slots__ = ("link", "size", "clean", "dataset")

    def __init__(self, link, size, clean=True):
        self.link = link
        self.size = size
        self.clean = clean  # every dataset byte past ``size`` is known to be zero
        self.dataset = None  # its FileData, once opened (HDF5 handles survive renames)


class MultiHDF5(Container):
    """A MultiHDF5 container (or a nested one: a file group with its own header)."""

    format_name = "MultiHDF5"
    file = journal = None  # the top-level container's h5py file and JournaledFile
    atomic_commits = True  # through the redo journal (see the module docstring)

    def __init__(self, group, label, *, writable=False, depth=0, lock=None, new_block_size=None,
                 root=None, tree=None):
        self.group = group
        # The top-level container, which owns the file (None: this one); weak, so that
        # dropping a tree closes its file at once instead of at the next GC cycle.
        self._root = weakref.ref(root) if root is not None else None
        self.label = label
        self.writable = writable
        self.depth = depth
        self.failure = None
        self.problems = []
        self._lock = lock or threading.RLock()
        self._nested = {}
        self._orphan_ids = itertools.count()
        self._tree = tree or _Tree()
        if new_block_size is not None:
            self.block_size, self.counter = new_block_size, 0
            self._slots, self._entries = [], {}
            self._dirty = True
        else:
            self._load()

    def _load(self):
        if not self.depth:
            self._tree.first_visit(self.group)
        try:
            escape = _link_problem(self.group, HEADER_LINK)
            if escape:
                raise FormatError(f"{self.label}: MultiHDF5 header refused: {escape}")
            header_group = self.group[HEADER]
            if not self._tree.first_visit(header_group):
                raise FormatError(f"{self.label}: its header group appears twice in the "
                                  "file's tree (an HDF5 hard link)")
            header = header_group.attrs
            self.block_size = int(_attribute(header, "blockSize"))
            self.counter = int(_attribute(header, "hdrCounter"))
            names = [_text(n) for n in _vector(header, "names")]
            sizes = [int(s) for s in _vector(header, "sizes")]
        except HDF5_ERRORS as exc:
            raise FormatError(f"{self.label}: not a casacore MultiHDF5 container ({exc})") from None
        if not 0 < self.block_size <= 1 << 30 or len(names) != len(sizes):
            raise FormatError(f"{self.label}: MultiHDF5 header is inconsistent")
        self._slots = []  # header order; None for a deleted slot
        self._entries = {}
        over_budget = 0
        for name, size in zip(names, sizes):
            if name == "":
                self._slots.append(None)
                continue
            if not self._tree.spend():
                over_budget += 1
                self._slots.append(None)
                continue
            why = self._entry_problem(name, size)
            if why:
                self.problems.append(f"entry {name!r} hidden: {why}")
                log.warning("%s: entry %r hidden: %s", self.label, name, why)
                self._slots.append(None)
                continue
            f = _File(name, size, clean=False)
            self._slots.append(f)
            self._entries[name] = f
        if over_budget:
            self.problems.append(f"{over_budget} entries hidden: the file shows at most "
                                 f"{MAX_TREE_ENTRIES} entries in all")
        if self.writable and self.problems:
            raise FormatError(f"{self.label}: damaged entries ({self.problems[0]}); "
                              "mount it read-only")
        self._dirty = False

    @property
    def root(self):
        """The top-level container: it owns the file and commits."""
        return self._root() if self._root is not None else self

    def _name_problem(self, name):
        if name == HEADER or name.startswith(ORPHAN_PREFIX):
            return "reserved name"
        return name_problem(name)

    def _entry_problem(self, name, size):
        why = self._name_problem(name) or ("duplicate name" if name in self._entries else None)
        if why:
            return why
        if size < 0:
            return f"negative size {size}"
        try:
            return self._group_problem(name, size)
        except HDF5_ERRORS as exc:
            return f"its HDF5 objects cannot be read ({exc})"

    def _group_problem(self, name, size):
        link = _link(name)
        escape = _link_problem(self.group, link)
        if escape:
            return escape
        item = self.group.get(link)
        if not isinstance(item, h5py.Group):
            return "no group for it"
        if not self._tree.first_visit(item):
            return "its group appears twice in the file's tree (an HDF5 hard link)"
        nested = _link_type(item, HEADER_LINK) is not None  # (its own _load checks the header)
        escape = _link_problem(item, DATA_LINK)
        if escape:
            return escape
        data = item.get("FileData")
        if nested and data is None:
            return None
        if not isinstance(data, h5py.Dataset) or data.ndim != 2 or data.dtype != np.uint8 \
                or data.shape[1] != self.block_size:
            return "no FileData dataset of the container's block size"
        why = _storage_problem(data)
        if why:
            return why
        if not self._tree.first_visit(data):
            return "its FileData appears twice in the file's tree (an HDF5 hard link)"
        if nested:
            return None
        if data.shape[0] * self.block_size < size:
            return f"size {size} larger than its {data.shape[0]} rows of data"
        return None

    @classmethod
    def open(cls, path, *, writable=False):
        """Open the file once a child process has read it all without crashing or hanging;
        a writer takes an exclusive flock (a second writer is refused)."""
        probe.probe(path)
        return cls.open_unprobed(path, writable=writable)

    @classmethod
    def open_unprobed(cls, path, *, writable=False, progress=None):
        """Open the file trusting the HDF5 library with it (in ``probe_child``, which
        passes ``progress``: called at each HDF5 object or entry the container gets past)."""
        handle, journal = _open_file(path, writable)
        label = getattr(path, "label", None) or str(path)
        try:
            container = cls(handle, label, writable=writable, tree=_Tree(progress))
            container.file = handle
            container.journal = journal
            container.path = path if hasattr(path, "pread") else label
            container._stat_key = _stat_key(path)
            if writable:
                container._drop_orphans()
        except HDF5_ERRORS as exc:
            _close(handle, journal)
            raise FormatError(f"{path}: damaged MultiHDF5 structure ({exc})") from None
        except BaseException:
            _close(handle, journal)
            raise
        return container

    @classmethod
    def new(cls, path, *, block_size):
        """A new, empty MultiHDF5 file at ``path`` (which must not exist), open for writing.

        Written complete beside ``path`` and linked into place, so ``path``
        appears as a valid, empty container or not at all.
        """
        if not 1 <= block_size <= 1 << 30:
            raise CtdsfsError(f"block size {block_size} is out of range (1 .. 1 GiB)")
        path = os.fspath(path)
        staging = f"{path}.ctdsfs-new"
        try:
            with contextlib.suppress(FileNotFoundError):  # a leftover, or a planted link:
                os.unlink(staging)  # never opened; "w-" creates with O_EXCL
            with _h5file(staging, "w-") as handle:
                cls(handle, path, writable=True, new_block_size=block_size)._write_headers()
            fsync_path(staging)
            os.link(staging, path)
        except FileExistsError:
            raise CtdsfsError(f"{path}: File exists") from None
        except (OSError, ValueError) as exc:
            raise CtdsfsError(f"{path}: cannot create ({exc})") from None
        finally:
            if os.path.lexists(staging):
                os.unlink(staging)
        fsync_path(os.path.dirname(os.path.abspath(path)))
        return cls.open_unprobed(path, writable=True)  # written here, not untrusted

    def _drop_orphans(self):
        """Groups of files unlinked while open when a previous writer died."""
        for link in [k for k in self.group if k.startswith(ORPHAN_PREFIX)]:
            del self.group[link]
            self._dirty = True  # committed with the first commit
        for name in self._entries:
            child = self.nested(name)
            if child is not None:
                child._drop_orphans()

    # ------------------------------------------------------------ reading

    def names(self):
        return list(self._entries)

    def _data(self, f):
        if f.dataset is None:
            f.dataset = self.group[_link(f.link)]["FileData"]
        return f.dataset

    def entry_size(self, key):
        return self._entry(key).size

    def entry_blocks(self, key):
        return -(-self.entry_size(key) // self.block_size)

    def usage(self):
        return Usage(self.block_size, sum(self.entry_blocks(n) for n in self._entries), 0)

    def read(self, key, offset, size):
        with self._lock:
            f = self._entry(key)
            end = min(offset + size, f.size)
            if offset >= end:
                return b""
            bs = self.block_size
            first, last = offset // bs, (end - 1) // bs
            try:
                rows = self._data(f)[first:last + 1]
            except HDF5_ERRORS as exc:
                detail = f"blocks {first}..{last} cannot be read ({exc})"
                raise BlockError(f"{self.label}: {f.link}: {detail}", detail) from None
        return rows.reshape(-1)[offset - first * bs:end - first * bs].tobytes()

    def _open_nested(self, name):
        f = self._entry(name)
        try:
            group = self.group[_link(f.link)]
            if _link_type(group, HEADER_LINK) is None:
                return None
        except HDF5_ERRORS as exc:
            self.problems.append(f"{name!r} shown as a file: {exc}")
            return None
        if self.depth + 1 >= MAX_NESTING:
            self.problems.append(f"{name!r} shown as a file: nested deeper than {MAX_NESTING}")
            return None
        try:
            return MultiHDF5(group, f"{self.label}/{name}", writable=self.writable,
                             depth=self.depth + 1, lock=self._lock, root=self.root,
                             tree=self._tree)
        except FormatError as exc:
            self.problems.append(f"{name!r} shown as a file: {exc}")
            log.warning("%s: %r shown as a file: %s", self.label, name, exc)
            return None

    def stored_spans(self, key):
        """(first row, rows, offset in the HDF5 file or None, bytes) of each stored piece of
        the rows a file's size needs: one per chunk, or one for a contiguous or compact
        dataset. Other rows were never written and read as zeros; the list is as long as
        the file's chunk index, so walking it costs what the file holds, not what it claims.
        """
        with self._lock:
            f = self._entry(key)
            rows = -(-f.size // self.block_size)
            ds = self._data(f)
            if ds.chunks is None:
                stored = ds.id.get_storage_size()
                return [(0, rows, ds.id.get_offset(), stored)] if stored and rows else []
            per_chunk = ds.chunks[0]
            spans = []

            def visit(info):
                if info.chunk_offset[0] < rows:
                    spans.append((info.chunk_offset[0], per_chunk, info.byte_offset, info.size))
            ds.id.chunk_iter(visit)
            return spans

    def describe(self):
        return {"container": self.label, "format": "MultiHDF5", "block_size": self.block_size,
                "header_counter": self.counter,
                "files": [{"name": n, "size": f.size, "blocks": self.entry_blocks(n),
                           "rows": self._rows(f), "nested": self.nested(n) is not None}
                          for n, f in list(self._entries.items())],
                "problems": list(self.problems)}

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        lines = [f"{info['container']}: MultiHDF5",
                 f"  block size       {info['block_size']}",
                 f"  header counter   {info['header_counter']}",
                 f"  files            {len(info['files'])}"]
        lines += [f"    {f['size']:>10}  {f['blocks']:>6}  {f['name']}"
                  f"{'/  (nested container)' if f['nested'] else ''}" for f in info["files"]]
        lines += [f"  problem: {p}" for p in info["problems"]]
        return lines

    def _rows(self, f):
        """Rows of the file's dataset (a nested container may have none); None if unreadable."""
        self._tree.step()
        try:
            group = self.group[_link(f.link)]
            return int(group["FileData"].shape[0]) \
                if _link_type(group, DATA_LINK) == h5py.h5l.TYPE_HARD else 0
        except HDF5_ERRORS:
            return None

    def reload_if_changed(self):
        """A read-only top-level mount re-reads a file another writer changed.

        HDF5 shares the state of a file that is open already, so the old handle
        is closed first; if the new state cannot be read yet (a writer in the
        middle of a flush), the container shows nothing until the next try.
        """
        if self.depth or self.writable:
            return False
        path = self.path
        try:
            key = _stat_key(path)
        except OSError:
            return False
        if key == self._stat_key:
            return False
        with self._lock:
            self._stat_key = key
            _close(self.file, self.journal)
            self.file = self.journal = None
            self._nested, self._slots, self._entries = {}, [], {}
            self._tree = _Tree()
            try:
                probe.probe(path)
                self.file, self.journal = _open_file(path, False)
                self.group = self.file
                self.problems = []
                self._load()
            except HDF5_ERRORS + (CtdsfsError,) as exc:
                self._stat_key = None  # try again at the next lookup
                self.problems = [f"changed on disk and not readable now: {exc}"]
                log.warning("%s: changed on disk and not readable now (%s)", self.label, exc)
            return True

    # ------------------------------------------------------------ writing

    def _guarded(self, func, *args):
        """A write step under the lock; an HDF5 failure makes the tree read-only."""
        with self._lock:
            if not self.writable:
                raise ReadOnlyError(self.failure or f"{self.label} is read-only")
            try:
                result = func(*args)
            except (FileExistsError, FileNotFoundError, CtdsfsError):
                raise
            except HDF5_ERRORS as exc:
                reason = f"{self.label}: write failed ({exc}); container switched to read-only"
                log.error("%s", reason)
                self._set_read_only(reason)
                raise OSError(f"{self.label}: HDF5 write failed ({exc})") from None
            self._dirty = True
            journal = self.root.journal
            if journal is not None and journal.pending_bytes > PENDING_LIMIT:
                self.root.commit()
            return result

    def _check_room(self, nbytes):
        """Refuse (ContainerFull, nothing changed) a change of ``nbytes`` that the disk has no
        room for, with the journal the next commit writes: HDF5 cannot take back a change
        that failed half-way, so the room is checked before HDF5 sees it."""
        root = self.root
        if root.journal is None:
            return
        disk = os.fstatvfs(root.journal.fd)
        needed = nbytes + root.journal.pending_bytes + DISK_MARGIN
        if disk.f_bavail * disk.f_frsize < needed:
            raise ContainerFull(f"{root.path}: no space left on the disk for {nbytes} more "
                                "bytes and the commit's journal")

    def create(self, name):
        return self._guarded(self._create, name)

    def _create(self, name):
        self._check_new_entry(name)
        self._check_room(0)
        free = None in self._slots  # (scans in C: 4,000 creates in a row stay quick)
        if not free and len(self._slots) >= MAX_SLOTS:
            raise ContainerFull(f"{self.label}: a MultiHDF5 container holds at most "
                                f"{MAX_SLOTS} files (casacore's limit)")
        link = _link(name)
        if link in self.group:  # left over by a writer that died before its commit
            del self.group[link]
        group = self.group.create_group(link)
        bs = self.block_size
        group.create_dataset("FileData", shape=(0, bs), maxshape=(None, bs), chunks=(1, bs),
                             dtype=np.uint8)
        f = _File(name, 0)
        if free:  # casacore reuses the last deleted slot
            self._slots[len(self._slots) - 1 - self._slots[::-1].index(None)] = f
        else:
            self._slots.append(f)
        self._entries[name] = f
        return f

    def write(self, key, offset, data):
        return self._guarded(self._write, key, offset, data)

    def _write(self, key, offset, data):
        f = self._entry(key)
        if not data:
            return 0
        self._check_room(len(data))
        end = offset + len(data)
        if end > f.size:
            self._resize(f, end)
        ds, bs = self._data(f), self.block_size
        view = memoryview(data).cast("B")
        pos = offset
        while pos < end:
            row, start = divmod(pos, bs)
            stop = min(end, (row + 1) * bs)
            piece = view[pos - offset:stop - offset]
            if len(piece) == bs:  # a whole row is a whole chunk: written past HDF5's cache
                ds.id.write_direct_chunk((row, 0), piece)
            else:
                ds[row, start:start + len(piece)] = np.frombuffer(piece, np.uint8)
            pos = stop
        return len(data)

    def _resize(self, f, size):
        """Set the size; bytes between the old and the new end read as zeros.

        The dataset keeps casacore's one spare row. Shrinking zeroes the rest
        of the last kept row and drops the rows after it (HDF5 frees their
        chunks); a file another writer made is cleaned that way once, since
        casacore's truncation leaves stale bytes behind.
        """
        ds, bs = self._data(f), self.block_size
        cleaned = False
        if size < f.size or not f.clean:
            keep = min(f.size, size)
            rows = -(-keep // bs)
            if keep % bs:
                ds[rows - 1, keep % bs:] = 0
            if ds.shape[0] > rows:
                ds.resize(rows, axis=0)
            f.clean = cleaned = True
        blocks = -(-size // bs)
        want = blocks + 1 if blocks else 0
        if ds.shape[0] < blocks or (cleaned and ds.shape[0] < want):
            ds.resize(want, axis=0)
        f.size = size

    def truncate(self, key, size):
        def run():
            f = self._entry(key)
            if size > f.size:
                self._check_room(0)
            self._resize(f, size)
        return self._guarded(run)

    def remove(self, name, keep_open=False):
        return self._guarded(self._remove, name, keep_open)

    def _remove(self, name, keep_open):
        f = self._entry(name)
        self._slots[self._slots.index(f)] = None
        del self._entries[name]
        child = self._nested.pop(name, None)
        if child is not None:
            child._set_read_only(f"{child.label} was removed")
        if keep_open:
            orphan = f"{ORPHAN_PREFIX}{os.getpid()}_{next(self._orphan_ids)}__"
            self.group.move(_link(f.link), orphan)
            f.link = orphan
            return f
        f.dataset = None
        del self.group[_link(f.link)]
        return None

    def release(self, orphan):
        def run():
            orphan.dataset = None
            if orphan.link in self.group:
                del self.group[orphan.link]
        return self._guarded(run)

    def rename(self, old, new):
        return self._guarded(self._rename, old, new)

    def _rename(self, old, new):
        def relink(f, name):  # open HDF5 handles (datasets, a nested group) follow the move
            self.group.move(_link(f.link), _link(name))
            f.link = name
        self._rename_entry(old, new, relink)

    def make_nested(self, name):
        """A file group that holds a MultiHDF5 of its own (casacore keeps the empty dataset)."""
        def run():
            f = self._create(name)
            child = MultiHDF5(self.group[_link(f.link)], f"{self.label}/{name}", writable=True,
                              depth=self.depth + 1, lock=self._lock, root=self.root,
                              new_block_size=self.block_size, tree=self._tree)
            self._nested[name] = child
            return child
        return self._guarded(run)

    # ------------------------------------------------------------ committing

    @property
    def dirty(self):
        return self._dirty or any(c is not None and c.dirty for c in list(self._nested.values()))

    def commit(self):
        """Write the headers (children first), flush HDF5 into the journaled file, commit it."""
        with self._lock:
            if not self.writable or not self.dirty:
                return False
            try:
                self._write_headers()
                if self.depth == 0:
                    self.file.flush()
                    self.journal.commit()
            except ContainerFull:  # nothing committed, nothing lost: the next commit tries again
                self._dirty = True
                raise
            except HDF5_ERRORS as exc:
                reason = f"{self.label}: commit failed ({exc}); container switched to read-only"
                log.error("%s", reason)
                self._set_read_only(reason)
                raise OSError(reason) from None
            return True

    def _write_headers(self):
        for child in list(self._nested.values()):
            if child is not None and child.dirty:
                child._write_headers()
        if not self._dirty:
            return
        self.counter += 1
        # As casacore's HDF5Record: the header group is replaced as a whole.
        if HEADER in self.group:
            del self.group[HEADER]
        attrs = self.group.create_group(HEADER).attrs
        attrs.create("blockSize", np.int64(self.block_size))
        attrs.create("hdrCounter", np.int64(self.counter))
        names = [_link(f.link) if f else b"" for f in self._slots]
        if names:
            attrs.create("names", names, dtype=NAMES_TYPE)
            attrs.create("sizes", np.array([f.size if f else 0 for f in self._slots], "<i8"))
        else:
            attrs.create("names", np.array((1, 1, TP_STRING), EMPTY_ARRAY))
            attrs.create("sizes", np.array((1, 1, TP_INT64), EMPTY_ARRAY))
        self._dirty = False

    def abandon(self):
        """Close without committing: what HDF5 writes while closing stays uncommitted."""
        if self.depth == 0:
            _close(self.file, self.journal)
            self.file = self.journal = None


def _open_file(path, writable):
    """``(h5py file, JournaledFile or None)``: writers always go through the journal,
    readers only when a crashed writer left one to be replayed. ``path`` may be a read-only
    store (a remote object), read through h5py's file-object driver."""
    if hasattr(path, "pread"):
        try:
            return _h5file(path.fileobj(), "r"), None
        except HDF5_ERRORS as exc:
            raise FormatError(f"{path.label}: {_open_failure(exc)}") from None
    journal = None
    try:
        if writable or os.path.exists(journal_path(path)):
            journal = JournaledFile(path, writable)
    except OSError as exc:
        raise CtdsfsError(f"{path}: {exc.strerror}") from None
    try:
        return _h5file(journal or path, "r+" if writable else "r"), journal
    except HDF5_ERRORS as exc:
        _close(None, journal)
        raise FormatError(f"{path}: {_open_failure(exc)}") from None


def _h5file(source, mode):
    """An h5py file (a path, or a file object: then closed at exit if still open) with
    casacore's format bounds and a chunk cache for partial rows. Writers lock through their
    JournaledFile (flock, as HDF5's), readers do not: a read-only mount follows a writer."""
    handle = h5py.File(source, mode, locking=False, libver=LIBVER,
                       rdcc_nbytes=CHUNK_CACHE_BYTES, rdcc_nslots=10007)
    return handle if isinstance(source, str | os.PathLike) else hdf5_exit.close_at_exit(handle)


def _close(handle, journal):
    try:
        if handle is not None:
            handle.close()
    except HDF5_ERRORS as exc:
        log.warning("closing HDF5 file: %s", exc)
    finally:
        if journal is not None:
            journal.close()


def _open_failure(exc):
    """h5py's open error as a reason a user can act on."""
    text = str(exc)
    if isinstance(exc, BlockingIOError) or "unable to lock" in text:
        return "locked by another writer (HDF5 file lock)"
    detail = text[text.find("(") + 1:text.rfind(")")] if "(" in text else text
    return f"not a readable HDF5 file ({detail}); damaged, perhaps by a crash during a write"


def _stat_key(path):
    if hasattr(path, "replaced"):  # a remote object: a new ETag is a new version
        path.replaced()
        return path.version().etag
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino


def open_file(path, *, verify_crc=True, writable=False):
    """The MultiHDF5 at ``path`` (it has no CRCs to verify)."""
    return MultiHDF5.open(path, writable=writable)


def create_file(path, *, variant, block_size, use_crc):
    """A new, empty MultiHDF5 at ``path``."""
    if use_crc:
        raise CtdsfsError("MultiHDF5 has no CRCs")
    return MultiHDF5.new(path, block_size=block_size)


def open_from_store(store, *, verify_crc=True):
    """The MultiHDF5 in a read-only ``store`` (a remote object; the probe child reads the
    same version of it, so the store must say how: ``child_spec``)."""
    if not hasattr(store, "child_spec"):
        raise CtdsfsError(f"{store.label}: MultiHDF5 is read from local files, s3:// and "
                          "http(s):// only")
    return MultiHDF5.open(store)
