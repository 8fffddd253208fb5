"""bcolz carray and ctable rootdirs, and bloscpack files, shown as NumPy files.

A carray rootdir (as bcolz writes it; FORMAT-NOTES) holds ``meta/storage``
(JSON: dtype, cparams, chunklen), ``meta/sizes`` (JSON: shape, nbytes, cbytes),
``__attrs__`` (JSON) and ``data/__N.blp``: a 16-byte ``blpk`` header (u8
version, 3 reserved bytes, i64 chunk count 1) and one Blosc chunk of items
``N * chunklen`` onwards. A ctable rootdir holds ``__rootdirs__`` (the column
order), ``__attrs__`` and one carray rootdir per column. A standalone
bloscpack file has a 32-byte header (version, options, checksum kind,
typesize, chunk size, last chunk size, chunk count, spare offsets), an
optional metadata section, optional chunk offsets, then Blosc chunks each
followed by its checksum.

Shown as directories:

* carray: ``array.npy`` (a .npy header, then the decompressed items; a read
  decompresses only the chunks it touches, kept in a bounded cache),
  ``attrs.json``, ``meta.json`` (sizes, storage and every chunk's headers),
  ``chunks/N`` (each chunk decompressed) and ``raw/`` (the rootdir's own files);
* ctable: ``COLUMN.npy`` per column, ``table.npy`` (the rows as one structured
  array), ``attrs.json``, and ``COLUMN/`` as a carray;
* bloscpack file: ``data``, ``header.json``, ``chunks/N``.

Everything read is untrusted: JSON files are small or refused, every needed
superchunk must exist before anything is shown (so no loop runs longer than
the files present), and a chunk's Blosc header must promise exactly the bytes
its place needs (never more than one chunk's worth, CHUNK_BYTES_MAX at most)
before python-blosc decompresses it (``blosc_chunk``); a bad chunk is EIO for
reads that touch it, with one log line naming its superchunk file and number.

With ``-o rw`` overwriting items of ``array.npy`` (or ``COLUMN.npy``)
recompresses each touched chunk with the array's own cparams and replaces
its superchunk file atomically (new file, fsync, rename, directory fsync);
writing whole items past the end of a carray appends them: the new chunks
first, ``meta/sizes`` last, so a crash leaves it never ahead of the data.
Everything else is refused (EPERM) with a log line.
"""

import bisect
import contextlib
import itertools
import json
import logging
import os
import re
import stat
import struct
import zlib
from collections import OrderedDict

import blosc
import numpy as np

from ..container import DerivedView, name_problem
from ..errors import BlockError, CtdsfsError, FormatError, NotPermitted
from .blosc_chunk import BLOSC_HEADER, CHECKSUMS, Chunk, file_identity
from .decoded_cache import DecodedCache
from .npy import npy_header
from .store import fsync_path, lock_for_writing, open_regular, read_small, write_synced

log = logging.getLogger(__name__)

MAGIC = b"blpk"
SUPERCHUNK_HEADER = struct.Struct("<4sB3xq")  # bcolz: magic, version, chunk count
BLOSCPACK_HEADER = struct.Struct("<4sBBBBiiqq")
METADATA_HEADER = struct.Struct("<8sBBBBIII8s")
META_CODECS = ("None", "zlib")
JSON_BYTES_MAX = 1 << 20  # meta/*, __attrs__, __rootdirs__, bloscpack metadata
CHUNK_BYTES_MAX = 256 << 20  # one decompressed chunk (what a read may allocate)
SUPERCHUNK_NAME = re.compile(r"__(0|[1-9][0-9]{0,17})\.blp\Z")


# ---------------------------------------------------------------- untrusted files

def _read_json(path):
    """The JSON object in ``path`` (small, a regular file)."""
    try:
        value = json.loads(read_small(path, JSON_BYTES_MAX).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FormatError(f"{path}: not a JSON object")
    return value


def _is_int(value, low=0):
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

def _carray_info_lines(info, indent):
    """A carray's line of ``ctdsfs info`` (and its problems), for a carray or a ctable column."""
    cparams = info["cparams"] if isinstance(info["cparams"], dict) else {}
    return [f"{indent}dtype {info['dtype']}, shape {tuple(info['shape'])}, chunklen "
            f"{info['chunklen']}, {info['chunks']} chunks, {cparams.get('cname')} clevel "
            f"{cparams.get('clevel')} shuffle {cparams.get('shuffle')}"] + [
        f"{indent}problem: {p}" for p in info["problems"]]


def _attrs_line(info):
    return f"  attrs            {json.dumps(info.get('attrs', {}))}"


class _Bytes:
    """A read-only file whose bytes ``make()`` makes on first use, and again once
    ``version()`` (what they derive from) has changed."""

    def __init__(self, make, version=lambda: 0):
        self._make, self._version = make, version
        self._made = (None, None)

    def data(self):
        version = self._version()
        if self._made[0] != version or self._made[1] is None:
            self._made = (version, self._make())
        return self._made[1]

    def size(self):
        return len(self.data())

    def read(self, offset, size):
        return self.data()[offset:offset + size]


def _json_file(make, version=lambda: 0):
    return _Bytes(lambda: (json.dumps(make(), indent=2) + "\n").encode(), version)


class _ChunkFile:
    """``chunks/N``: one chunk decompressed."""

    def __init__(self, source, number):
        self.source, self.number = source, number

    def size(self):
        return self.source.chunk_size(self.number)

    def read(self, offset, size):
        return self.source.chunk_data(self.number)[offset:offset + size]


class _NpyFile:
    """A .npy header (``source.npy_header()``) followed by the bytes ``source.read_data``
    gives; ``write`` if the source takes writes. The header is made once per
    ``source.version`` (which every change of shape bumps), not on every read."""

    def __init__(self, source):
        self.source = source
        self._header = _Bytes(source.npy_header, lambda: source.version)

    def size(self):
        return len(self._header.data()) + self.source.data_bytes()

    def read(self, offset, size):
        header = self._header.data()
        end = min(offset + size, len(header) + self.source.data_bytes())
        start = max(offset, len(header))
        if start >= end:
            return header[offset:end]
        return header[offset:end] + self.source.read_data(start - len(header),
                                                          end - len(header))

    def write(self, offset, data):
        header = self._header.data()
        skip = max(0, len(header) - offset)
        if data[:skip] != header[offset:offset + skip]:
            raise refuse(self.source.label, "the .npy header cannot be changed")
        if skip < len(data):
            self.source.write_data(offset + skip - len(header), data[skip:])
        return len(data)


def refuse(label, why):
    """NotPermitted (EPERM) for a change the format cannot take, logged once here."""
    log.warning("%s: refused: %s", label, why)
    return NotPermitted(f"{label}: {why}")


class _View(DerivedView):
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


class _ChunkDir(_View):
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
        return _ChunkFile(self.source, int(key))


class Carray(_View):
    """A carray rootdir: array.npy, attrs.json, meta.json, chunks/, raw/."""

    format_name = "bcolz carray"

    def __init__(self, path, *, writable=False, label=None, cache=None, column=False):
        super().__init__(label or path, writable)
        self.path = path
        self.cache = cache or DecodedCache()
        self.appendable = not column  # (a ctable's columns grow together: not one alone)
        self._partial = bytearray()  # appended bytes short of a whole item
        self._superchunk_prefix = self._real("data", "__")
        # counts reloads, appends and stored chunks (what derives from them follows it),
        # bumped after each change, so nothing made from a half-done change is kept
        self.version = 0
        self._load()
        from ..vfs.directory import DirectorySource  # (formats do not import the VFS at load)
        self._add("array.npy", _NpyFile(self))
        self._add("attrs.json", _json_file(lambda: self.attrs, lambda: self.version))
        self._add("meta.json", _json_file(self.meta, lambda: self.version))
        self._add("chunks", _ChunkDir(self))
        self._add("raw", DirectorySource(path, recurse=False))
        if not column:  # (a ctable locks its own rootdir)
            self._lock_rootdir(path)

    def _real(self, *parts):
        return os.path.join(self.path, *parts)

    def _load(self):
        where = self.label
        self.problems = []
        for folder in ("meta", "data"):
            if not _is_dir(self._real(folder)):
                raise FormatError(f"{where}: {folder} is not a directory")
        try:
            self._sizes_identity = file_identity(os.lstat(self._real("meta", "sizes")))
        except OSError as exc:
            raise FormatError(f"{where}: meta/sizes: {exc.strerror}") from None
        self.storage = _read_json(self._real("meta", "storage"))
        self.sizes = _read_json(self._real("meta", "sizes"))
        self.attrs = _read_json(self._real("__attrs__")) \
            if os.path.lexists(self._real("__attrs__")) else {}
        self.dtype = parse_dtype(self.storage.get("dtype"), f"{where}: meta/storage")
        shape, chunklen = self.sizes.get("shape"), self.storage.get("chunklen")
        if not isinstance(shape, list) or not shape or not all(map(_is_int, shape)):
            raise FormatError(f"{where}: meta/sizes: shape {shape!r} is not a list of counts")
        if not _is_int(chunklen, 1):
            raise FormatError(f"{where}: meta/storage: chunklen {chunklen!r} is not a count")
        self.shape, self.chunklen = tuple(shape), chunklen
        self.item_bytes = self.dtype.itemsize * int(np.prod(shape[1:], dtype=object))
        if not 0 < self.item_bytes * chunklen <= CHUNK_BYTES_MAX:
            raise FormatError(f"{where}: chunks of {chunklen} items of {self.item_bytes} "
                              f"bytes (ctdsfs reads chunks of 1 to {CHUNK_BYTES_MAX} bytes)")
        self.chunk_bytes = self.item_bytes * chunklen
        self.cparams = self._cparams()
        try:
            present = {int(m.group(1)) for m in map(SUPERCHUNK_NAME.match,
                                                      os.listdir(self._real("data"))) if m}
        except OSError as exc:
            raise FormatError(f"{where}: data: {exc.strerror}") from None
        needed = self.chunk_count()
        held = sum(1 for number in present if number < needed)  # (bounded by the files)
        if held < needed:
            raise FormatError(f"{where}: meta/sizes says {self.shape[0]} items in {needed} "
                              f"chunks, but {needed - held} of data/__0.blp .. "
                              f"__{needed - 1}.blp are missing")
        self.stale = len(present) - held  # superchunks past the end, as a trim leaves them
        if self.sizes.get("nbytes") != self.data_bytes():
            self.problems.append(f"meta/sizes: nbytes {self.sizes.get('nbytes')!r} is not "
                                 f"{self.data_bytes()} (shape x itemsize)")
        self._chunks = {}
        self.version += 1  # (last: what was made for the old version is made again)

    def _cparams(self):
        """What bcolz compresses with (checked: the values reach python-blosc on writes)."""
        cparams = self.storage.get("cparams")
        cparams = cparams if isinstance(cparams, dict) else {}
        clevel, shuffle, cname = (cparams.get(k) for k in ("clevel", "shuffle", "cname"))
        if not (_is_int(clevel) and clevel <= 9 and shuffle in (0, 1, 2)
                and cname in blosc.compressor_list()):
            self.problems.append(f"meta/storage: cparams {cparams!r} unusable; writes refused")
            return None
        return {"clevel": clevel, "shuffle": shuffle, "cname": cname}

    def chunk_count(self):
        return -(-self.shape[0] // self.chunklen)

    def npy_header(self):
        return npy_header(np.lib.format.dtype_to_descr(self.dtype), self.shape)

    def data_bytes(self):
        """The items' bytes, and appended bytes still short of a whole item."""
        return self.shape[0] * self.item_bytes + len(self._partial)

    def _superchunk(self, number):
        return f"{self._superchunk_prefix}{number}.blp"

    def _chunk(self, number, fd, identity):
        """The chunk of superchunk ``number`` (its 16-byte header checked), kept while the
        file is the same (``identity``: inode, mtime, size)."""
        known, chunk = self._chunks.get(number, (None, None))
        if known != identity:
            path = self._superchunk(number)
            head = os.pread(fd, SUPERCHUNK_HEADER.size, 0)
            room = identity[2] - SUPERCHUNK_HEADER.size
            if len(head) < SUPERCHUNK_HEADER.size:
                raise Chunk(path, number, 0, 0, (0, 0)).fail("truncated superchunk header")
            magic, version, count = SUPERCHUNK_HEADER.unpack(head)
            if magic != MAGIC or count != 1:
                raise Chunk(path, number, 0, 0, (0, 0)).fail(
                    f"not a bcolz superchunk (magic {magic!r}, {count} chunks)")
            held = min(self.chunklen, self.shape[0] - number * self.chunklen) * self.item_bytes
            last = number == self.chunk_count() - 1
            chunk = Chunk(path, number, SUPERCHUNK_HEADER.size, room,
                          (held, self.chunk_bytes if last else held))
            self._chunks[number] = (identity, chunk)
        return chunk

    def _with_chunk(self, number, use):
        """``use(chunk, fd, identity)`` with superchunk ``number`` open (links not followed)."""
        try:
            fd = open_regular(self._superchunk(number))
        except FormatError as exc:
            raise BlockError(str(exc), str(exc)) from None
        try:
            identity = file_identity(os.fstat(fd))
            return use(self._chunk(number, fd, identity), fd, identity)
        finally:
            os.close(fd)

    def chunk_size(self, number):
        """Bytes of ``chunks/N`` (what its place needs, if its header is bad)."""
        try:
            return self._with_chunk(number, lambda c, fd, _: c.read_header(fd)["nbytes"])
        except BlockError:
            return min(self.chunklen, self.shape[0] - number * self.chunklen) * self.item_bytes

    def chunk_data(self, number):
        """Chunk ``number`` decompressed, from the cache while its file is unchanged: one
        lstat tells that (a link or anything not a regular file goes the opening way)."""
        key = (self.path, number)
        try:
            st = os.lstat(self._superchunk(number))
        except OSError:
            st = None
        data = self.cache.get(key, file_identity(st)) \
            if st is not None and stat.S_ISREG(st.st_mode) else None
        if data is None:
            data = self._with_chunk(number, lambda chunk, fd, identity: self.cache.get_or_load(
                key, identity, lambda: chunk.decompress(fd)))
        return data

    def read_data(self, start, end):
        """Bytes ``start`` .. ``end`` of the items, decompressing only the chunks they touch
        (then appended bytes still short of an item)."""
        stored = self.shape[0] * self.item_bytes
        parts = []
        at = start
        while at < min(end, stored):
            number, within = divmod(at, self.chunk_bytes)
            take = min(min(end, stored) - at, self.chunk_bytes - within)
            parts.append(self.chunk_data(number)[within:within + take])
            at += take
        if end > stored:
            parts.append(bytes(self._partial[max(start, stored) - stored:end - stored]))
        return b"".join(parts)

    # -- writing

    def write_data(self, start, data):
        """Overwrite items, or append them: bytes written at the end wait for whole items."""
        if self.cparams is None:
            raise refuse(self.label, "meta/storage has no usable cparams to compress with")
        stored = self.shape[0] * self.item_bytes
        end, at = start + len(data), max(start, stored)
        if end > stored and not self.appendable:
            raise refuse(self.label, "a ctable's columns grow together (append with bcolz)")
        if end > stored and at != stored + len(self._partial):
            raise refuse(self.label, f"appends continue at the end ({stored} bytes, "
                                     f"{len(self._partial)} pending), not at {at}")
        if start < stored:
            self._overwrite(start, data[:min(end, stored) - start])
        if end > stored:
            self._partial += data[at - start:]
            whole = len(self._partial) // self.item_bytes * self.item_bytes
            if whole:
                self._append(bytes(self._partial[:whole]))
                del self._partial[:whole]

    def _overwrite(self, start, data):
        """Each touched chunk recompressed and its superchunk replaced."""
        done = 0
        while done < len(data):
            number, within = divmod(start + done, self.chunk_bytes)
            old = self.chunk_data(number)
            take = min(len(data) - done, len(old) - within)
            if data[done:done + take] != old[within:within + take]:
                self._store_chunk(number, old[:within] + data[done:done + take]
                                  + old[within + take:])
            done += take

    def _append(self, items):
        """New items: every chunk they touch first (the last partial one rewritten), then
        meta/sizes, so a crash never leaves meta/sizes ahead of the data."""
        length = self.shape[0]
        first = length // self.chunklen
        kept = self.chunk_data(first)[:(length - first * self.chunklen) * self.item_bytes] \
            if length % self.chunklen else b""
        joined = kept + items
        for index in range(0, len(joined), self.chunk_bytes):
            self._store_chunk(first + index // self.chunk_bytes,
                              joined[index:index + self.chunk_bytes])
        count = length + len(items) // self.item_bytes
        sizes = dict(self.sizes, shape=[count, *self.shape[1:]],
                     nbytes=count * self.item_bytes)
        _replace_file(self._real("meta", "sizes"), json.dumps(sizes).encode())
        self.sizes, self.shape = sizes, (count, *self.shape[1:])
        self._sizes_identity = file_identity(os.lstat(self._real("meta", "sizes")))
        self.version += 1

    def _typesize(self):
        """The Blosc typesize bcolz gave the chunks (the first chunk's), else the dtype's."""
        try:
            return self._with_chunk(0, lambda c, fd, _: c.read_header(fd)["typesize"])
        except BlockError:
            return min(self.dtype.itemsize, blosc.MAX_TYPESIZE)

    def _store_chunk(self, number, raw):
        packed = blosc.compress(raw, typesize=self._typesize(), **self.cparams)
        path = self._superchunk(number)
        _replace_file(path, SUPERCHUNK_HEADER.pack(MAGIC, 1, 1) + packed)
        self.cache.put((self.path, number), file_identity(os.lstat(path)), raw)
        self.version += 1

    def reload_if_changed(self):
        """Re-read meta/ if another process (bcolz) changed meta/sizes; True if it did.
        If it cannot be read now (bcolz mid-write), the view stays as it was."""
        with self._lock:
            try:
                now = file_identity(os.lstat(self._real("meta", "sizes")))
                same = now == self._sizes_identity
            except OSError:
                same = True  # (gone for a moment: bcolz replaces it)
            if same or self._partial:
                return False
            before = dict(self.__dict__)
            try:
                self._load()
            except FormatError:
                # (a new version: a read may have made something of the half-loaded state)
                self.__dict__.update(before, version=self.version + 1)
                raise
            return True

    @property
    def dirty(self):
        return bool(self._partial)

    def commit(self):
        """Bytes of an incomplete item are dropped (and said so): bcolz stores whole items."""
        if self._partial:
            count, self._partial = len(self._partial), bytearray()
            raise refuse(self.label, f"{count} appended bytes do not make a whole item "
                                     f"of {self.item_bytes} bytes: dropped")
        return False

    def chunk_headers(self):
        """Each chunk's Blosc header (or what is wrong with it), for meta.json and info."""
        out = []
        for number in range(self.chunk_count()):
            try:
                header = self._with_chunk(number, lambda c, fd, _: dict(c.read_header(fd)))
            except BlockError as exc:
                header = {"problem": str(exc)}
            out.append({"superchunk": f"data/__{number}.blp", **header})
        return out

    def meta(self):
        return {"sizes": self.sizes, "storage": self.storage,
                "superchunk_header": {"magic": "blpk", "bytes": SUPERCHUNK_HEADER.size,
                                      "chunks": 1},
                "chunks": self.chunk_headers()}

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        return [f"{info['container']}: {info['format']}", *_carray_info_lines(info, "  "),
                _attrs_line(info)]

    def describe(self):
        return {"container": self.label, "format": "bcolz carray",
                "dtype": str(self.dtype), "shape": list(self.shape),
                "chunklen": self.chunklen, "chunks": self.chunk_count(),
                "cparams": self.storage.get("cparams"), "attrs": self.attrs,
                "problems": list(self.problems)}

    def check(self, bar=None):
        """Every chunk decompresses to the bytes its place needs."""
        problems = [f"{self.label}: {p}" for p in self.problems]
        for number in range(self.chunk_count()):
            try:
                data = self._with_chunk(number, lambda c, fd, _: c.decompress(fd))
            except BlockError as exc:
                problems.append(str(exc))
                continue
            if bar is not None:
                bar.update(len(data))
        stale = f", {self.stale} superchunks past the end (left by a trim)" if self.stale else ""
        return problems, [f"{self.label}: {self.chunk_count()} chunks, "
                          f"{self.shape[0]} items of {self.dtype}{stale}"]


class Ctable(_View):
    """A ctable rootdir: COLUMN.npy per column, table.npy, attrs.json, COLUMN/ (a carray)."""

    format_name = "bcolz ctable"

    def __init__(self, path, *, writable=False):
        super().__init__(path, writable)
        self.path = path
        self.cache = DecodedCache()
        names = _read_json(os.path.join(path, "__rootdirs__")).get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise FormatError(f"{path}: __rootdirs__: names is not a list of strings")
        attrs = os.path.join(path, "__attrs__")
        self.attrs = _read_json(attrs) if os.path.lexists(attrs) else {}
        self.columns = OrderedDict()
        for name in names:
            why = name_problem(name) or ("listed twice" if name in self.columns else None)
            if why is None and not _is_dir(os.path.join(path, name)):
                why = "no such column directory"
            if why is None:
                try:
                    self.columns[name] = Carray(os.path.join(path, name), writable=writable,
                                                label=f"{path}/{name}", cache=self.cache,
                                                column=True)
                except FormatError as exc:
                    why = str(exc)
            if why:
                self.problems.append(f"column {name!r} hidden: {why}")
                log.warning("%s: column %r hidden: %s", path, name, why)
        for name, column in self.columns.items():
            self._add(f"{name}.npy", column._entries["array.npy"])
        lengths = {c.shape[0] for c in self.columns.values()}
        try:
            self.row_dtype = np.dtype([(n, c.dtype, c.shape[1:])
                                       for n, c in self.columns.items()])
        except (TypeError, ValueError) as exc:  # (names NumPy does not take as fields)
            lengths = {f"no record type ({exc})"}
        if len(lengths) == 1 and self.columns:
            self._add("table.npy", _NpyFile(self))
        elif lengths:
            self.problems.append(f"no table.npy: the columns have different lengths "
                                 f"{sorted(map(str, lengths))}")
        self._add("attrs.json", _json_file(lambda: self.attrs))
        for name, column in self.columns.items():
            self._add(name, column)
        self._lock_rootdir(path)

    @property
    def version(self):
        """Changes whenever a column's does (table.npy's header follows it)."""
        return tuple(c.version for c in self.columns.values())

    def rows(self):
        """The rows every column holds (bcolz may have grown the columns since opening)."""
        return min(c.shape[0] for c in self.columns.values())

    def npy_header(self):
        return npy_header(np.lib.format.dtype_to_descr(self.row_dtype), (self.rows(),))

    def data_bytes(self):
        return self.rows() * self.row_dtype.itemsize

    def reload_if_changed(self):
        """Each column re-reads its meta/ if bcolz changed it; True if any did."""
        with self._lock:
            return any([c.reload_if_changed() for c in self.columns.values()])

    def read_data(self, start, end):
        """Rows touched, gathered column by column into one structured array."""
        row_bytes = self.row_dtype.itemsize
        first, last = start // row_bytes, -(-end // row_bytes)
        rows = np.zeros(last - first, self.row_dtype)
        for name, column in self.columns.items():
            raw = column.read_data(first * column.item_bytes, last * column.item_bytes)
            rows[name] = np.frombuffer(raw, column.dtype).reshape((last - first,)
                                                                   + column.shape[1:])
        skip = start - first * row_bytes
        return rows.tobytes()[skip:skip + end - start]

    def write_data(self, start, data):
        raise refuse(f"{self.label}/table.npy", "write a column's COLUMN.npy instead")

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        lines = [f"{info['container']}: {info['format']}",
                 f"  columns          {len(info['columns'])}"]
        for column in info["columns"]:
            lines.append(f"    {os.path.basename(column['container'])}")
            lines += _carray_info_lines(column, "      ")
        lines += [f"  problem: {p}" for p in info["problems"]]
        return lines + [_attrs_line(info)]

    def describe(self):
        return {"container": self.label, "format": "bcolz ctable", "attrs": self.attrs,
                "columns": [c.describe() for c in self.columns.values()],
                "problems": list(self.problems)}

    def check(self, bar=None):
        problems = [f"{self.label}: {p}" for p in self.problems]
        notes = []
        for column in self.columns.values():
            more, info = column.check(bar)
            problems += more
            notes += info
        return problems, notes


class BloscpackFile(_View):
    """A standalone .blp file: data, header.json, chunks/N (read-only)."""

    format_name = "bloscpack"
    version = 0  # (the file is open, never reloaded)

    def __init__(self, path):
        super().__init__(path)
        self.path = path
        self.cache = DecodedCache()
        self.fd = open_regular(path)
        try:
            self._load()
        except BaseException:
            os.close(self.fd)
            raise
        # where each chunk's bytes start in ``data`` (and where the last one ends)
        self._starts = [0, *itertools.accumulate(c.nbytes_range[1] for c in self._chunks)]
        self._add("data", _NpyFile(self))
        self._add("header.json", _json_file(self.header_json))
        self._add("chunks", _ChunkDir(self))

    def _load(self):
        size = self.file_size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, BLOSCPACK_HEADER.size, 0)
        if len(head) < SUPERCHUNK_HEADER.size or not head.startswith(MAGIC):
            raise FormatError(f"{self.path}: not a bloscpack file (no blpk header)")
        _, version, count = SUPERCHUNK_HEADER.unpack(head[:SUPERCHUNK_HEADER.size])
        self.metadata = None
        if version == 1 and count == 1:  # one bcolz superchunk: its Blosc header says the size
            self.header = {"format": "bcolz superchunk", "format_version": 1, "nchunks": 1}
            chunk = Chunk(self.path, 0, SUPERCHUNK_HEADER.size, size - SUPERCHUNK_HEADER.size,
                          (0, CHUNK_BYTES_MAX))
            self._chunks = [chunk]
            chunk.nbytes_range = (self._header(0)["nbytes"],) * 2
            return
        if len(head) < BLOSCPACK_HEADER.size:
            raise FormatError(f"{self.path}: truncated bloscpack header")
        (_, version, options, checksum, typesize, chunk_size, last_chunk, nchunks,
         spare) = BLOSCPACK_HEADER.unpack(head)
        self.header = {"format": "bloscpack", "format_version": version,
                       "offsets": bool(options & 1), "metadata": bool(options & 2),
                       "checksum": CHECKSUMS[checksum][0] if checksum < len(CHECKSUMS)
                       else checksum, "typesize": typesize, "chunk_size": chunk_size,
                       "last_chunk": last_chunk, "nchunks": nchunks, "max_app_chunks": spare}
        why = None
        if version != 3:
            why = f"format version {version} (ctdsfs reads version 3)"
        elif options & ~3 or checksum >= len(CHECKSUMS):
            why = f"unknown options 0x{options:02x} or checksum kind {checksum}"
        elif nchunks < 0 or spare < 0 or nchunks * BLOSC_HEADER.size + (
                8 * (nchunks + spare) if options & 1 else 0) > size:
            why = f"{nchunks} chunks (offsets for {spare} more) cannot fit in {size} bytes"
        elif nchunks and not (0 < chunk_size <= CHUNK_BYTES_MAX
                              and 0 < last_chunk <= chunk_size):
            why = f"chunk size {chunk_size}, last chunk {last_chunk} (at most " \
                  f"{CHUNK_BYTES_MAX} bytes each)"
        if why:
            raise FormatError(f"{self.path}: {why}")
        position = BLOSCPACK_HEADER.size
        if options & 2:
            position = self._load_metadata(position)
        digest_size = CHECKSUMS[checksum][1]
        offsets = None
        if options & 1:
            table = os.pread(self.fd, 8 * (nchunks + spare), position)
            if len(table) != 8 * (nchunks + spare):
                raise FormatError(f"{self.path}: chunk offsets truncated")
            offsets = struct.unpack(f"<{nchunks}q", table[:8 * nchunks])
            position += len(table)
        self.header["chunk_offsets"] = list(offsets) if offsets else None
        self._chunks = []
        for number in range(nchunks):
            place = offsets[number] if offsets else position
            if not position <= place <= size:
                raise FormatError(f"{self.path}: chunk {number} offset {place} is outside "
                                  f"{position} .. {size}")
            want = last_chunk if number == nchunks - 1 else chunk_size
            chunk = Chunk(self.path, number, place, size - place - digest_size,
                          (want, want), checksum)
            self._chunks.append(chunk)
            if offsets is None:  # chunks follow one another: their headers say where
                position = place + self._header(number)["cbytes"] + digest_size
            else:
                position = place + BLOSC_HEADER.size

    def _load_metadata(self, position):
        raw = os.pread(self.fd, METADATA_HEADER.size, position)
        if len(raw) != METADATA_HEADER.size:
            raise FormatError(f"{self.path}: metadata header truncated")
        (fmt, options, checksum, codec, level, meta_size, max_meta_size, comp_size,
         user_codec) = METADATA_HEADER.unpack(raw)
        if checksum >= len(CHECKSUMS) or codec >= len(META_CODECS) or options \
                or comp_size > max_meta_size:
            raise FormatError(f"{self.path}: metadata header is not valid")
        digest_size = CHECKSUMS[checksum][1]
        stored = os.pread(self.fd, min(comp_size, JSON_BYTES_MAX), position + 32)
        end = position + 32 + max_meta_size + digest_size
        if end > self.file_size:
            raise FormatError(f"{self.path}: metadata section runs past the end of the file")
        self.metadata = {"magic_format": fmt.rstrip(b"\0").decode("latin-1"),
                         "checksum": CHECKSUMS[checksum][0], "codec": META_CODECS[codec],
                         "level": level, "meta_size": meta_size,
                         "max_meta_size": max_meta_size, "meta_comp_size": comp_size,
                         "user_codec": user_codec.rstrip(b"\0").decode("latin-1")}
        problem = None
        if comp_size > JSON_BYTES_MAX or meta_size > JSON_BYTES_MAX:
            problem = f"over {JSON_BYTES_MAX} bytes: not read"
        elif digest_size and CHECKSUMS[checksum][2](stored) != os.pread(
                self.fd, digest_size, position + 32 + max_meta_size):
            problem = f"{CHECKSUMS[checksum][0]} checksum mismatch"
        else:
            try:
                text = zlib.decompressobj().decompress(stored, max(1, meta_size)) \
                    if codec else stored  # (max_length 0 would mean no limit)
                self.metadata["value"] = json.loads(text.decode("utf-8"))
            except (zlib.error, ValueError, RecursionError) as exc:
                problem = f"does not decode: {exc}"
        if problem:
            self.metadata["problem"] = problem
            self.problems.append(f"metadata {problem}")
        return end

    def _header(self, number):
        try:
            return self._chunks[number].read_header(self.fd)
        except BlockError as exc:
            raise FormatError(str(exc)) from None

    def chunk_count(self):
        return len(self._chunks)

    def npy_header(self):
        return b""  # (``data`` is the bytes alone)

    def chunk_size(self, number):
        return self._chunks[number].nbytes_range[1]

    def chunk_data(self, number):
        return self.cache.get_or_load(number, None,  # (the file is open, never replaced)
                                      lambda: self._chunks[number].decompress(self.fd))

    def data_bytes(self):
        return self._starts[-1]

    def read_data(self, start, end):
        """The chunks that hold ``start`` .. ``end``, found by bisection, not a walk."""
        parts = []
        number = bisect.bisect_right(self._starts, start) - 1
        while start < end and number < len(self._chunks):
            first = self._starts[number]
            parts.append(self.chunk_data(number)[start - first:end - first])
            start, number = self._starts[number + 1], number + 1
        return b"".join(parts)

    def header_json(self):
        chunks = []
        for chunk in self._chunks:
            try:
                chunks.append({"offset": chunk.offset, **chunk.read_header(self.fd)})
            except BlockError as exc:
                chunks.append({"offset": chunk.offset, "problem": str(exc)})
        return {"header": self.header, "metadata": self.metadata, "file_size": self.file_size,
                "chunks": chunks}

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        header = info["header"]
        lines = [f"{info['container']}: {info['format']}",
                 "  header           " + ", ".join(
                     f"{k} {v}" for k, v in header.items() if k != "chunk_offsets"),
                 f"  file size        {info['file_size']}"]
        lines += [f"    chunk {i}  " + (c.get("problem") or
                                        f"{c['nbytes']} bytes from {c['cbytes']} at "
                                        f"{c['offset']}, {c['compressor']}, shuffle "
                                        f"{c['shuffle']}")
                  for i, c in enumerate(info["chunks"])]
        lines += [f"  problem: {p}" for p in info["problems"]]
        if "attrs" in info:
            return lines + [_attrs_line(info)]
        return lines + ["  metadata         " + json.dumps(info["metadata"])]

    def describe(self):
        return {"container": self.label, "format": "bloscpack", **self.header_json(),
                "problems": list(self.problems)}

    def check(self, bar=None):
        problems = [f"{self.label}: {p}" for p in self.problems]
        for chunk in self._chunks:
            try:
                data = chunk.decompress(self.fd)
            except BlockError as exc:
                problems.append(str(exc))
                continue
            if bar is not None:
                bar.update(len(data))
        return problems, [f"{self.label}: {len(self._chunks)} chunks"]

    def close(self):
        super().close()
        os.close(self.fd)


def _replace_file(path, data):
    """Replace ``path`` by a file holding ``data``, crash-consistently: a new file, fsync,
    rename over the old one, fsync of the directory."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.ctdsfs-new")
    try:
        write_synced(temporary, data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # (the new file may never have been made)
            os.unlink(temporary)
        raise
    fsync_path(folder)


def _is_dir(path):
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def looks_like_directory(path):
    """A carray (meta/ and data/) or a ctable (__rootdirs__) rootdir."""
    if os.path.lexists(os.path.join(path, "__rootdirs__")):
        return True
    return _is_dir(os.path.join(path, "meta")) and _is_dir(os.path.join(path, "data"))


def open_file(path, *, verify_crc=True, writable=False):
    """A carray or ctable rootdir, or a bloscpack file (always read-only)."""
    path = os.fspath(path)
    if not _is_dir(path):
        return BloscpackFile(path)
    if os.path.lexists(os.path.join(path, "__rootdirs__")):
        return Ctable(path, writable=writable)
    return Carray(path, writable=writable)
