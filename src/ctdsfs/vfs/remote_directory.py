"""An ``s3://bucket/prefix/`` as a read-only directory source.

Objects directly under the prefix are files, deeper prefixes ("/" as S3's
delimiter shows them) are directories, container objects (``.mf``,
``.mfh5``, ``.pycauset``) are directories of their insides, and a prefix
holding a MultiFile-stored casacore table (``table.dat`` beside ``table.mf``)
gets the legacy table view of ``directory.TableView``, so casacore 3.5 opens
a MeasurementSet straight from the bucket. Each directory is listed once, when
it is first looked at (a listing is bounded: MAX_LISTING entries); names
are untrusted and checked like a container's. Files are RemoteStores sharing
one S3 client.
"""

import logging
import time

from ..container import Usage, name_problem
from ..errors import CtdsfsError
from ..formats import open_from_store
from ..formats.remote import RemoteStore, retried, s3_backend, source_stat
from .directory import CONTAINER_SUFFIXES, TABLE_CONTAINERS, DirectorySource, TableView

log = logging.getLogger(__name__)

MAX_LISTING = 100_000  # entries one directory shows
MAX_TABLE_DAT = 64 << 20  # a table.dat is kilobytes; a listing claiming more is refused


def _listing(backend, prefix, options, label):
    """``({file name: size}, {directory names}, [problems])`` of one prefix."""
    objects, prefixes, cut = retried(label, options, "LIST", backend.list, prefix, MAX_LISTING)
    problems = [f"more than {MAX_LISTING} entries: the rest are not shown"] if cut else []
    dirs = set()
    for name in prefixes:
        why = name_problem(name) if name else "an empty name"
        if why:
            problems.append(f"{name!r} hidden: {why}")
        else:
            dirs.add(name)
    files = {}
    for name, size in objects.items():
        if not name:
            continue  # the object named like the prefix itself (a "directory marker")
        why = name_problem(name) or ("also a directory" if name in dirs else None)
        if why:
            problems.append(f"{name!r} hidden: {why}")
        else:
            files[name] = size
    return files, dirs, problems


class RemotePrefix(DirectorySource):
    """One prefix of a bucket: its objects and sub-prefixes, read-only."""

    format_name = "object store prefix"

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
        self._stores = {}
        self.listed_at = time.time()

    def _new_store(self, name):
        return RemoteStore(self.label + name, self.options,
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
            return self._files[key]
        if key in self._dirs:
            return 0
        raise FileNotFoundError(key)

    def entry_blocks(self, key):
        return -(-self.entry_size(key) // 4096)

    def usage(self):
        return Usage(4096, sum(-(-size // 4096) for size in self._files.values()), 0)

    def read(self, key, offset, size):
        if key not in self._files:
            raise FileNotFoundError(key)
        return self._store(key).pread(offset, size)

    def symlink_target(self, name):
        return None

    def _open_nested(self, name):
        if name in self._dirs:
            return remote_directory_or_table(self.backend, f"{self.prefix}{name}/", self.options,
                                             recurse=self.recurse, verify_crc=self.verify_crc)
        if not (self.recurse and name in self._files and name.endswith(CONTAINER_SUFFIXES)):
            return None
        try:
            return open_from_store(self._new_store(name), verify_crc=self.verify_crc)
        except CtdsfsError as exc:
            self.problems.append(f"{name!r} shown as a file: {exc}")
            log.warning("%s: %r shown as a file: %s", self.label, name, exc)
            return None

    def stat(self):
        """What a mount shows as this directory's owner, modes and times."""
        return source_stat(self.listed_at)

    def close(self):
        super().close()
        for store in self._stores.values():
            store.close()


class RemoteTableView(TableView, RemotePrefix):
    """A MultiFile-stored table under a prefix, shown as a table in separate files
    (``TableView``'s reading, over the prefix's objects)."""

    def __init__(self, backend, prefix, options, *, listing, **flags):
        RemotePrefix.__init__(self, backend, prefix, options, listing=listing, **flags)
        self.container_name = next(n for n in TABLE_CONTAINERS if n in self._files)
        self.container = open_from_store(self._new_store(self.container_name),
                                         verify_crc=self.verify_crc)
        self._staged = None
        self._translated = None

    def _stored_table_dat(self):
        size = self._files["table.dat"]
        if size > MAX_TABLE_DAT:
            raise CtdsfsError(f"{self.label}table.dat: {size} bytes is no table.dat")
        return self._store("table.dat").pread(0, size)

    def _table_dat_version(self):
        return self._store("table.dat").version().etag


def remote_directory_or_table(backend, prefix, options, **flags):
    """The table view of a prefix holding a MultiFile-stored table, else the prefix."""
    label = f"s3://{backend.bucket}/{prefix}"
    listing = _listing(backend, prefix, options, label)
    files = listing[0]
    if "table.dat" in files and any(n in files for n in TABLE_CONTAINERS):
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
