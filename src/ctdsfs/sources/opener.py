"""The one way in: any source a user names, opened as the container tree that is shown.

``mount.ctdsfs``, every ``ctdsfs`` command that reads a source and the fsspec
filesystem call :func:`open_source`; nothing else opens a source. A source is

* a local file: the container its content declares (``formats.open_container``),
  or a new one where none exists and ``create`` is asked;
* a local directory: a directory source (``sources.directory``), or the directory
  format its layout declares (a TileDB array, a bcolz rootdir);
* ``s3://BUCKET/KEY`` or ``http(s)://HOST/PATH``: one object, read in ranges;
  ``s3://BUCKET/PREFIX/``: a prefix as a directory source;
* any other fsspec URL (``memory://``, ``gcs://``, a chain ``a::b``) or a path of
  another fsspec filesystem (``protocol``): one object, through that filesystem.

:class:`OpenOptions` holds everything that shapes the tree. The views are laid
here, over whatever was opened, in this order: the legacy table view over every
table stored in a container (``sources.table_views``; directory sources lay it
themselves), then ``columns/`` in every table (``sources.columns``). A new view is
one more wrapper laid here, passing on what it does not change and wrapping
every nested container it hands out.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..errors import CtdsfsError
from ..formats import (
    REMOTE_SCHEMES,
    create_container,
    holds_time_travel,
    open_container,
    open_from_store,
)

DEFAULT_BLOCK_SIZE = 4 << 20  # of a container made by ``create`` (casacore's for tables)


@dataclass(frozen=True)
class OpenOptions:
    """What shapes the tree shown for a source."""

    writable: bool = False
    create: bool = False  # a new, empty container where the local file does not exist
    block_size: int = DEFAULT_BLOCK_SIZE  # ... with this block size
    new_crc: bool = False  # ... and per-block CRCs
    verify_crc: bool = True
    recurse: bool = True  # directory sources: container files shown as directories
    views: bool = True  # the legacy table view over tables stored in containers (False:
    # every container as it is stored, for the commands that look at the storage itself)
    columns: bool = False  # columns/ (casacore columns as NumPy) in every table
    timestamp: Optional[tuple[int, int]] = None  # TileDB arrays as at (start, end), ms
    remote: Any = None  # RemoteOptions of an s3:// or http(s):// source (None: defaults)
    protocol: Optional[str] = None  # another fsspec filesystem the source is a path of
    storage_options: Mapping[str, Any] = field(default_factory=dict)  # ... and its options
    hide: frozenset[str] = frozenset()  # real paths a directory source never shows


@dataclass
class OpenedSource:
    """The tree shown for a source, and what a mount needs to know of the source."""

    container: Any  # a Container, or a view wrapping one (the same interface)
    name: str  # the source as messages name it: an absolute path or the URL
    remote: bool  # read from a server (s3://, http(s)://, another fsspec filesystem)
    # what a mount shows as a remote source's owner, modes and times (None: the local
    # source's own; for an s3:// prefix the mount asks its root, which may be reopened)
    stat: Optional[Callable[[], Any]] = None


def _is_fsspec_url(source: str) -> bool:
    """A URL of another fsspec filesystem, or a chain of them (``a::b``)."""
    return "::" in source or ("://" in source and not source.startswith("file://"))


def open_source(source: str | os.PathLike, options: OpenOptions = OpenOptions()) -> OpenedSource:
    """The tree shown for ``source`` with ``options`` (see the module docstring); a source
    that cannot be opened as asked is a one-line CtdsfsError."""
    text = os.fspath(source)
    if options.protocol and options.protocol not in ("file", "local"):
        text = text if "://" in text else f"{options.protocol}://{text}"
    elif text.startswith("file://"):
        text = text[len("file://"):]
    remote = text.startswith(REMOTE_SCHEMES) or (_is_fsspec_url(text)
                                                 and not os.path.lexists(text))
    if remote and (options.writable or options.create):
        raise CtdsfsError(f"{text}: a remote source is read-only (-o rw and create are "
                          "refused)")
    if options.remote is not None and not text.startswith(REMOTE_SCHEMES):
        raise CtdsfsError(f"{text}: remote options are for an s3:// or http(s):// source only")
    name = text if remote else os.path.abspath(text)
    _check_time_travel(name, remote, options)
    stat = None
    if text.startswith(REMOTE_SCHEMES):
        container, stat = _open_remote(text, options)
    elif remote:
        container, stat = _open_fsspec(text, options)
    else:
        container = _open_local(name, options)
    if options.views and not options.writable:
        from .table_views import with_table_views

        container = with_table_views(container)
    if options.columns:
        from .columns import with_columns

        container = with_columns(container)
    return OpenedSource(container, name, remote, stat)


def _check_time_travel(name: str, remote: bool, options: OpenOptions) -> None:
    """A ``timestamp`` needs a local tree showing a TileDB array (or group)."""
    if options.timestamp is None:
        return
    if remote or not os.path.isdir(name):
        raise CtdsfsError(f"{name}: 'timestamp' is for TileDB arrays (a local directory: an "
                          "array, a group or a tree holding them)")
    if not (options.recurse and holds_time_travel(os.path.realpath(name))):
        raise CtdsfsError(f"{name}: 'timestamp' is for TileDB arrays, and this tree shows "
                          f"none{'' if options.recurse else ' (norecurse)'}")


def _open_remote(url: str, options: OpenOptions) -> tuple[Any, Optional[Callable]]:
    from ..remote.store import RemoteOptions, open_remote

    remote = options.remote or RemoteOptions()
    if url.endswith("/"):
        from .remote_directory import open_remote_directory

        prefix = open_remote_directory(url, remote, recurse=options.recurse,
                                       verify_crc=options.verify_crc)
        return prefix, None  # (a mount asks its root: a prefix may be reopened as a table)
    store = open_remote(url, remote)
    return open_from_store(store, verify_crc=options.verify_crc), store.stat


def _open_fsspec(url: str, options: OpenOptions) -> tuple[Any, Callable]:
    from fsspec.core import url_to_fs

    from ..remote.store import source_stat
    from .fsspec_store import FsspecStore

    try:
        fs, path = url_to_fs(url, **options.storage_options)
    except (ImportError, ValueError) as exc:  # an unknown protocol, a missing package
        raise CtdsfsError(f"{url}: {exc}") from None
    container = open_from_store(FsspecStore(fs, path, url), verify_crc=options.verify_crc)
    return container, functools.partial(source_stat, time.time())  # (as opened)


def _open_local(path: str, options: OpenOptions) -> Any:
    if options.create and not os.path.exists(path):  # (a dangling link: "File exists")
        return create_container(path, block_size=options.block_size, use_crc=options.new_crc,
                                format="hdf5" if path.endswith(".mfh5") else "mf2")
    if os.path.isdir(path) and not os.path.islink(path):
        from .directory import directory_or_table

        return directory_or_table(os.path.realpath(path), source=True,
                                  writable=options.writable, recurse=options.recurse,
                                  verify_crc=options.verify_crc, hide=options.hide,
                                  timestamp=options.timestamp)
    return open_container(path, verify_crc=options.verify_crc, writable=options.writable)
