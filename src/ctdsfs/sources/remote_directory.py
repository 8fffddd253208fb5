"""An ``s3://bucket/prefix/`` as a read-only directory source.

Objects directly under the prefix are files, deeper prefixes ("/" as S3's
delimiter shows them) are directories, container objects (``.mf``,
``.mfh5``, ``.pycauset``) are directories of their insides, and a prefix
holding a MultiFile-stored casacore table (``table.dat`` beside ``table.mf``)
gets the legacy table view of ``directory.TableView``, so casacore 3.5 opens
a MeasurementSet straight from the bucket. A directory is listed when it is
first looked at (a listing is bounded: MAX_LISTING entries; names are untrusted
and checked like a container's), then again in the background every
``revalidate`` seconds while it is used (at once when a read found an object
replaced), so a lookup never waits for the server. A listing names each
object's version (ETag and size): files are RemoteStores pinned to it, sharing
one S3 client; an object listed with another version gets a new store (and its
container is reopened), so a read serves one version whole or fails (EIO).
What an entry holds is found out (a container's header GET, a sub-prefix's LIST)
outside the directory's lock, so that no other request waits for that server.
"""

import dataclasses
import logging
import time

from ..container import Usage, name_problem
from ..errors import CtdsfsError
from ..formats import open_from_store
from ..remote.retry import request_deadline
from ..remote.store import RemoteError, RemoteStore, Revalidation, retried, s3_backend, source_stat
from .directory import CONTAINER_SUFFIXES, TABLE_CONTAINERS, DirectorySource, TableView

log = logging.getLogger(__name__)

MAX_LISTING = 100_000  # entries one directory shows
MAX_TABLE_DAT = 64 << 20  # a table.dat is kilobytes; a listing claiming more is refused
MAX_PROBLEMS = 1000  # problems one directory keeps for ``formats.check`` (each is logged once)


def _listing(backend, prefix, options, label):
    """``({file name: version}, {directory names}, [problems])`` of one prefix."""
    objects, prefixes, cut = retried(label, options, "LIST", backend.list, prefix, MAX_LISTING,
                                     until=request_deadline(options))
    problems = [f"more than {MAX_LISTING} entries: the rest are not shown"] if cut else []
    dirs = set()
    for name in prefixes:
        why = name_problem(name) if name else "an empty name"
        if why:
            problems.append(f"{name!r} hidden: {why}")
        else:
            dirs.add(name)
    files = {}
    for name, version in objects.items():
        if not name:
            continue  # the object named like the prefix itself (a "directory marker")
        why = name_problem(name) or ("also a directory" if name in dirs else None)
        if why:
            problems.append(f"{name!r} hidden: {why}")
        else:
            files[name] = version
    return files, dirs, problems


def _is_table(files):
    """Whether a prefix's objects are a MultiFile-stored casacore table."""
    return "table.dat" in files and any(n in files for n in TABLE_CONTAINERS)


class RemotePrefix(DirectorySource):
    """One prefix of a bucket: its objects and sub-prefixes, read-only."""

    format_name = "object store prefix"
    read_into = None  # (a local directory's; objects are read through their stores)

    def __init__(self, backend, prefix, options, *, recurse=True, verify_crc=True,
                 listing=None):
        super().__init__(f"s3://{backend.bucket}/{prefix}", recurse=recurse,
                         verify_crc=verify_crc)
        self.backend, self.prefix, self.options = backend, prefix, options
        self._files, self._dirs, problems = listing or _listing(backend, prefix, options,
                                                               self.label)
        for text in problems:
            log.warning("%s: %s", self.label, text)
        self.problems.extend(problems)
        self._stores = {}  # name -> the RemoteStore of a plain file
        self._container_stores = {}  # name -> the RemoteStore under a nested container
        self.listed_at = time.time()
        self._revalidation = Revalidation(self.label, options.revalidate, self._relist,
                                          "list it again")
        self.outdated = False  # the listing now asks for another kind of directory source

    def _new_store(self, name):
        return RemoteStore(self.label + name, self.options, version=self._files[name],
                           backend=self.backend.for_key(self.prefix + name))

    def _store(self, name):
        with self._lock:
            store = self._stores.get(name)
            if store is None:
                store = self._stores[name] = self._new_store(name)
            return store

    def names(self):
        return sorted(self._files.keys() | self._dirs)

    def contains(self, name):
        return name in self._files or name in self._dirs

    def entry_size(self, key):
        if key in self._files:
            return self._files[key].size
        if key in self._dirs:
            return 0
        raise FileNotFoundError(key)

    def entry_blocks(self, key):
        return -(-self.entry_size(key) // 4096)

    def usage(self):
        return Usage(4096, sum(-(-v.size // 4096) for v in self._files.values()), 0)

    def read(self, key, offset, size):
        if key not in self._files:
            raise FileNotFoundError(key)
        return self._store(key).view(offset, size)

    def cached(self, key, offset, size):
        return key in self._files and self._store(key).cached(offset, size)

    def symlink_target(self, name):
        return None

    def nested(self, name):
        """``Container.nested``, opened outside this directory's lock (a LIST or a header
        GET may wait for the server as long as a request may): the first opened is kept,
        one opened meanwhile by another request is closed."""
        with self._lock:
            if name in self._nested:
                return self._nested[name]
            listed = self._listed_as(name)
        if listed is None:
            return None
        child, store = self._open_entry(name)
        with self._lock:
            if name not in self._nested and self._listed_as(name) == listed:
                self._nested[name] = child
                if store is not None:
                    self._container_stores[name] = store
            kept, known = self._nested.get(name), name in self._nested
        if child is not None and kept is not child:
            child.close()
        if not known:  # (listed again meanwhile, as another version, or gone)
            raise RemoteError(f"{self.label}{name}: replaced on the server while being "
                              "opened (opened anew at the next access)",
                              "replaced on the server while being opened")
        return kept

    def _listed_as(self, name):
        """What the listing says ``name`` is: a directory, a version, or absent."""
        return "directory" if name in self._dirs else self._files.get(name)

    def _open_entry(self, name):
        """``(what name holds, the store it reads)``: a sub-prefix, a container (with its
        store), or ``(None, None)`` for a plain file."""
        if name in self._dirs:
            return remote_directory_or_table(self.backend, f"{self.prefix}{name}/",
                                             self.options, recurse=self.recurse,
                                             verify_crc=self.verify_crc), None
        if not (self.recurse and name in self._files and name.endswith(CONTAINER_SUFFIXES)):
            return None, None
        store = self._new_store(name)
        try:
            return open_from_store(store, verify_crc=self.verify_crc), store
        except RemoteError:
            raise  # a failed GET tells nothing of the object: EIO now, tried again next time
        except CtdsfsError as exc:
            self.problems.append(f"{name!r} shown as a file: {exc}")
            log.warning("%s: %r shown as a file: %s", self.label, name, exc)
            return None, None

    def stat(self):
        """What a mount shows as this directory's owner, modes and times."""
        return source_stat(self.listed_at)

    # ------------------------------------------------------------ coherence

    def reload_if_changed(self):
        """Apply a listing the background found, start the next one when it is due, and
        do the same in the sub-prefixes looked at; True if anything shown changed.
        Never waits for the server."""
        with self._lock:
            stale = any(s.stale for s in [*self._stores.values(),
                                          *self._container_stores.values()])
            children = [(n, c) for n, c in self._nested.items() if isinstance(c, RemotePrefix)]
        listing = self._revalidation.take(urgent=stale)
        changed = listing is not None and self._apply(listing)
        for name, child in children:
            changed = child.reload_if_changed() or changed
            new = child.reopened()
            if new is not None:
                with self._lock:
                    if self._nested.get(name) is child:
                        self._nested[name] = new
                child.close()
        return changed

    def _relist(self):
        """One LIST, no retries (the next check asks again)."""
        return _listing(self.backend, self.prefix, dataclasses.replace(self.options, retries=0),
                        self.label)

    def _apply(self, listing):
        """Show ``listing``; the stores and containers of objects replaced or gone are
        closed (a name asked for again opens the listed version). True if it differs."""
        files, dirs, problems = listing
        with self._lock:
            if (files, dirs) == (self._files, self._dirs):
                return False
            gone = {n for n, v in self._files.items() if files.get(n) != v} | (self._dirs - dirs)
            changes = len(gone | (files.keys() - self._files.keys()) | (dirs - self._dirs))
            retired = [holder.pop(n) for holder in (self._stores, self._container_stores,
                                                    self._nested)
                       for n in gone if n in holder]
            self._files, self._dirs = files, dirs
            new_problems = [p for p in problems if p not in self.problems]
            self.problems.extend(new_problems[:max(0, MAX_PROBLEMS - len(self.problems))])
            self.listed_at = time.time()
            self.outdated = self._is_outdated()
        for text in new_problems:
            log.warning("%s: %s", self.label, text)
        for thing in retired:
            if thing is not None:
                thing.close()
        log.info("%s: listed again: %d name(s) new, replaced or gone", self.label, changes)
        return True

    def _is_outdated(self):
        """A table appeared: this prefix is reopened as a table view (``reopened``)."""
        return _is_table(self._files)

    def _listing_now(self):
        """The listing shown, as ``_listing`` gives one (its problems already logged)."""
        return self._files, self._dirs, []

    def reopened(self):
        """This prefix opened again when its listing asks for another kind (a table
        appeared in it, or its table went), else None; if that fails it stays as it is
        until its listing changes again."""
        if not self.outdated:
            return None
        self.outdated = False
        try:
            return remote_directory_or_table(self.backend, self.prefix, self.options,
                                             listing=self._listing_now(), recurse=self.recurse,
                                             verify_crc=self.verify_crc)
        except CtdsfsError as exc:
            log.warning("%s: cannot open it again: %s", self.label, exc)
            return None

    def close(self):
        super().close()
        for store in [*self._stores.values(), *self._container_stores.values()]:
            store.close()


class RemoteTableView(TableView, RemotePrefix):
    """A MultiFile-stored table under a prefix, shown as a table in separate files
    (``TableView``'s reading, over the prefix's objects)."""

    def __init__(self, backend, prefix, options, *, listing, **flags):
        RemotePrefix.__init__(self, backend, prefix, options, listing=listing, **flags)
        self.container_name = next(n for n in TABLE_CONTAINERS if n in self._files)
        self.container = self._open_table_container()
        self._staged = None
        self._translated = None

    def _open_table_container(self):
        store = self._container_stores[self.container_name] = \
            self._new_store(self.container_name)
        return open_from_store(store, verify_crc=self.verify_crc)

    def _apply(self, listing):
        """A replaced table container is reopened (table.dat follows its ETag by itself)."""
        stored = self._files.get(self.container_name)
        if not RemotePrefix._apply(self, listing):
            return False
        if not self.outdated and self._files[self.container_name] != stored:
            old, self.container = self.container, self._open_table_container()
            old.close()
        return True

    def _is_outdated(self):
        """No table any more: this prefix is reopened as a plain one (``reopened``)."""
        return self.container_name not in self._files or not _is_table(self._files)

    def _stored_table_dat(self):
        size = self._files["table.dat"].size
        if size > MAX_TABLE_DAT:
            raise CtdsfsError(f"{self.label}table.dat: {size} bytes is no table.dat")
        return self._store("table.dat").pread(0, size)

    def _table_dat_version(self):
        return self._store("table.dat").version().etag


def remote_directory_or_table(backend, prefix, options, **flags):
    """The table view of a prefix holding a MultiFile-stored table, else the prefix."""
    label = f"s3://{backend.bucket}/{prefix}"
    listing = flags.pop("listing", None) or _listing(backend, prefix, options, label)
    if _is_table(listing[0]):
        try:
            return RemoteTableView(backend, prefix, options, listing=listing, **flags)
        except CtdsfsError as exc:
            log.warning("%s: shown as it is, not as a table: %s", label, exc)
    return RemotePrefix(backend, prefix, options, listing=listing, **flags)


def open_remote_directory(url, options, **flags):
    """``s3://bucket/prefix/`` as a directory source (HTTP has no listing)."""
    if not url.startswith("s3://"):
        raise CtdsfsError(f"{url}: only s3:// sources can be directories (HTTP has no "
                          "listing); name one object")
    backend = s3_backend(url, options)
    return remote_directory_or_table(backend, backend.key, options, **flags)
