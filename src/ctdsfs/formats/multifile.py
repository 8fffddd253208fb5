"""casacore MultiFile (``.mf``): header codec (versions 1 and 2) and the container.

Layout facts (casacore note 260 plus ``../shared/FORMAT-NOTES.md``), all big-endian:

* v1: ``Int64 headerSize, blockSize, hdrCounter`` then AipsIO ``MultiFile`` v1
  (``Int64 nblocks``, entries ``name, Block<Int64> blocks, Int64 size``,
  ``Block<Int64> free``). Header bytes past the first block live in the
  separate file ``<container>_hdrext``.
* v2: a fixed 64-byte part, AipsIO ``MultiFile`` v2 (entries ``name, Int64 size,
  Bool nested``), then outside AipsIO ``Int64 n`` + items vectors: one packed
  block index per entry, the packed free list, the CRC vector (uInt32), the two
  continuation sets, and two ``uInt32`` counts of continuation blocks used.
  Header bytes past block 0 are chained through continuation blocks that begin
  with ``Int64 next`` (0 = last).

Everything read from a container is untrusted: counts and sizes are bounded by
the bytes actually present, block numbers by the container's size, and an
entry that fails validation is hidden (with a reason in ``problems``) instead
of failing the whole container.
"""

import logging
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..container import Container, Usage
from ..errors import BlockError, FormatError
from .aipsio import AipsReader, AipsWriter
from .crc import crc32_bzip2

log = logging.getLogger(__name__)

FIXED_V2 = struct.Struct(">qqqiIqqqB7s")  # the 64-byte fixed part of a v2 header
LEAD_V1 = struct.Struct(">qqq")
MAX_BLOCK_SIZE = 1 << 31  # casacore stores the block size as an Int
MAX_NESTING = 32
MAX_NAME_BYTES = 255
VERIFIED_CACHE_BYTES = 32 << 20


@dataclass
class Entry:
    """One header slot. An empty name marks a deleted slot (casacore keeps it)."""

    name: str
    size: int
    blocks: np.ndarray  # container block numbers of the file's blocks, in order
    nested_flag: bool = False  # as stored; casacore never sets it
    problem: str = None  # why the stored block index is unusable, if it is


@dataclass
class Header:
    """A decoded MultiFile header (both versions)."""

    version: int
    block_size: int
    counter: int
    nblocks: int
    header_size: int
    entries: list
    free_blocks: np.ndarray
    use_crc: bool = False
    header_crc: int = 0
    crcs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    cont_first: int = 0
    cont_sets: tuple = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    cont_used: tuple = (0, 0)
    has_hdrext: bool = False

    @property
    def active_cont_set(self):
        """Index of the continuation set the header at offset 8 points into."""
        other = self.cont_sets[1]
        return 1 if len(other) and self.cont_first == other[0] else 0


class Store:
    """Where a container's bytes live: ``pread`` and ``size``; a file or a virtual file."""

    label = "?"

    def pread(self, offset, size):
        raise NotImplementedError

    def size(self):
        raise NotImplementedError


class FileStore(Store):
    """A real file, read with ``os.pread`` (thread-safe, no shared file position)."""

    def __init__(self, path):
        self.label = os.fspath(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def pread(self, offset, size):
        data = os.pread(self.fd, size, offset)
        if len(data) == size or not data:
            return data
        parts = [data]  # short read before EOF: keep reading until EOF or done
        got = len(data)
        while got < size:
            more = os.pread(self.fd, size - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def size(self):
        return os.fstat(self.fd).st_size

    def stat(self):
        return os.fstat(self.fd)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class VirtualFileStore(Store):
    """A virtual file of a parent container: how nested MultiFiles are read."""

    def __init__(self, parent, name):
        self.parent = parent
        self.name = name
        self.label = f"{parent.label}/{name}"

    def pread(self, offset, size):
        return self.parent.read(self.name, offset, size)

    def size(self):
        return self.parent.entry_size(self.name)


# ---------------------------------------------------------------- packed index

def pack_index(blocks):
    """casacore's packed index: a run ``b, b+1, ..., b+n`` is stored as ``b, -n``."""
    blocks = np.asarray(blocks, dtype=np.int64)
    if len(blocks) == 0:
        return np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(blocks)])))
    out = []
    for start, length in zip(blocks[starts].tolist(), lengths.tolist()):
        out.append(start)
        if length > 1:
            out.append(1 - length)
    return np.array(out, dtype=np.int64)


def unpack_indexes(packed_list, max_blocks):
    """Expand many packed indexes in one vectorised pass.

    Returns ``(blocks, problem)`` per index. An index that starts with a run
    count, or whose expansion would push the running total past ``max_blocks``
    (a container cannot hold more distinct blocks than it has), gets a problem
    instead of blocks: hostile counts never turn into huge allocations.
    """
    count = len(packed_list)
    empty = np.zeros(0, np.int64)
    results = [(empty, None)] * count
    lengths = np.fromiter((len(p) for p in packed_list), np.int64, count)
    if not lengths.any():
        return results
    flat = np.concatenate(packed_list).astype(np.int64)
    owner = np.repeat(np.arange(count), lengths)
    is_run = flat < 0
    malformed = np.zeros(count, bool)
    nonempty = lengths > 0
    malformed[nonempty] = is_run[(np.cumsum(lengths) - lengths)[nonempty]]
    malformed |= np.bincount(owner, weights=flat == np.iinfo(np.int64).min, minlength=count) > 0
    claims = np.bincount(owner, weights=np.where(is_run, -flat.astype(np.float64), 1.0),
                         minlength=count)
    fits = nonempty & ~malformed & (claims <= max_blocks)
    running = np.cumsum(np.where(fits, claims, 0))
    too_many = nonempty & ~malformed & ~(fits & (running <= max_blocks))
    usable = nonempty & ~malformed & ~too_many
    for i in np.flatnonzero(malformed).tolist():
        results[i] = (None, "packed block index is malformed")
    for i in np.flatnonzero(too_many).tolist():
        results[i] = (None, f"block index claims {claims[i]:.0f} blocks, more than the "
                            f"container has ({max_blocks})")
    if not usable.any():
        return results
    flat = flat[usable[owner]]
    totals = claims[usable].astype(np.int64)
    is_start = flat >= 0
    group = np.cumsum(is_start) - 1
    starts = flat[is_start]
    run_lengths = 1 + np.bincount(group[~is_start], weights=-flat[~is_start],
                                  minlength=len(starts)).astype(np.int64)
    total = int(totals.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(run_lengths) - run_lengths,
                                                          run_lengths)
    expanded = np.repeat(starts, run_lengths) + within
    for i, part in zip(np.flatnonzero(usable).tolist(),
                       np.split(expanded, np.cumsum(totals)[:-1])):
        results[i] = (part, None)
    return results


def unpack_index(packed, max_blocks):
    """Expand one packed index (see :func:`unpack_indexes`)."""
    blocks, problem = unpack_indexes([packed], max_blocks)[0]
    if problem:
        raise FormatError(problem)
    return blocks


# ---------------------------------------------------------------- header decode

def _packed_vectors(reader, count):
    """``count`` consecutive ``Int64 n`` + n ``Int64`` vectors, read as one int64 view."""
    avail = (reader.limit - reader.pos) // 8
    words = np.frombuffer(reader.buf, dtype=">i8", count=avail, offset=reader.pos)
    vectors, k = [], 0
    for _ in range(count):
        n = int(words[k]) if k < avail else -1
        if n < 0 or k + 1 + n > avail:
            raise FormatError("block index vectors do not fit in the header")
        vectors.append(words[k + 1:k + 1 + n])
        k += 1 + n
    reader.pos += 8 * k
    return vectors


def _v2_entries(reader, count):
    """``count`` v2 entries (String name, Int64 size, Bool nested): a tight loop for 1e5+."""
    buf = bytes(reader.take(reader.limit - reader.pos))
    unpack_from = struct.unpack_from
    entries, pos, end = [], 0, len(buf)
    for _ in range(count):
        if pos + 4 > end:
            raise FormatError("entry list is truncated")
        length = unpack_from(">I", buf, pos)[0]
        pos += 4
        if pos + length + 9 > end:
            raise FormatError("entry list is truncated")
        name = buf[pos:pos + length].decode("utf-8", "surrogateescape")
        size, nested = unpack_from(">qB", buf, pos + length)
        entries.append((name, size, nested != 0))
        pos += length + 9
    reader.pos -= end - pos  # give back what follows the entries
    return entries


def _raw_vector(reader, itemsize, dtype):
    """``Int64 n`` + n items, as MultiFile::writeVector writes them outside AipsIO."""
    count = reader.i64()
    if count < 0 or count * itemsize > reader.limit - reader.pos:
        raise FormatError(f"header vector of {count} items does not fit in the header")
    return np.frombuffer(reader.take(count * itemsize), dtype=dtype).astype(dtype.newbyteorder("="))


def _check_block_size(block_size, minimum):
    if not minimum <= block_size <= MAX_BLOCK_SIZE:
        raise FormatError(f"block size {block_size} is out of range")


def read_header(store, hdrext_path=None, verify_crc=True):
    """Decode the header of the MultiFile in ``store`` (v1 or v2)."""
    physical = store.size()
    lead = store.pread(0, LEAD_V1.size)
    if len(lead) < LEAD_V1.size:
        raise FormatError(f"{store.label}: too short for a MultiFile ({physical} bytes)")
    first, second, counter = LEAD_V1.unpack(lead)
    if first == 0:
        return _read_header_v2(store, physical, verify_crc)
    if first > 0:
        return _read_header_v1(store, physical, first, second, counter, hdrext_path)
    raise FormatError(f"{store.label}: not a MultiFile (negative header size)")


def _read_header_v1(store, physical, header_size, block_size, counter, hdrext_path):
    label = store.label
    _check_block_size(block_size, LEAD_V1.size)
    in_block0 = min(header_size, block_size)
    if in_block0 > physical:
        raise FormatError(f"{label}: header of {header_size} bytes does not fit in the file")
    data = store.pread(0, in_block0)
    has_hdrext = header_size > block_size
    if has_hdrext:
        if hdrext_path is None:
            raise FormatError(f"{label}: header continues in a _hdrext file, which is missing")
        try:
            with open(hdrext_path, "rb") as f:
                rest = f.read(header_size - block_size)
        except OSError as exc:
            raise FormatError(f"{label}: cannot read {hdrext_path}: {exc.strerror}") from None
        if len(rest) < header_size - block_size:
            raise FormatError(f"{label}: {hdrext_path} is shorter than the header needs")
        data += rest
    try:
        r = AipsReader(data, LEAD_V1.size)
        version = r.start("MultiFile", outer=True)
        if version != 1:
            raise FormatError(f"MultiFile v1 header holds AipsIO version {version}")
        nblocks = r.i64()
        raw_entries = []
        r.start("Block")
        for _ in range(r.u32()):
            name = r.string()
            blocks = r.block_i64()
            raw_entries.append((name, r.i64(), blocks))
        r.end()
        free = r.block_i64()
        r.end()
    except FormatError as exc:
        raise FormatError(f"{label}: bad MultiFile v1 header: {exc}") from None
    entries = [Entry(name, size, blocks) for name, size, blocks in raw_entries]
    return Header(version=1, block_size=block_size, counter=counter, nblocks=nblocks,
                  header_size=header_size, entries=entries, free_blocks=free,
                  has_hdrext=has_hdrext)


def _assemble_v2(store, physical, block_size, header_size, cont_first):
    """Block 0's part of the header plus the pieces of the continuation chain."""
    label = store.label
    data = bytearray(store.pread(0, min(header_size, block_size)))
    if len(data) < min(header_size, block_size):
        raise FormatError(f"{label}: file ends inside the header")
    physical_blocks = physical // block_size
    piece = block_size - 8
    blk = cont_first
    seen = set()
    while len(data) < header_size:
        if not 0 < blk < physical_blocks:
            raise FormatError(f"{label}: header continuation block {blk} is outside the file")
        if blk in seen:
            raise FormatError(f"{label}: header continuation chain loops at block {blk}")
        seen.add(blk)
        raw = store.pread(blk * block_size, block_size)
        data += raw[8:8 + min(piece, header_size - len(data))]
        blk = struct.unpack(">q", raw[:8])[0]
    if blk != 0:
        raise FormatError(f"{label}: header continuation chain does not end after the header")
    return bytes(data)


def _read_header_v2(store, physical, verify_crc):
    label = store.label
    fixed = store.pread(0, FIXED_V2.size)
    if len(fixed) < FIXED_V2.size:
        raise FormatError(f"{label}: too short for a MultiFile v2 header")
    (_, cont_first, counter, version, header_crc, header_size, block_size, nblocks,
     use_crc, _) = FIXED_V2.unpack(fixed)
    if version != 2:
        raise FormatError(f"{label}: MultiFile version {version} is not supported")
    _check_block_size(block_size, FIXED_V2.size)
    if not FIXED_V2.size <= header_size <= max(physical, block_size):
        raise FormatError(f"{label}: header size {header_size} is invalid")
    data = _assemble_v2(store, physical, block_size, header_size, cont_first)
    use_crc = use_crc != 0
    if use_crc and verify_crc:
        actual = crc32_bzip2(data[:28] + b"\0\0\0\0" + data[32:])
        if actual != header_crc:
            raise FormatError(f"{label}: header CRC mismatch (stored 0x{header_crc:08x}, "
                              f"computed 0x{actual:08x})")
    try:
        r = AipsReader(data, FIXED_V2.size)
        if r.start("MultiFile", outer=True) != 2:
            raise FormatError("AipsIO version differs from the header version")
        r.start("Block")
        raw = _v2_entries(r, r.u32())
        r.end()
        r.end()
        packed = _packed_vectors(r, len(raw) + 1)
        free_packed = packed.pop()
        crcs = _raw_vector(r, 4, np.dtype(">u4"))
        cont_sets = (_raw_vector(r, 8, np.dtype(">i8")), _raw_vector(r, 8, np.dtype(">i8")))
        cont_used = (r.u32(), r.u32())
    except FormatError as exc:
        raise FormatError(f"{label}: bad MultiFile v2 header: {exc}") from None
    # Indexes expand to at most one entry per block that physically exists.
    max_blocks = -(-physical // block_size)
    live = [p if name else p[:0] for (name, _, _), p in zip(raw, packed)]
    entries = []
    for (name, size, nested), (blocks, problem) in zip(raw, unpack_indexes(live, max_blocks)):
        if problem:
            entries.append(Entry(name, size, np.zeros(0, np.int64), nested, problem=problem))
        else:
            entries.append(Entry(name, size, blocks, nested))
    try:
        free = unpack_index(free_packed, max_blocks)
    except FormatError as exc:
        raise FormatError(f"{label}: bad free list: {exc}") from None
    return Header(version=2, block_size=block_size, counter=counter, nblocks=nblocks,
                  header_size=header_size, entries=entries, free_blocks=free,
                  use_crc=use_crc, header_crc=header_crc, crcs=crcs, cont_first=cont_first,
                  cont_sets=cont_sets, cont_used=cont_used)


# ---------------------------------------------------------------- header encode

def encode_header_v2(header):
    """The logical v2 header (all continuation pieces joined), CRC filled in if used.

    ``header.cont_first`` and the continuation vectors are written as given; the
    caller that splits the result into blocks decides them.
    """
    w = AipsWriter()
    w.out += FIXED_V2.pack(0, header.cont_first, header.counter, 2, 0, 0, header.block_size,
                           header.nblocks, 1 if header.use_crc else 0, bytes(7))
    w.start("MultiFile", 2, outer=True)
    w.start("Block", 1)
    w.u32(len(header.entries))
    for e in header.entries:
        w.string(e.name)
        w.i64(e.size)
        w.bool(e.nested_flag)
    w.end()
    w.end()

    def vector(values, dtype):
        values = np.asarray(values, dtype=dtype)
        w.i64(len(values))
        w.out += values.tobytes()

    for e in header.entries:
        vector(pack_index(e.blocks), ">i8")
    vector(pack_index(header.free_blocks), ">i8")
    vector(header.crcs, ">u4")
    vector(header.cont_sets[0], ">i8")
    vector(header.cont_sets[1], ">i8")
    w.u32(header.cont_used[0])
    w.u32(header.cont_used[1])
    out = w.out
    out[32:40] = struct.pack(">q", len(out))
    if header.use_crc:
        out[28:32] = struct.pack(">I", crc32_bzip2(out))
    return bytes(out)


def encode_header_v1(header):
    """The logical v1 header (block 0 part + ``_hdrext`` part joined)."""
    w = AipsWriter()
    w.out += bytes(LEAD_V1.size)
    w.start("MultiFile", 1, outer=True)
    w.i64(header.nblocks)
    w.start("Block", 1)
    w.u32(len(header.entries))
    for e in header.entries:
        w.string(e.name)
        w.block_i64(e.blocks)
        w.i64(e.size)
    w.end()
    w.block_i64(header.free_blocks)
    w.end()
    out = w.out
    out[:LEAD_V1.size] = LEAD_V1.pack(len(out), header.block_size, header.counter)
    return bytes(out)


# ---------------------------------------------------------------- container

def name_problem(name):
    """Why an entry name from a container cannot be shown as a file name, or None."""
    if name in (".", ".."):
        return "reserved name"
    if "/" in name or "\0" in name:
        return "name contains '/' or NUL"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return "name longer than 255 bytes"
    return None


def looks_like_v2(first64):
    """A cheap content sniff: do these bytes start a MultiFile v2 header?"""
    if len(first64) < FIXED_V2.size:
        return False
    zero, _, _, version, _, header_size, block_size, nblocks, use_crc, _ = FIXED_V2.unpack(
        first64[:FIXED_V2.size])
    return (zero == 0 and version == 2 and FIXED_V2.size <= block_size <= MAX_BLOCK_SIZE
            and header_size >= FIXED_V2.size and nblocks >= 1 and use_crc in (0, 1))


def looks_like_multifile(first64):
    """Does a file start like a MultiFile at all (so its header faults deserve details)?

    v2 starts with an Int64 0 and has the AipsIO magic at 64 (or its fixed part
    sniffs as v2); v1 starts with a positive header size and has it at 24.
    """
    if looks_like_v2(first64):
        return True
    if len(first64) >= 68 and first64[:8] == bytes(8) and first64[64:68] == b"\xbe" * 4:
        return True
    return (len(first64) >= 28 and struct.unpack(">q", first64[:8])[0] > 0
            and first64[24:28] == b"\xbe" * 4)


class MultiFile(Container):
    """A MultiFile opened for reading; nested MultiFiles appear through ``nested()``."""

    format_name = "MultiFile"

    def __init__(self, store, *, hdrext_path=None, verify_crc=True, depth=0):
        self.store = store
        self.label = store.label
        self.verify_crc = verify_crc
        self.depth = depth
        self.header = read_header(store, hdrext_path, verify_crc)
        self.block_size = self.header.block_size
        self.problems = []
        self._entries = self._validate()
        self._nested = {}
        self._lock = threading.Lock()
        self._verified = OrderedDict()  # block number -> bytes already CRC-checked
        self._verified_max = max(4, VERIFIED_CACHE_BYTES // self.block_size)

    # -- validation of untrusted header content

    def _problem(self, text):
        self.problems.append(text)
        log.warning("%s: %s", self.label, text)

    def _validate(self):
        """The entries that can be served, by name; every other one is reported and hidden."""
        h = self.header
        bs = h.block_size
        limit = max(0, min(h.nblocks, -(-self.store.size() // bs)))
        hidden = {}
        candidates = {}
        for slot, e in enumerate(h.entries):
            if e.name == "":
                continue  # deleted slot
            why = name_problem(e.name) or e.problem
            if why is None and e.name in candidates:
                why = "duplicate name"
            if why is None and not 0 <= e.size <= len(e.blocks) * bs:
                why = f"size {e.size} does not match its {len(e.blocks)} blocks"
            if why is None:
                candidates[e.name] = (slot, e)
            else:
                hidden[slot] = (e.name, why)
        for slot, name in self._outside(candidates.values(), limit):
            hidden[slot] = (name, "block number outside the container")
            del candidates[name]
        for slot, name in self._sharing_blocks(candidates.values()):
            hidden[slot] = (name, "uses a block that an earlier entry (or itself) uses")
            del candidates[name]
        for slot in sorted(hidden):
            name, why = hidden[slot]
            self._problem(f"entry {slot} {name!r} hidden: {why}")
        return {name: e for name, (_, e) in candidates.items()}

    @staticmethod
    def _outside(candidates, limit):
        """(slot, name) of every entry with a block number outside ``1 .. limit-1``."""
        candidates = [(slot, e) for slot, e in candidates if len(e.blocks)]
        if not candidates:
            return []
        blocks = np.concatenate([e.blocks for _, e in candidates])
        owner = np.repeat(np.arange(len(candidates)), [len(e.blocks) for _, e in candidates])
        bad = np.unique(owner[(blocks < 1) | (blocks >= limit)]).tolist()
        return [(candidates[i][0], candidates[i][1].name) for i in bad]

    @staticmethod
    def _sharing_blocks(candidates):
        """(slot, name) of every entry that reuses a block claimed before it."""
        candidates = [(slot, e) for slot, e in candidates if len(e.blocks)]
        if not candidates:
            return []
        blocks = np.concatenate([e.blocks for _, e in candidates])
        owner = np.repeat(np.arange(len(candidates)), [len(e.blocks) for _, e in candidates])
        order = np.argsort(blocks, kind="stable")
        repeated = blocks[order][1:] == blocks[order][:-1]
        losers = sorted(set(owner[order[1:][repeated]].tolist()))
        return [(candidates[i][0], candidates[i][1].name) for i in losers]

    # -- Container interface

    def names(self):
        return list(self._entries)

    def _entry(self, name):
        try:
            return self._entries[name]
        except KeyError:
            raise FileNotFoundError(name) from None

    def entry_size(self, name):
        return self._entry(name).size

    def entry_blocks(self, name):
        return len(self._entry(name).blocks)

    def usage(self):
        h = self.header
        return Usage(h.block_size, h.nblocks, len(h.free_blocks))

    def read(self, name, offset, size):
        e = self._entry(name)
        end = min(offset + size, e.size)
        if offset >= end:
            return b""
        bs = self.block_size
        first, last = offset // bs, (end - 1) // bs
        blocks = e.blocks[first:last + 1].tolist()
        if self.verify_crc and self.header.use_crc:
            data = self._read_verified(name, first, blocks)
            skip = offset - first * bs
            return data[skip:skip + end - offset]
        chunks = []
        pos = offset
        i = 0
        while i < len(blocks):
            j = i
            while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
                j += 1
            run_end = min(end, (first + j + 1) * bs)
            want = run_end - pos
            data = self.store.pread(blocks[i] * bs + pos - (first + i) * bs, want)
            if len(data) < want:
                raise self._block_error(name, first + i, "lies past the end of the container")
            chunks.append(data)
            pos = run_end
            i = j + 1
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _block_error(self, name, index, why):
        msg = f"{self.label}: {name}: block {index} {why}"
        log.error("%s", msg)
        return BlockError(msg)

    def _read_verified(self, name, first, blocks):
        """Whole blocks, each checked against its stored CRC before any byte is returned."""
        bs = self.block_size
        crcs = self.header.crcs
        parts = []
        for k, b in enumerate(blocks):
            with self._lock:
                cached = self._verified.get(b)
                if cached is not None:
                    self._verified.move_to_end(b)
            if cached is None:
                cached = self.store.pread(b * bs, bs)
                if len(cached) < bs:
                    raise self._block_error(name, first + k, "lies past the end of the container")
                if b >= len(crcs):
                    raise self._block_error(name, first + k, f"(container block {b}) has no CRC")
                if crc32_bzip2(cached) != int(crcs[b]):
                    raise self._block_error(
                        name, first + k, f"(container block {b}) fails its CRC check")
                with self._lock:
                    self._verified[b] = cached
                    while len(self._verified) > self._verified_max:
                        self._verified.popitem(last=False)
            parts.append(cached)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def nested(self, name):
        with self._lock:
            if name in self._nested:
                return self._nested[name]
        child = self._open_nested(name)
        with self._lock:
            return self._nested.setdefault(name, child)

    def _open_nested(self, name):
        e = self._entry(name)
        if e.size < FIXED_V2.size:
            return None
        try:
            if not looks_like_v2(self.read(name, 0, FIXED_V2.size)):
                return None
        except BlockError:
            return None
        if self.depth + 1 > MAX_NESTING:
            self._problem(f"{name!r} shown as a file: nested more than {MAX_NESTING} deep")
            return None
        try:
            return MultiFile(VirtualFileStore(self, name), verify_crc=self.verify_crc,
                             depth=self.depth + 1)
        except (FormatError, BlockError) as exc:
            self._problem(f"{name!r} shown as a file: looks nested but {exc}")
            return None

    def describe(self):
        h = self.header
        info = {
            "container": self.label,
            "format": "MultiFile",
            "version": h.version,
            "block_size": h.block_size,
            "blocks": h.nblocks,
            "crc": h.use_crc,
            "header_counter": h.counter,
            "header_size": h.header_size,
            "free_blocks": h.free_blocks.tolist(),
        }
        if h.version == 1:
            info["hdrext"] = h.has_hdrext
        else:
            info["continuation"] = {
                "active_set": h.active_cont_set,
                "first_block": h.cont_first,
                "sets": [s.tolist() for s in h.cont_sets],
                "used": list(h.cont_used),
            }
        info["files"] = [
            {"name": n, "size": e.size, "blocks": len(e.blocks),
             "nested": self.nested(n) is not None}
            for n, e in self._entries.items()
        ]
        info["problems"] = list(self.problems)
        return info

    def close(self):
        if isinstance(self.store, FileStore):
            self.store.close()
