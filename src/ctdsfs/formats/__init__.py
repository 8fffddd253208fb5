"""Pure, synchronous codecs and container classes (no FUSE, no trio: usable as a library),
and the one registry of container formats.

A format is a module in this package that provides ``open_file(path, *,
verify_crc, writable)``, and ``create_file(path, *, variant, block_size,
use_crc)`` if ctdsfs writes it; it joins by one line in ``FORMATS``. Files are
recognised by content, never by name, and cheaply: a format's module (h5py
for MultiHDF5) is imported only once a file turns out to be of that format.
A format stored as a directory (TileDB arrays, bcolz rootdirs) names the
entries one of which each such directory has (``markers``); its module's
``looks_like_directory(path)`` decides, and ``open_file`` opens the directory.
A file format that can also be read from a store other than a local file (an
object on S3 or HTTP, ``remote.py``) gives ``open_from_store(store, *,
verify_crc)``; ``open_container`` takes ``s3://`` and ``http(s)://`` sources.
Nothing outside this registry imports a format to open or create a file, so
the container interface (``ctdsfs.container``) knows no format.
"""

import errno
import importlib
import os
from dataclasses import dataclass

from ..errors import CtdsfsError, FormatError, NotAContainer
from ..io.store import open_if_regular
from ..remote.schemes import REMOTE_SCHEMES

SNIFF_BYTES = 68  # what recognition reads of a file's start


@dataclass(frozen=True)
class Format:
    name: str  # as messages say it
    module: str  # the module of this package that implements it
    magic: bytes = None  # what a file of it starts with; None: the module's looks_like()
    writes: tuple = ()  # the variants ``create_container(format=...)`` makes of it
    markers: tuple = ()  # a directory format: entries one of which each of its directories holds
    travels_in_time: bool = False  # its open_file takes ``timestamp`` (start, end): as at then
    decoded: bool = False  # its files are views decoded from chunks or tiles

    def implementation(self):
        return importlib.import_module(f"{__name__}.{self.module}")

    def recognises(self, first):
        if self.markers:
            return False
        if self.magic is not None:
            return first.startswith(self.magic)
        return self.implementation().looks_like(first)

    def recognises_directory(self, path):
        if not self.markers or not any(os.path.lexists(os.path.join(path, m))
                                       for m in self.markers):
            return False
        return self.implementation().looks_like_directory(path)

    def open_directory(self, path, *, verify_crc=True, writable=False, timestamp=None):
        """The directory at ``path``, as at ``timestamp`` if given and this format travels in
        time (the others show what is there now)."""
        travel = {"timestamp": timestamp} if timestamp and self.travels_in_time else {}
        return self.implementation().open_file(path, verify_crc=verify_crc, writable=writable,
                                               **travel)


FORMATS = (  # in the order files are tried
    Format("MultiHDF5", "multihdf5.container", magic=b"\x89HDF\r\n\x1a\n", writes=("hdf5",)),
    Format(".pycauset", "pycauset", magic=b"PYCAUSET"),
    Format("casacore MultiFile", "multifile.container", writes=("mf2", "mf1")),
    Format("bcolz rootdir", "bcolz.rootdir", markers=("__attrs__",), decoded=True),
    Format("bloscpack", "bcolz.rootdir", magic=b"blpk", decoded=True),
    Format("TileDB array", "tiledb.array",
           markers=("__schema", "__array_schema.tdb", "__tiledb_group.tdb"),  # (< v10; group)
           travels_in_time=True, decoded=True),
)
WRITTEN_FORMATS = tuple(v for f in FORMATS for v in f.writes)


def directory_format(path):
    """The directory format whose layout ``path`` (a real directory, not a link) has, or None."""
    return next((f for f in FORMATS if f.recognises_directory(path)), None)


def holds_time_travel(path):
    """Whether the tree at ``path`` (links not followed) holds a directory of a format that
    travels in time (a TileDB array or group), which a ``timestamp`` applies to."""
    travelling = [f for f in FORMATS if f.travels_in_time]
    return any(f.recognises_directory(folder) for folder, _, _ in os.walk(path)
               for f in travelling)


def open_container(path, *, verify_crc=True, writable=False, remote=None):
    """Open the container at ``path`` with the format its content declares.

    A writable container takes an advisory lock on the file, so a second
    writer gets a clear error instead of corrupting it. ``path`` may be an
    ``s3://`` or ``http(s)://`` address (read-only; ``remote``: RemoteOptions).
    """
    if isinstance(path, str) and path.startswith(REMOTE_SCHEMES):
        if writable:
            raise CtdsfsError(f"{path}: a remote source is read-only")
        if path.endswith("/"):
            raise NotAContainer(f"{path}: a prefix, not one object (mount it to see it as a "
                                "directory)")
        from ..remote.store import open_remote
        return open_from_store(open_remote(path, remote), verify_crc=verify_crc)
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.islink(path):
        fmt = directory_format(path)
        if fmt is None:
            raise NotAContainer(f"{path}: a directory, but not one ctdsfs translates")
        return fmt.open_directory(path, verify_crc=verify_crc, writable=writable)
    try:
        with os.fdopen(open_if_regular(path, follow=True), "rb") as f:
            first = f.read(SNIFF_BYTES)
    except FormatError as exc:  # a FIFO, socket or device: never opened
        raise NotAContainer(str(exc)) from None
    except OSError as exc:
        raise CtdsfsError(f"{path}: {exc.strerror}") from None
    for fmt in FORMATS:
        if fmt.recognises(first):
            return fmt.implementation().open_file(path, verify_crc=verify_crc, writable=writable)
    names = ", ".join(f.name for f in FORMATS)
    raise NotAContainer(f"{path}: not a container ctdsfs knows ({names}): unknown header")


def open_from_store(store, *, verify_crc=True):
    """The container in ``store`` (a read-only store such as a remote object), by its
    content; the container owns the store from here on (closed with it or on failure)."""
    try:
        first = store.pread(0, SNIFF_BYTES)
        fmt = next((f for f in FORMATS if f.recognises(first)), None)
        if fmt is None:
            names = ", ".join(f.name for f in FORMATS)
            raise NotAContainer(f"{store.label}: not a container ctdsfs knows ({names}): "
                                "unknown header")
        opener = getattr(fmt.implementation(), "open_from_store", None)
        if opener is None:
            raise NotAContainer(f"{store.label}: {fmt.name} cannot be read from a remote store")
        return opener(store, verify_crc=verify_crc)
    except BaseException:
        store.close()
        raise


def refuse_existing(path):
    """Nothing is ever overwritten: every command says the same when its output exists."""
    if os.path.lexists(path):
        raise CtdsfsError(f"{os.fspath(path)}: {os.strerror(errno.EEXIST)}")


def create_container(path, *, format="mf2", block_size=65536, use_crc=False):
    """Write a new, empty container at ``path`` (which must not exist) and open it writable.

    ``format`` is one of WRITTEN_FORMATS: MultiFile version 2 (mf2) or 1 (mf1), MultiHDF5.
    """
    path = os.fspath(path)
    refuse_existing(path)
    for fmt in FORMATS:
        if format in fmt.writes:
            return fmt.implementation().create_file(path, variant=format, block_size=block_size,
                                                    use_crc=use_crc)
    raise CtdsfsError(f"unknown container format {format!r} "
                      f"(one of {', '.join(WRITTEN_FORMATS)})")
