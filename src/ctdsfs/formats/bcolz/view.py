"""What the bcolz views share: untrusted JSON and dtypes, the files a view shows (bytes
made on demand, a .npy header followed by decoded items, one decoded chunk) and the
view base class (read-only unless ``-o rw``, then only items of .npy files take writes)."""

import contextlib
import fcntl
import json
import logging
import os
import re
import stat
import struct

import numpy as np

from ...container import READAHEAD_KB, DerivedView, name_problem
from ...errors import CtdsfsError, FormatError, NotPermitted
from ...io.beneath import create_exclusive_beneath, parent_fd, read_small_beneath
from ...io.lazy_files import LazyBytes
from ...io.store import lock_for_writing, write_all_synced

log = logging.getLogger(__name__)

MAGIC = b"blpk"
SUPERCHUNK_HEADER = struct.Struct("<4sB3xq")  # bcolz: magic, version, chunk count
JSON_BYTES_MAX = 1 << 20  # meta/*, __rootdirs__, bloscpack metadata
ATTRS_BYTES_MAX = 64 << 20  # __attrs__ (user attributes: zipline writes several MB)
CHUNK_BYTES_MAX = 256 << 20  # one decompressed chunk (what a read may allocate)
SUPERCHUNK_NAME = re.compile(r"__(0|[1-9][0-9]{0,17})\.blp\Z")

# ---------------------------------------------------------------- untrusted files

def read_json(root, rel, limit=JSON_BYTES_MAX):
    """The JSON object in regular file ``root/rel`` (reached without following a link),
    refused if it holds more than ``limit`` bytes."""
    where = os.path.join(root, rel)
    try:
        value = json.loads(read_small_beneath(root, rel, limit, where).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FormatError(f"{where}: not a JSON object")
    return value


def read_attrs(root, rel):
    """``__attrs__`` (an empty object if there is none). bcolz users store what they like
    there (zipline: several MB), so it is read whole as bcolz does, up to ATTRS_BYTES_MAX:
    memory follows the file's real size, and a file far past what anyone stores as JSON
    attributes is refused rather than parsed."""
    if not os.path.lexists(os.path.join(root, rel)):
        return {}
    return read_json(root, rel, ATTRS_BYTES_MAX)


def readahead_for_chunks(chunk_bytes):
    """The readahead (KiB) for a mount of carrays of ``chunk_bytes`` chunks: the largest
    power of two up to half a chunk, from 256 KiB to READAHEAD_KB. A mapped reader's page
    fault makes the kernel read the readahead around it, and a sequential reader gets
    requests of that size. With 1 MiB chunks (medians of 7 rounds, docs/benchmarks.md):
    at 1 MiB every fault takes two chunks from disk (random slices 1.6-1.7x bcolz's
    time, whole reads 0.92-0.98x), at 256 KiB mostly one (slices 1.2-1.3x, but whole
    reads 0.97-1.10x: four times the requests), at 512 KiB half the faults take one
    (slices 1.37-1.45x, whole reads 0.86-0.91x): both of bcolz's speeds kept."""
    half_kb = max(1, chunk_bytes // 2 >> 10)
    return max(256, min(READAHEAD_KB, 1 << (half_kb.bit_length() - 1)))


def is_int(value, low=0):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def parse_dtype(text, where):
    """A plain NumPy dtype (numbers, bool, bytes, str, dates) from an untrusted string."""
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except (TypeError, ValueError, SyntaxError, RecursionError):
        dtype = None
    if dtype is None or dtype.fields or dtype.subdtype or dtype.kind not in "biufcSUMm" \
            or not 0 < dtype.itemsize <= 1 << 20:
        raise FormatError(f"{where}: dtype {text!r} is not one ctdsfs shows")
    return dtype


# ---------------------------------------------------------------- views

def carray_info_lines(info, indent):
    """A carray's line of ``ctdsfs info`` (and its problems), for a carray or a ctable column."""
    cparams = info["cparams"] if isinstance(info["cparams"], dict) else {}
    return [f"{indent}dtype {info['dtype']}, shape {tuple(info['shape'])}, chunklen "
            f"{info['chunklen']}, {info['chunks']} chunks, {cparams.get('cname')} clevel "
            f"{cparams.get('clevel')} shuffle {cparams.get('shuffle')}"] + [
        f"{indent}problem: {p}" for p in info["problems"]]


def attrs_line(info):
    return f"  attrs            {json.dumps(info.get('attrs', {}))}"


class ChunkFile:
    """``chunks/N``: one chunk decompressed."""

    def __init__(self, source, number):
        self.source, self.number = source, number

    def size(self):
        return self.source.chunk_size(self.number)

    def read(self, offset, size):
        return self.source.chunk_data(self.number)[offset:offset + size]


class NpyFile:
    """A .npy header (``source.npy_header()``) followed by the bytes ``source.read_data``
    gives; ``write`` if the source takes writes. The header is made once per
    ``source.version`` (which every change of shape bumps), not on every read."""

    def __init__(self, source):
        self.source = source
        self._header = LazyBytes(source.npy_header, lambda: source.version)

    def size(self):
        return len(self._header.data()) + self.source.data_bytes()

    def held(self, offset, size):
        """Whether ``read(offset, size)`` needs nothing that is not in memory."""
        header = len(self._header.data())
        start = max(offset, header) - header
        end = min(offset + size - header, self.source.data_bytes())
        return start >= end or self.source.held(start, end)

    def read(self, offset, size):
        header = self._header.data()
        end = min(offset + size, len(header) + self.source.data_bytes())
        start = max(offset, len(header))
        if start >= end:
            return header[offset:end]
        data = self.source.read_data(start - len(header), end - len(header))
        return data if offset >= len(header) else header[offset:] + data

    def write(self, offset, data):
        header = self._header.data()
        skip = max(0, len(header) - offset)
        if data[:skip] != header[offset:offset + skip]:
            raise refuse(self.source.label, "the .npy header cannot be changed")
        if skip < len(data):
            self.source.write_data(offset + skip - len(header), data[skip:], len(header))
        return len(data)


def refuse(label, why):
    """NotPermitted (EPERM) for a change the format cannot take, logged once here."""
    log.warning("%s: refused: %s", label, why)
    return NotPermitted(f"{label}: {why}")


class View(DerivedView):
    """A translated directory whose entries (file objects with ``size``, ``read`` and
    maybe ``write``, and subdirectories) are added as it opens; with ``-o rw`` the
    items of its .npy files take writes, every other change is refused (EPERM)."""

    checks_reads = True  # reads decompress
    kernel_write_cache = False

    @property
    def kernel_keeps_pages(self):
        return not self.writable  # (an append changes the .npy header's shape)

    def __init__(self, label, writable=False):
        super().__init__(label)
        self.writable = writable
        self._writer_lock = None  # a descriptor of the rootdir, flocked while writable

    def _lock_rootdir(self, path):
        """A second writer (another read-write mount) gets a clear error, not a race."""
        if self.writable:
            self._writer_lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                                        | os.O_NOFOLLOW)
            try:
                lock_for_writing(self._writer_lock, path)
            except CtdsfsError:
                self.close()
                raise

    def _writer_note(self):
        """A problem line if another process holds this rootdir's writer lock (a read-write
        mount then shows it raw and read-only), for ``ctdsfs info``."""
        if self._writer_lock is not None:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return ["another writer holds this rootdir's lock (a read-write mount elsewhere): "
                    "a second read-write mount refuses it"]
        finally:
            os.close(fd)
        return []

    def _add(self, name, entry):
        why = name_problem(name) or ("a second entry of that name" if name in self._entries
                                     else None)
        if why:
            self.problems.append(f"{name!r} hidden: {why}")
            log.warning("%s: %r hidden: %s", self.label, name, why)
        else:
            self._entries[name] = entry

    def _writable_entry(self, key):
        if not self.writable:
            self._refuse_read_only()
        entry = self._entry(key)
        if not hasattr(entry, "write"):
            raise refuse(f"{self.label}/{key}", "this file is read-only (it is derived)")
        return entry

    def write(self, key, offset, data):
        with self._lock:
            return self._writable_entry(key).write(offset, bytes(data))

    def truncate(self, key, size):
        with self._lock:
            entry = self._writable_entry(key)
            if size != entry.size():
                raise refuse(f"{self.label}/{key}", "its size changes only by writing whole "
                                                    "items at its end")

    def create(self, name, *args):
        raise refuse(self.label, f"cannot add, remove or rename entries ({name!r})")

    make_nested = remove = rename = create

    def close(self):
        super().close()
        if self._writer_lock is not None:
            os.close(self._writer_lock)
            self._writer_lock = None


class ChunkDir(View):
    """``chunks/``: every chunk decompressed, named by its number."""

    format_name = "chunks"

    def __init__(self, source):
        super().__init__(f"{source.label}/chunks", source.writable)  # (writes: EPERM)
        self.source = source

    def names(self):
        return [str(number) for number in range(self.source.chunk_count())]

    def _entry(self, key):
        if not (isinstance(key, str) and key.isdigit() and key == str(int(key))
                and int(key) < self.source.chunk_count()):
            raise FileNotFoundError(key)
        return ChunkFile(self.source, int(key))



def replace_file(root, rel, data):
    """Replace ``root/rel`` by a file holding ``data``, crash-consistently: a new file
    (``.NAME.ctdsfs-new``, made with O_EXCL after unlinking a leftover, so a planted link
    is never written through), fsync, rename over the old one, fsync of the directory;
    no link is followed in any component."""
    folder, name = os.path.split(rel)
    temporary = f".{name}.ctdsfs-new"
    write_all_synced(create_exclusive_beneath(root, os.path.join(folder, temporary)), data)
    with parent_fd(root, rel) as (folder_fd, name):
        try:
            os.replace(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder_fd)
            raise
        os.fsync(folder_fd)


def is_dir(path):
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False

