"""The container layer as an fsspec filesystem (protocol ``ctdsfs``), for Python code that
may not mount (HPC compute nodes, unprivileged pods).

    fsspec.open("ctdsfs://ANTENNA/table.dat", fo="s3://bucket/obs.mf",
                target_options={"endpoint_url": "http://127.0.0.1:8333"})
    fsspec.open("ctdsfs://ANTENNA/table.dat::s3://bucket/obs.mf", s3={...})

The container is opened by the same code a mount uses (``open_container``;
``s3://`` and ``http(s)://`` through ``remote.store``), and other fsspec
sources (``memory://``, ``gcs://``, ...) through their own filesystem's
ranged reads. Nested containers are directories; files are read in ranges.
Read-only. ``target_options`` (and a chained URL's ``s3={...}``, and the
filesystem's own options, where fsspec puts a chained URL's unscoped storage
options) take s3fs's storage options that make sense for reading: credentials in-process (``key``,
``secret``, ``token``; else the AWS environment and config files, as for the
mount), ``endpoint_url``, ``region``, ``profile``, ``anon``, s3fs's
``client_kwargs`` and ``config_kwargs`` (``_remote_options`` says which), and
the RemoteOptions numbers (``cache_size``, ``chunk_size``, ``timeout``, ...).
``columns=True`` adds ``columns/`` to every casacore table directory, as ``-o columns``
does for a mount (``NAME.npy`` read in ranges: only the rows a range covers are decoded).
The filesystem pickles (fsspec re-creates it from its arguments), so Dask workers can
each open their own (see :mod:`ctdsfs.dask_columns`).
"""

from __future__ import annotations

import dataclasses
import errno
from typing import Any, Mapping, Optional

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import infer_storage_options

from .errors import CtdsfsError
from .formats import REMOTE_SCHEMES
from .remote.store import RemoteOptions
from .sources import opener
from .sources.opener import OpenOptions

REMOTE_FIELDS = {f.name for f in dataclasses.fields(RemoteOptions)}
S3FS_OPTIONS = REMOTE_FIELDS | {"client_kwargs", "config_kwargs"}
# s3fs's storage options that mean something for reading, as RemoteOptions names
CLIENT_KWARGS = {"endpoint_url": "endpoint_url", "region_name": "region",
                 "aws_access_key_id": "key", "aws_secret_access_key": "secret",
                 "aws_session_token": "token"}
CONFIG_KWARGS = {"region_name": "region", "connect_timeout": "timeout",
                 "read_timeout": "timeout", "max_pool_connections": "concurrency"}


def _remote_options(target_options: Mapping[str, Any]) -> RemoteOptions:
    """RemoteOptions from s3fs-style ``target_options``: ``key``, ``secret``, ``token``,
    ``endpoint_url``, ``anon``, ``profile``, ``client_kwargs`` and ``config_kwargs`` (the
    entries of CLIENT_KWARGS and CONFIG_KWARGS), and the RemoteOptions names. Anything
    else is refused, never ignored."""
    given = dict(target_options)
    unknown: list[str] = []
    for nested, names in (("client_kwargs", CLIENT_KWARGS), ("config_kwargs", CONFIG_KWARGS)):
        for name, value in (given.pop(nested, None) or {}).items():
            if name not in names:
                unknown.append(f"{nested}[{name!r}]")
            elif value is not None:
                field = names[name]
                if field == "timeout" and field in given:  # (one for connect and read)
                    given[field] = max(given[field], value)
                else:
                    given.setdefault(field, value)
    unknown += sorted(set(given) - REMOTE_FIELDS)
    if unknown:
        raise ValueError(f"ctdsfs: target option(s) {', '.join(unknown)} not understood")
    return RemoteOptions(**{k: v for k, v in given.items() if v is not None})


def open_source(fo: str, target_protocol: Optional[str] = None,
                target_options: Optional[dict[str, Any]] = None, verify_crc: bool = True,
                columns: bool = False) -> Any:
    """The tree at ``fo`` as a mount of it shows it (a local path, file or directory, an
    ``s3://``/``http(s)://`` address, object or prefix, or a path of another fsspec
    filesystem ``target_protocol``), opened by the one opener."""
    protocol = target_protocol or infer_storage_options(fo)["protocol"]
    if protocol in ("file", "local"):
        fo, protocol = infer_storage_options(fo)["path"], None
    url = fo if "://" in fo or protocol is None else f"{protocol}://{fo}"
    native = url.startswith(REMOTE_SCHEMES)
    options = OpenOptions(
        verify_crc=verify_crc, columns=columns,
        remote=_remote_options(target_options or {}) if native else None,
        storage_options={} if native else dict(target_options or {}))
    return opener.open_source(url, options).container


class CtdsfsFileSystem(AbstractFileSystem):
    """The virtual files of one container (``fo``) as a read-only filesystem."""

    protocol = "ctdsfs"
    root_marker = ""

    def __init__(self, fo: str = "", target_protocol: Optional[str] = None,
                 target_options: Optional[dict[str, Any]] = None, verify_crc: bool = True,
                 columns: bool = False, **kwargs: Any) -> None:
        # s3fs's options given to this filesystem (``fsspec.open("ctdsfs://x::s3://...",
        # key=...)``, pandas' storage_options) are the source's: never dropped unread
        given = {name: kwargs.pop(name) for name in S3FS_OPTIONS & set(kwargs)}
        named = target_options or {}
        twice = sorted(name for name in given.keys() & set(named) if given[name] != named[name])
        if twice:
            raise ValueError(f"ctdsfs: {', '.join(twice)} given twice, differently")
        super().__init__(**kwargs)
        try:
            self.container = open_source(fo, target_protocol, {**given, **named}, verify_crc,
                                         columns)
        except CtdsfsError as exc:
            raise OSError(errno.EIO, str(exc)) from None

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = path[len("ctdsfs://"):] if path.startswith("ctdsfs://") else path
        return path.split("::", 1)[0].strip("/")

    def _locate(self, path: str) -> tuple[Any, Optional[str]]:
        """``(container, name)`` of a file, or ``(container, None)`` of a directory."""
        container = self.container
        parts = [p for p in self._strip_protocol(path).split("/") if p]
        for i, part in enumerate(parts):
            if not container.contains(part):
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            child = container.nested(part)
            if child is None:
                if i + 1 < len(parts):
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
                return container, part
            container = child
        return container, None

    def _entry(self, container: Any, name: str, path: str) -> dict[str, Any]:
        child = container.nested(name)
        return {"name": path, "type": "directory" if child is not None else "file",
                "size": 0 if child is not None else container.entry_size(name)}

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        container, name = self._locate(path)
        if name is None:
            return {"name": path, "type": "directory", "size": 0}
        return self._entry(container, name, path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        container, name = self._locate(path)
        if name is not None:
            entries = [self._entry(container, name, path)]
        else:
            entries = [self._entry(container, n, f"{path}/{n}" if path else n)
                       for n in container.names()]
        return entries if detail else [e["name"] for e in entries]

    def _file(self, path: str) -> tuple[Any, str]:
        """``(container, name)`` of a virtual file (IsADirectoryError for a directory)."""
        container, name = self._locate(path)
        if name is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return container, name

    def cat_file(self, path: str, start: Optional[int] = None, end: Optional[int] = None,
                 **kwargs: Any) -> bytes:
        container, name = self._file(path)
        size = container.entry_size(name)
        start = 0 if start is None else (size + start if start < 0 else start)
        end = size if end is None else (size + end if end < 0 else min(end, size))
        return read_range(container, name, max(0, start), end)

    def _open(self, path: str, mode: str = "rb", block_size: Any = None,
              autocommit: bool = True, cache_options: Optional[dict[str, Any]] = None,
              **kwargs: Any) -> CtdsfsFile:
        if mode != "rb":
            raise OSError(errno.EROFS, "ctdsfs filesystems are read-only", path)
        container, name = self._file(path)
        return CtdsfsFile(self, path, mode, block_size=block_size or "default",
                          cache_options=cache_options, size=container.entry_size(name),
                          entry=(container, name), **kwargs)


def read_range(container: Any, name: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of virtual file ``name``."""
    try:
        return bytes(container.read(name, start, max(0, end - start)))
    except CtdsfsError as exc:
        raise OSError(errno.EIO, str(exc)) from None


class CtdsfsFile(AbstractBufferedFile):
    """A virtual file opened for reading; the file is found once, at the open."""

    def __init__(self, fs: CtdsfsFileSystem, path: str, mode: str, *,
                 entry: tuple[Any, str], **kwargs: Any) -> None:
        self.entry = entry  # (container, name)
        super().__init__(fs, path, mode, **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return read_range(*self.entry, start, end)
