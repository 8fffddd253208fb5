"""A bcolz carray rootdir: ``array.npy`` (items decoded chunk by chunk), ``attrs.json``,
``meta.json``, ``chunks/N`` and ``raw/``; with ``-o rw`` item overwrites and appends
(each touched chunk recompressed, its superchunk replaced atomically, meta/sizes last)."""

import contextlib
import json
import mmap
import os
import stat

import blosc
import numpy as np

from ...errors import BlockError, CtdsfsError, FormatError
from ...io.beneath import kind_beneath, listdir_beneath, lstat_beneath, open_regular_beneath
from ...io.blosc_chunk import BLOSC_HEADER, Chunk, file_identity
from ...io.buffers import spare_buffer
from ...io.decoded_cache import DecodedCache, shared_pool
from ...io.directory import PlainDirectory
from ...io.lazy_files import json_file
from ...io.npy import npy_header
from ...io.read_streams import ReadStreams
from ...io.store import DIRECT_ALIGN, preadv_all, read_direct
from .view import (
    CHUNK_BYTES_MAX,
    MAGIC,
    SUPERCHUNK_HEADER,
    SUPERCHUNK_NAME,
    ChunkDir,
    NpyFile,
    View,
    attrs_line,
    carray_info_lines,
    is_int,
    parse_dtype,
    read_attrs,
    read_json,
    readahead_for_chunks,
    refuse,
    replace_file,
)
from .windows import ChunkWindows

CHUNKS_AHEAD = 8  # chunks decoded ahead of a sequential reader (3 left the disk idle)
PENDING_BYTES_MAX = 16 << 20  # appended bytes held back until they end on an item boundary
PAGE_BYTES = mmap.PAGESIZE
KERNEL_PIECE_MAX = 256 * PAGE_BYTES  # libfuse 3's max_write: the longest piece of a write


def read_superchunk(fd, buffer, want, ahead):
    """The first ``want`` bytes of superchunk ``fd`` (or fewer, where it ends) into
    ``buffer`` (page-aligned, ``want`` rounded up to DIRECT_ALIGN): their count, and
    perhaps a few more. Read ahead of a
    sequential reader, past the page cache (O_DIRECT, where the file system takes it):
    the disk fills the buffer, no page-cache pages are made and filled and no copy is
    made, CPU that the decoding threads, on which the reader waits, are short of (a
    300 MiB whole read 0.26 against 0.31 s, medians of 11 alternated reads). Read for
    a reader waiting now, as bcolz reads it, the headers first and then the rest: on
    this VM's virtio disk a cold superchunk took 0.36-0.40 ms that way, in three disk
    requests the kernel's readahead issues side by side, against 0.55-0.69 ms by one
    request, as one call or a direct read makes."""
    if ahead:
        done = read_direct(fd, buffer)
        if done is not None:
            return done
    head = min(want, SUPERCHUNK_HEADER.size + BLOSC_HEADER.size)
    done = preadv_all(fd, buffer[:head], 0)
    if done == head:
        done += preadv_all(fd, buffer[head:want], head)
    return done


def _maybe_continued(on_page_end, length):
    """Whether the kernel may send more of the same user write after a piece of ``length``
    bytes. Without its writeback cache it copies a write into page-cache folios and sends
    a piece when the write ends, when max_write bytes are gathered, or at a folio's end
    (so on a page boundary of the file offset); the next piece continues where it ended."""
    return on_page_end or length >= KERNEL_PIECE_MAX


class Carray(View):
    """A carray rootdir: array.npy, attrs.json, meta.json, chunks/, raw/."""

    format_name = "bcolz carray"

    def __init__(self, path, *, writable=False, label=None, cache=None, column=None):
        """``column``: its name inside the ctable rootdir ``path`` (the folder every file is
        reached from without following a link), or None for a carray rootdir ``path``."""
        super().__init__(label or path, writable)
        self.root, self.prefix = path, column or ""
        self.path = os.path.join(path, self.prefix) if column else path
        self.cache = cache or DecodedCache(name="bcolz chunks")
        self.appendable = column is None  # (a ctable's columns grow together: not one alone)
        self._partial = bytearray()  # appended bytes not yet ending on an item boundary
        # where the last piece of a write the kernel may continue ended (else None), and
        # the bytes of that write so far
        self._run_end, self._run_bytes = None, 0
        # counts reloads, appends and stored chunks (what derives from them follows it),
        # bumped after each change, so nothing made from a half-done change is kept
        self.version = 0
        self._streams = ReadStreams()  # where its sequential readers are
        self._load()
        self._add("array.npy", NpyFile(self))
        self._add("attrs.json", json_file(lambda: self.attrs, lambda: self.version))
        self._add("meta.json", json_file(self.meta, lambda: self.version))
        self._add("chunks", ChunkDir(self))
        self._add("raw", PlainDirectory(self.path))
        if column is None:  # (a ctable locks its own rootdir)
            self._lock_rootdir(path)

    def _rel(self, *parts):
        """A path inside the rootdir, for the ``beneath`` functions (no link followed)."""
        return os.path.join(self.prefix, *parts)

    def _load(self):
        where = self.label
        self.problems = []
        for folder in ("meta", "data"):
            if not kind_beneath(self.root, self._rel(folder), stat.S_ISDIR):
                raise FormatError(f"{where}: {folder} is not a directory")
        try:
            self._sizes_identity = file_identity(lstat_beneath(self.root,
                                                               self._rel("meta", "sizes")))
        except OSError as exc:
            raise FormatError(f"{where}: meta/sizes: {exc.strerror}") from None
        self.storage = read_json(self.root, self._rel("meta", "storage"))
        self.sizes = read_json(self.root, self._rel("meta", "sizes"))
        self.attrs = read_attrs(self.root, self._rel("__attrs__"))
        self.dtype = parse_dtype(self.storage.get("dtype"), f"{where}: meta/storage")
        shape, chunklen = self.sizes.get("shape"), self.storage.get("chunklen")
        if not isinstance(shape, list) or not shape or not all(map(is_int, shape)):
            raise FormatError(f"{where}: meta/sizes: shape {shape!r} is not a list of counts")
        if not is_int(chunklen, 1):
            raise FormatError(f"{where}: meta/storage: chunklen {chunklen!r} is not a count")
        self.shape, self.chunklen = tuple(shape), chunklen
        self.item_bytes = self.dtype.itemsize * int(np.prod(shape[1:], dtype=object))
        if not 0 < self.item_bytes * chunklen <= CHUNK_BYTES_MAX:
            raise FormatError(f"{where}: chunks of {chunklen} items of {self.item_bytes} "
                              f"bytes (ctdsfs reads chunks of 1 to {CHUNK_BYTES_MAX} bytes)")
        self.chunk_bytes = self.item_bytes * chunklen
        self.windows = ChunkWindows(self.chunk_bytes)
        self.cparams = self._cparams()
        try:
            present = {int(m.group(1)) for m in map(SUPERCHUNK_NAME.match,
                                                      listdir_beneath(self.root,
                                                                      self._rel("data"))) if m}
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
        if not (is_int(clevel) and clevel <= 9 and shuffle in (0, 1, 2)
                and cname in blosc.compressor_list()):
            self.problems.append(f"meta/storage: cparams {cparams!r} unusable; writes refused")
            return None
        return {"clevel": clevel, "shuffle": shuffle, "cname": cname}

    @property
    def readahead_kb(self):
        return readahead_for_chunks(self.chunk_bytes)

    def chunk_count(self):
        return -(-self.shape[0] // self.chunklen)

    def npy_header(self):
        return npy_header(np.lib.format.dtype_to_descr(self.dtype), self.shape)

    def data_bytes(self):
        """The items' bytes, and appended bytes still short of a whole item."""
        return self.shape[0] * self.item_bytes + len(self._partial)

    def _superchunk(self, number):
        """Superchunk ``number``'s path inside the rootdir."""
        return self._rel("data", f"__{number}.blp")

    def _chunk(self, number, fd, identity, head=None):
        """The chunk of superchunk ``number`` (its 16-byte header checked: ``head``, else
        read), kept while the file is the same (``identity``: inode, mtime, size)."""
        known, chunk = self._chunks.get(number, (None, None))
        if known != identity:
            path = os.path.join(self.root, self._superchunk(number))
            if head is None:
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

    def _with_chunk(self, number, use, parse=True):
        """``use(chunk, fd, identity)`` with superchunk ``number`` open (links not followed);
        without ``parse``, chunk is None (nothing read yet)."""
        try:
            fd = open_regular_beneath(self.root, self._superchunk(number),
                                      os.path.join(self.root, self._superchunk(number)))
        except FormatError as exc:
            raise BlockError(str(exc), str(exc)) from None
        try:
            identity = file_identity(os.fstat(fd))
            return use(self._chunk(number, fd, identity) if parse else None, fd, identity)
        finally:
            os.close(fd)

    def chunk_size(self, number):
        """Bytes of ``chunks/N`` (what its place needs, if its header is bad)."""
        try:
            return self._with_chunk(number, lambda c, fd, _: c.read_header(fd)["nbytes"])
        except BlockError:
            return min(self.chunklen, self.shape[0] - number * self.chunklen) * self.item_bytes

    def chunk_data(self, number):
        """Chunk ``number`` decompressed (the next ones decoded ahead of a reader in order)."""
        self._read_ahead(number, number)
        return self._chunk_data(number)

    def _chunk_data(self, number):
        """Chunk ``number`` decompressed, from the cache while its file is unchanged: one
        lstat tells that (a link or anything not a regular file goes the opening way)."""
        data = self._cached_chunk(number)
        if data is None:
            data = self._with_chunk(number, lambda _, fd, identity: self._cached_or_decoded(
                number, fd, identity), parse=False)
        return data

    def _cached_or_decoded(self, number, fd, identity, ahead=False):
        return self.cache.get_or_load((self.path, number), identity,
                                      lambda: self._decode(number, fd, identity, ahead), ahead)

    def _decode(self, number, fd, identity, ahead):
        """Chunk ``number`` as a read-only view of its place in ``windows``: its file read
        (``read_superchunk``) into a reused buffer (a fresh one costs a page fault every
        4 KiB), up to what a chunk may take. A chunk decoded ahead of a sequential reader
        starts a new window where needed."""
        want = min(identity[2], SUPERCHUNK_HEADER.size + BLOSC_HEADER.size + self.chunk_bytes)
        windows = self.windows
        aligned = -(-want // DIRECT_ALIGN) * DIRECT_ALIGN
        with spare_buffer(aligned) as spare:
            raw = memoryview(spare)[:aligned]
            raw = raw[:min(want, read_superchunk(fd, raw, want, ahead))]
            chunk = self._chunk(number, fd, identity, bytes(raw[:SUPERCHUNK_HEADER.size]))
            buffer, keep = windows.place(number, ahead)
            view = memoryview(buffer[:chunk.decode_into(raw[chunk.offset:], buffer)])
        view = view.toreadonly()
        keep(view)
        return view

    def held(self, start, end):
        """Whether items' bytes ``start`` .. ``end`` are all in decoded chunks in memory
        (then the mount answers the read at once, without a thread's hop)."""
        if end > self.shape[0] * self.item_bytes:
            return False
        return all(map(self._held_chunk, range(start // self.chunk_bytes,
                                               (end - 1) // self.chunk_bytes + 1)))

    def _held_chunk(self, number):
        """Whether chunk ``number`` is decoded in memory (here or in the workers' arena) for
        its file as last seen (no system call: a read checks the file again)."""
        identity = self._chunks.get(number, (None, None))[0]
        return identity is not None and self.cache.has((self.path, number), identity)

    def cached(self, key, offset, size):
        entry = self._entries.get(key) if key == "array.npy" else None
        return isinstance(entry, NpyFile) and entry.held(offset, size)

    def _cached_chunk(self, number):
        """Chunk ``number`` from the cache if its file is unchanged, else None. One lstat of
        the whole path tells that (a kernel read of 512 KiB asks for one or two chunks, and
        walking the folders without links took 5 system calls a chunk): it may follow a
        link in a folder, but only to serve bytes decoded from the very file (device and
        inode) that was opened the safe way, so no byte from outside the rootdir."""
        identity = self._file_identity_now(number)
        return None if identity is None else self.cache.get((self.path, number), identity)

    def _file_identity_now(self, number):
        """The identity of chunk ``number``'s file as it is now (one lstat), or None."""
        try:
            st = os.lstat(os.path.join(self.root, self._superchunk(number)))
        except OSError:
            return None
        return file_identity(st) if stat.S_ISREG(st.st_mode) else None

    def _read_ahead(self, first, number):
        """A reader going through the chunks in order (a read from chunk ``first`` to
        ``number`` that starts in, or next to, the last chunk of one of the latest readers'
        reads) has its next CHUNKS_AHEAD decoded in other threads meanwhile (pread and
        Blosc release the GIL), as many as the cache holds beside the ones in use. A read
        across two chunks at a new place (as a mapped reader's page fault asks) is no
        such reader."""
        start = self._streams.follow(first, number)
        if start is None:
            return
        room = max(0, self.cache.limit // self.chunk_bytes - 2) // self._streams.followed()
        last = min(number + min(CHUNKS_AHEAD, room), self.chunk_count() - 1)
        for ahead in range(start, last + 1):
            shared_pool("bcolz-ahead", CHUNKS_AHEAD).submit(self._decode_quietly, ahead, True)
        self._streams.asked(number, last)

    def _decode_quietly(self, number, ahead=False):
        """Chunk ``number`` into the cache; a problem is for the reader who wants it."""
        with contextlib.suppress(CtdsfsError, OSError):
            identity = self._file_identity_now(number)
            if identity is None or not self.cache.has((self.path, number), identity):
                self._with_chunk(number, lambda _, fd, identity: self._cached_or_decoded(
                    number, fd, identity, ahead), parse=False)

    def read_data(self, start, end):
        """Bytes ``start`` .. ``end`` of the items, decompressing only the chunks they touch
        (then appended bytes still short of an item); a read within one chunk, or across
        chunks decoded side by side, is a view of the decoded bytes, not a copy. The
        chunks after the first are decoded in other threads meanwhile."""
        stored = self.shape[0] * self.item_bytes
        first = start // self.chunk_bytes
        last = (min(end, stored) - 1) // self.chunk_bytes
        if first <= last:
            self._read_ahead(first, last)
        for number in range(first + 1, last + 1):
            if CHUNKS_AHEAD and not self._held_chunk(number):
                shared_pool("bcolz-ahead", CHUNKS_AHEAD).submit(self._decode_quietly, number)
        chunks = [self._chunk_data(number) for number in range(first, last + 1)]
        if end <= stored and chunks:
            whole = (self.windows.joined(first, chunks) or self.cache.joined(chunks)) \
                if len(chunks) > 1 else chunks[0]
            if whole is not None:
                within = start - first * self.chunk_bytes
                return memoryview(whole)[within:within + end - start]
        parts = []
        at = start
        for number, data in zip(range(first, last + 1), chunks):
            within = at - number * self.chunk_bytes
            take = min(min(end, stored) - at, self.chunk_bytes - within)
            parts.append(memoryview(data)[within:within + take])
            at += take
        if end > stored:
            parts.append(bytes(self._partial[max(start, stored) - stored:end - stored]))
        return b"".join(parts)

    # -- writing

    def write_data(self, start, data, header_bytes):
        """Overwrite items, or append them (``header_bytes``: where the items start in the
        file). bcolz stores whole items, and the kernel hands one user write over in pieces
        (see ``_maybe_continued``): an append that leaves part of an item is held for a
        later piece or write to complete only if it ends on a page boundary (where the
        kernel cuts a longer write) or ends a write of at least a page (copy tools and
        buffered writers write blocks that end anywhere); otherwise it is refused here and
        changes nothing. Held bytes never completed are refused at close (``commit``).
        Only a stream of PENDING_BYTES_MAX pending bytes commits its whole items."""
        run = len(data) + (self._run_bytes if start == self._run_end else 0)
        self._run_end = None  # (until this piece is stored: a refused piece ends a write)
        if self.cparams is None:
            raise refuse(self.label, "meta/storage has no usable cparams to compress with")
        stored = self.shape[0] * self.item_bytes
        end, at = start + len(data), max(start, stored)
        if end > stored and not self.appendable:
            raise refuse(self.label, "a ctable's columns grow together (append with bcolz)")
        if end > stored and at != stored + len(self._partial):
            raise refuse(self.label, f"appends continue at the end ({stored} bytes, "
                                     f"{len(self._partial)} pending), not at {at}")
        on_page_end = (header_bytes + end) % PAGE_BYTES == 0
        if end > stored and (len(self._partial) + end - at) % self.item_bytes \
                and not on_page_end and run < PAGE_BYTES:
            raise refuse(self.label, f"a write of {run} bytes ends inside an item (items of "
                                     f"{self.item_bytes} bytes; one shorter than "
                                     f"{PAGE_BYTES} bytes must end on an item boundary)")
        if start < stored:
            self._overwrite(start, data[:min(end, stored) - start])
        if end > stored:
            self._partial += data[at - start:]
            if len(self._partial) % self.item_bytes == 0 \
                    or len(self._partial) >= PENDING_BYTES_MAX:
                whole = len(self._partial) // self.item_bytes * self.item_bytes
                if whole:
                    self._append(bytes(self._partial[:whole]))
                    del self._partial[:whole]
        if _maybe_continued(on_page_end, len(data)):
            self._run_end, self._run_bytes = end, run

    def _overwrite(self, start, data):
        """Each touched chunk recompressed and its superchunk replaced."""
        done = 0
        while done < len(data):
            number, within = divmod(start + done, self.chunk_bytes)
            old = self.chunk_data(number)
            take = min(len(data) - done, len(old) - within)
            if data[done:done + take] != old[within:within + take]:
                self._store_chunk(number, bytes(old[:within]) + data[done:done + take]
                                  + bytes(old[within + take:]))
            done += take

    def _append(self, items):
        """New items: every chunk they touch first (the last partial one rewritten), then
        meta/sizes, so a crash never leaves meta/sizes ahead of the data."""
        length = self.shape[0]
        first = length // self.chunklen
        kept = bytes(self.chunk_data(first)[:(length - first * self.chunklen) * self.item_bytes]) \
            if length % self.chunklen else b""
        joined = kept + items
        for index in range(0, len(joined), self.chunk_bytes):
            self._store_chunk(first + index // self.chunk_bytes,
                              joined[index:index + self.chunk_bytes])
        count = length + len(items) // self.item_bytes
        sizes = dict(self.sizes, shape=[count, *self.shape[1:]],
                     nbytes=count * self.item_bytes)
        replace_file(self.root, self._rel("meta", "sizes"), json.dumps(sizes).encode())
        self.sizes, self.shape = sizes, (count, *self.shape[1:])
        self._sizes_identity = file_identity(lstat_beneath(self.root, self._rel("meta", "sizes")))
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
        replace_file(self.root, path, SUPERCHUNK_HEADER.pack(MAGIC, 1, 1) + packed)
        self.cache.put((self.path, number), file_identity(lstat_beneath(self.root, path)), raw)
        self.version += 1

    def reload_if_changed(self):
        """Re-read meta/ if another process (bcolz) changed meta/sizes; True if it did.
        If it cannot be read now (bcolz mid-write), the view stays as it was."""
        with self._lock:
            try:
                now = file_identity(lstat_beneath(self.root, self._rel("meta", "sizes")))
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
            raise refuse(self.label, f"{count} appended bytes do not end on an item boundary "
                                     f"(items of {self.item_bytes} bytes): none stored")
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
        return [f"{info['container']}: {info['format']}", *carray_info_lines(info, "  "),
                attrs_line(info)]

    def describe(self):
        return {"container": self.label, "format": "bcolz carray",
                "dtype": str(self.dtype), "shape": list(self.shape),
                "chunklen": self.chunklen, "chunks": self.chunk_count(),
                "cparams": self.storage.get("cparams"), "attrs": self.attrs,
                "problems": self.problems + (self._writer_note() if self.appendable else [])}

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

