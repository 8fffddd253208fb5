"""The format-neutral container interface that every format implements.

A container is a flat namespace of named byte streams (virtual files); a
stream whose content is itself a container is offered through ``nested()``,
which is how hierarchy arises (casacore nests a subtable's MultiFile inside its
parent's). The VFS only ever talks to this interface.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, NamedTuple, Optional, Union

from .errors import CtdsfsError, ReadOnlyError

MAX_NAME_BYTES = 255
MAX_NESTING = 32  # containers in containers, at most (a file that nests itself ends there)
# The kernel caps FUSE readahead at 128 KiB, so a sequential reader costs one round trip
# per 128 KiB; 1 MiB requests cost an eighth of the round trips.
READAHEAD_KB = 1024

# A virtual file: its name, or (a file unlinked while open) the key ``remove`` returned.
Key = Any
# What a read gives: bytes, or a read-only memoryview of a decoded piece.
Data = Union[bytes, memoryview]
# (problems, notes) of ``ctdsfs check``, each a 'location: text' line.
Findings = tuple[list[str], list[str]]


def name_problem(name: str) -> Optional[str]:
    """Why an entry name from a container cannot be shown as a file name, or None."""
    if name in (".", ".."):
        return "reserved name"
    if "/" in name or "\0" in name:
        return "name contains '/' or NUL"
    # (UTF-8 takes at most 4 bytes a character: short names need no encoding.)
    if len(name) * 4 > MAX_NAME_BYTES and \
            len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return "name longer than 255 bytes"
    return None


class Usage(NamedTuple):
    """Space accounting in the container's own block size (for statfs)."""

    block_size: int
    total_blocks: int
    free_blocks: int


class Container(ABC):
    """One container. Reads must be thread-safe; writes are serialised by the caller.

    Entries are addressed by name, or (for a file unlinked while still open) by
    the key ``remove(name, keep_open=True)`` returned. Formats that cannot do
    something raise NotPermitted; a read-only container raises ReadOnlyError.
    """

    label: str  # names the container (and the nesting path) in messages
    format_name: str
    problems: list[str]  # entries hidden or shown as plain files, with the reason
    writable: bool
    failure: Optional[str]  # why writing was switched off, if it was
    _lock: Any  # one lock (an RLock) per container, or per tree of them
    _nested: dict[str, Optional[Container]]  # nested() keeps what it opened here
    # (the block containers' own: their entries by name, and how one is removed)
    _entries: dict[str, Any]
    _remove: Callable[[str, bool], Optional[Key]]
    checks_reads = False  # reads do real work (CRCs): worth a worker thread
    kernel_write_cache = False  # the kernel may gather writes and send them late
    kernel_keeps_pages = True  # False: a write may change other bytes (a view's header),
    # so the kernel must drop a file's cached pages when it is opened again
    holds_links = False  # some names may be symbolic links (``symlink_target`` says which)
    holds_directories = True  # False: no entry is a directory (a stat need not list it)
    # The kernel's readahead for a mount of this container: the size of its read requests
    # to a sequential reader, and what a mapped reader's page fault reads around itself.
    readahead_kb = READAHEAD_KB

    # Writes to the files wait for a commit that makes them durable all at once (False: they
    # go into the files in place as they come).
    atomic_commits = False

    def commits_atomically(self, name: str) -> bool:
        """Whether writes to file ``name`` are committed all at once (``atomic_commits``)."""
        return self.atomic_commits

    # -- reading

    @abstractmethod
    def names(self) -> list[str]:
        """Names of the visible virtual files, in the container's own order."""

    def contains(self, name: str) -> bool:
        """Whether ``name`` is a visible virtual file (without listing them all)."""
        try:
            self.entry_size(name)
        except FileNotFoundError:
            return False
        return True

    @abstractmethod
    def entry_size(self, key: Key) -> int:
        """Size in bytes of a virtual file."""

    @abstractmethod
    def entry_blocks(self, key: Key) -> int:
        """Number of container blocks the virtual file occupies."""

    def entry_stats(self, names: list[str]) -> list[tuple[int, int]]:
        """``[(entry_size, entry_blocks)]`` of ``names``: a listing asks for a batch at once,
        which a format may answer without a call per name."""
        return [(self.entry_size(name), self.entry_blocks(name)) for name in names]

    @abstractmethod
    def read(self, key: Key, offset: int, size: int) -> Data:
        """Up to ``size`` bytes from ``offset``, as bytes or a read-only memoryview (a
        decoded piece is handed to the kernel without a copy: callers that keep or parse
        the data take ``bytes()`` of it); raises BlockError for a bad block."""

    def cached(self, key: Key, offset: int, size: int) -> bool:
        """Whether ``read(key, offset, size)`` is answered from memory at once, without
        waiting for a disk or a server (then a mount serves it without a thread's hop).
        False when unsure."""
        return False

    def nested(self, name: str) -> Optional[Container]:
        """The container stored in virtual file ``name``, or None if it is a plain file.

        Opened once and kept (in ``self._nested``, under ``self._lock``), so every
        caller sees the same nested container object.
        """
        with self._lock:
            if name not in self._nested:
                self._nested[name] = self._open_nested(name)
            return self._nested[name]

    def classify(self, names: list[str]) -> list[Optional[Container]]:
        """``nested(name)`` for every name, as a list. A format that tells a nested
        container by a file's first bytes overrides it to read them all in one pass."""
        return [self.nested(name) for name in names]

    def _open_nested(self, name: str) -> Optional[Container]:
        """Open the container stored in ``name``; None for a plain file."""
        return None

    def symlink_target(self, name: str) -> Optional[str]:
        """The text of ``name`` if it is a symbolic link (directory sources only), else None."""
        return None

    @abstractmethod
    def usage(self) -> Usage:
        """A :class:`Usage` for this container."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-ready dict of the container's internals (``ctdsfs info``)."""

    def info_lines(self, info: dict[str, Any]) -> list[str]:
        """``ctdsfs info`` as text, from what :meth:`describe` gave (formats say more)."""
        return ([f"{info['container']}: {info['format']}"]
                + [f"    {f['size']:>10}  {f['name']}{'/' if f.get('nested') else ''}"
                   for f in info.get("files", [])]
                + [f"  problem: {p}" for p in info.get("problems", [])])

    def check(self, bar: Any = None) -> Findings:
        """(problems, notes) of ``ctdsfs check``, each a 'location: text' line.

        Formats that can verify more than opening does (checksums, every chunk
        decoding) override this; ``bar.update(n)`` follows the bytes read.
        """
        return [f"{self.label}: {p}" for p in self.problems], []

    @abstractmethod
    def reload_if_changed(self) -> bool:
        """Re-read the header if another process committed since; True if it did."""

    def reopened(self) -> Optional[Container]:
        """The container to show in this one's place now that what it holds asks for
        another kind (a prefix a table was put into), else None. A parent asks its
        children; the mount asks its root."""
        return None

    # -- writing

    @abstractmethod
    def create(self, name: str) -> None:
        """A new, empty virtual file (FileExistsError if there is one)."""

    @abstractmethod
    def write(self, key: Key, offset: int, data: bytes) -> int:
        """Write at any offset; a gap before ``offset`` reads as zeros. Returns the count."""

    @abstractmethod
    def truncate(self, key: Key, size: int) -> None:
        """Shrink or grow (with zeros) a virtual file."""

    @abstractmethod
    def remove(self, name: str, keep_open: bool = False) -> Optional[Key]:
        """Delete ``name``; with ``keep_open`` return a key that keeps its data until
        :meth:`release`."""

    def release(self, key: Key) -> None:
        """Free what an unlinked-but-open file still holds."""

    @abstractmethod
    def rename(self, old: str, new: str) -> None:
        """Rename within this container, replacing an existing ``new``."""

    @abstractmethod
    def make_nested(self, name: str) -> Container:
        """A new virtual file holding an empty nested container; returns it."""

    @property
    @abstractmethod
    def dirty(self) -> bool:
        """Whether there are changes that ``commit()`` would make durable."""

    @abstractmethod
    def commit(self) -> bool:
        """Make every change durable, crash-consistently; True if anything was written."""

    def close(self) -> None:
        """Commit what is pending (if writable) and release the underlying file."""
        with self._lock:
            try:
                if self.writable:
                    self.commit()
            finally:
                self.abandon()

    # -- plumbing the block containers share (``_entries``, ``_nested``, ``_remove``)

    def _entry(self, key: Key) -> Any:
        """An entry by name, or the entry itself (an unlinked file still open)."""
        if not isinstance(key, str):
            return key
        try:
            return self._entries[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def _name_problem(self, name: str) -> Optional[str]:
        """Why ``name`` cannot be an entry of this container, or None."""
        return name_problem(name)

    def _check_new_name(self, name: str) -> None:
        why = self._name_problem(name) if name else "empty name"
        if why:
            raise CtdsfsError(f"{name!r}: {why}")

    def _check_new_entry(self, name: str) -> None:
        """``name`` may be given to a new entry: a valid name, not in use."""
        self._check_new_name(name)
        if name in self._entries:
            raise FileExistsError(name)

    def _rename_entry(self, old: str, new: str, relink: Callable[[Any, str], None]) -> None:
        """rename(2) within the container: an existing ``new`` is replaced, and a nested
        container keeps its object under the new name. ``relink(entry, new)`` does the
        format's own part."""
        if old == new:
            return
        entry = self._entry(old)
        self._check_new_name(new)
        if new in self._entries:
            self._remove(new, False)
        relink(entry, new)
        del self._entries[old]
        self._entries[new] = entry
        if old in self._nested:
            child = self._nested.pop(old)
            self._nested[new] = child
            if child is not None:
                child._relabel(f"{self.label}/{new}", new)

    def _relabel(self, label: str, name: str) -> None:
        """This nested container's entry was renamed: messages name the new path."""
        self.label = label
        for child_name, child in self._nested.items():
            if child is not None:
                child._relabel(f"{label}/{child_name}", child_name)

    def _set_read_only(self, reason: str) -> None:
        """Switch this container and all nested in it to read-only, saying why."""
        self.writable = False
        self.failure = reason
        for child in self._nested.values():
            if child is not None:
                child._set_read_only(reason)

    def abandon(self) -> None:
        """Release the underlying file without committing (its creator deletes it)."""


class DerivedView(Container):
    """A directory computed from a source's own files (a bcolz rootdir, a TileDB array).

    Its entries (name -> bytes, a file object with ``size()`` and ``read(offset,
    size)``, or a nested container) are made by ``_build()`` on first use, or
    added as the view opens. What it shows is worked out from the source's
    files, and what it writes (if it writes) goes to them at once: nothing
    waits for a commit unless a subclass says so. Closing closes the views
    shown inside it (``_shown_views``).
    """

    BLOCK_SIZE = 4096  # (only for stat: a view has no blocks of its own)
    writable = False
    failure = None
    read_only_note = ""  # what a refused change adds to "LABEL is read-only"

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems = []
        self._lock = threading.RLock()
        self._nested = {}
        self._built: Optional[dict[str, Any]] = None

    def _build(self) -> dict[str, Any]:
        """The entries, in order (a view that adds them as it opens starts with none)."""
        return {}

    @property
    def _entries(self) -> dict[str, Any]:  # type: ignore[override]  # (built, never assigned)
        with self._lock:
            if self._built is None:
                self._built = self._build()
            return self._built

    def names(self) -> list[str]:
        return list(self._entries)

    def contains(self, name: str) -> bool:
        try:
            self._entry(name)
        except FileNotFoundError:
            return False
        return True

    def _file_size(self, entry: Any) -> int:
        """A file object's size (a format whose objects say it otherwise overrides this)."""
        return entry.size()

    def entry_size(self, key: Key) -> int:
        entry = self._entry(key)
        if isinstance(entry, Container):
            return 0
        return len(entry) if isinstance(entry, bytes) else self._file_size(entry)

    def entry_blocks(self, key: Key) -> int:
        return -(-self.entry_size(key) // self.BLOCK_SIZE)

    def read(self, key: Key, offset: int, size: int) -> Data:
        entry = self._entry(key)
        if isinstance(entry, Container):
            raise IsADirectoryError(key)
        if isinstance(entry, bytes):
            return entry[offset:offset + size]
        return entry.read(offset, size)

    def nested(self, name: str) -> Optional[Container]:
        entry = self._entry(name)
        return entry if isinstance(entry, Container) else None

    def usage(self) -> Usage:
        return Usage(self.BLOCK_SIZE, 0, 0)

    def describe(self) -> dict[str, Any]:
        return {"container": self.label, "format": self.format_name,
                "files": [{"name": n, "size": self.entry_size(n)} for n in self.names()],
                "problems": list(self.problems)}

    def _refuse_read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise ReadOnlyError(f"{self.label} is read-only{self.read_only_note}")

    create = write = truncate = remove = rename = make_nested = _refuse_read_only

    @property
    def dirty(self) -> bool:
        return False

    def commit(self) -> bool:
        return False

    def reload_if_changed(self) -> bool:
        return False

    def _shown_views(self) -> list[Container]:
        """The nested views among the entries made so far (none are made to close them)."""
        return [e for e in list((self._built or {}).values()) if isinstance(e, Container)]

    def close(self) -> None:
        for view in self._shown_views():
            view.close()
