"""casacore MultiFile (``.mf``) header codec, versions 1 and 2.

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

import bisect
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field

from ...errors import FormatError
from ...io import crc
from ...io.store import open_if_regular
from ..casacore.aipsio import (
    BIG_ENDIAN_HOST,
    AipsReader,
    AipsWriter,
    big_endian_bytes,
    from_big_endian,
)

FIXED_V2 = struct.Struct(">qqqiIqqqB7s")  # the 64-byte fixed part of a v2 header
LEAD_V1 = struct.Struct(">qqq")
MAX_BLOCK_SIZE = 1 << 31  # casacore stores the block size as an Int
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NESTED_FLAG, PLAIN = 1, 2  # bits of Entry._flags
LONG_BLOCK_LIST = 1 << 16  # block lists at least this long are split into runs by numpy


def _flag_property(bit, doc):
    """A boolean attribute kept as ``bit`` of an entry's ``_flags``."""
    def get(entry):
        return bool(entry._flags & bit)

    def set_(entry, value):
        entry._flags = entry._flags & ~bit | (bit if value else 0)
    return property(get, set_, doc=doc)


class Entry:
    """One header slot. An empty name marks a deleted slot (casacore keeps it).

    ``blocks`` are the container block numbers of the file's blocks, in order: a
    ``range`` when they are one run (most files), ``BlockRuns`` when several (as
    decoded), an ``array("q")`` once written to. A run is held as its first block and
    length and made a ``range`` when asked for: a kept ``range`` and its end cost about
    80 bytes a file, 1.6 MB for a tree of 20,000 small files.

    ``plain`` is not in the header: the container knows the file holds no nested
    container (by its content, or from the persistent index). It shares a small int with
    the stored nested flag; in the container's dict of nested ones it took 33 bytes a file.
    """

    __slots__ = ("name", "size", "_first", "_blocks", "_flags", "problem")

    def __init__(self, name, size, blocks, nested_flag=False, problem=None):
        self.name = name
        self.size = size
        if blocks.__class__ is range and blocks.step == 1:  # (the setter, without a call)
            self._first, self._blocks = blocks.start, len(blocks)
        else:
            self._first, self._blocks = 0, blocks
        self._flags = NESTED_FLAG if nested_flag else 0
        self.problem = problem  # why the stored block index is unusable, if it is

    @property
    def blocks(self):
        held = self._blocks
        if held.__class__ is int:  # a run of ``held`` blocks from ``_first``
            return range(self._first, self._first + held)
        return held

    @blocks.setter
    def blocks(self, value):
        if value.__class__ is range and value.step == 1:
            self._first, self._blocks = value.start, len(value)
        else:
            self._first, self._blocks = 0, value

    nested_flag = _flag_property(NESTED_FLAG, "The header's nested flag, as stored "
                                              "(casacore never sets it).")
    plain = _flag_property(PLAIN, "Known to hold no nested container (not stored).")

    @property
    def block_count(self):
        held = self._blocks
        return held if held.__class__ is int else len(held)

    def run(self):
        """``(first block, stop)`` when the blocks are one run (or none), else None."""
        held = self._blocks
        return (self._first, self._first + held) if held.__class__ is int else None

    def __repr__(self):
        return (f"Entry({self.name!r}, {self.size}, {self.blocks!r}, "
                f"nested_flag={self.nested_flag}, problem={self.problem!r})")


@dataclass
class Header:
    """A decoded MultiFile header (both versions)."""

    version: int
    block_size: int
    counter: int
    nblocks: int
    header_size: int
    entries: list
    free_blocks: object  # an array("q") (or any sequence of ints)
    use_crc: bool = False
    header_crc: int = 0
    crcs: array = field(default_factory=lambda: array("I"))
    cont_first: int = 0
    cont_sets: tuple = (array("q"), array("q"))
    cont_used: tuple = (0, 0)
    has_hdrext: bool = False
    fingerprint: str = ""  # a digest of the header bytes as read (multifile_index.py)

    @property
    def active_cont_set(self):
        """Index of the continuation set the header at offset 8 points into."""
        other = self.cont_sets[1]
        return 1 if len(other) and self.cont_first == other[0] else 0


# ---------------------------------------------------------------- packed index

def pack_index(blocks):
    """casacore's packed index: a run ``b, b+1, ..., b+n`` is stored as ``b, -n``."""
    out = array("q")
    for start, stop in index_runs(blocks):
        out.append(blocks[start])
        if stop - start > 1:
            out.append(1 - (stop - start))
    return out


class BlockRuns:
    """A file's block numbers kept as the runs casacore's packed index describes: a read
    looks its blocks up by bisection, nothing is expanded to one number per block (a
    nested container of 2,000 blocks in two runs costs two runs, not 16 KB)."""

    __slots__ = ("firsts", "ends")

    def __init__(self, firsts, ends):
        self.firsts = firsts  # array("q"): the first block number of each run
        self.ends = ends  # array("q"): the index in the file's block list just past each run

    @classmethod
    def from_runs(cls, runs):
        """From ``(first block, length)`` pairs (a single run is better kept as a range)."""
        firsts, ends, total = array("q"), array("q"), 0
        for first, length in runs:
            total += length
            firsts.append(first)
            ends.append(total)
        return cls(firsts, ends)

    def __len__(self):
        return self.ends[-1] if self.ends else 0

    def runs(self):
        """``(first block, stop block, index of the first)`` of each run."""
        start = 0
        for first, end in zip(self.firsts, self.ends):
            yield first, first + end - start, start
            start = end

    def __iter__(self):
        for first, stop, _ in self.runs():
            yield from range(first, stop)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._slice(*index.indices(len(self)))
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("block index out of range")
        k = bisect.bisect_right(self.ends, index)
        return self.firsts[k] + index - (self.ends[k - 1] if k else 0)

    def _slice(self, start, stop, step):
        if step != 1:
            return array("q", list(self)[start:stop:step])
        pieces = []
        for first, run_stop, at in self.runs():
            end = at + run_stop - first
            if end > start and at < stop:
                pieces.append((first + max(0, start - at), min(end, stop) - max(start, at)))
        if len(pieces) == 1:
            return range(pieces[0][0], pieces[0][0] + pieces[0][1])
        return BlockRuns.from_runs(pieces)

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        return np.fromiter(self, dtype or np.int64, len(self))


def _is_run(blocks, start, stop):
    """Whether ``blocks[start:stop]`` (an ``array``) are consecutive numbers: compared
    as a whole, in C."""
    first = blocks[start]
    return blocks[stop - 1] - first == stop - 1 - start \
        and blocks[start:stop] == array("q", range(first, first + stop - start))


def index_runs(blocks):
    """``(start, stop)`` index pairs of the runs of consecutive numbers in ``blocks``.

    A ``range`` is one run, ``BlockRuns`` knows its runs. In an ``array`` each run's end
    is found by galloping and
    bisection on its last number (a few steps per run, not one per block), then the run
    is compared as a whole, in C; a list that is not ascending is walked instead.
    A very long fragmented list is split by numpy (never on the small-read path)."""
    count = len(blocks)
    if not count:
        return []
    if isinstance(blocks, range):
        return [(0, count)]
    if isinstance(blocks, BlockRuns):
        runs, last = [], None
        for first, stop, at in blocks.runs():
            if first == last:  # (a packed index may split one run in two)
                runs[-1] = (runs[-1][0], at + stop - first)
            else:
                runs.append((at, at + stop - first))
            last = stop
        return runs
    if not isinstance(blocks, array):
        blocks = array("q", blocks)
    if count >= LONG_BLOCK_LIST and not _is_run(blocks, 0, count):
        import numpy as np

        breaks = (np.flatnonzero(np.diff(np.asarray(blocks)) != 1) + 1).tolist()
        edges = [0, *breaks, count]
        return list(zip(edges[:-1], edges[1:]))
    runs, start = [], 0
    while start < count:
        first = blocks[start]
        good, step = start + 1, 1  # blocks[start:good] may be one run; past bad it is not
        while good + step <= count and blocks[good + step - 1] - first == good + step - 1 - start:
            good += step
            step *= 2
        bad = min(good + step, count + 1)
        while bad - good > 1:
            middle = (good + bad) // 2
            if blocks[middle - 1] - first == middle - 1 - start:
                good = middle
            else:
                bad = middle
        if not _is_run(blocks, start, good):  # not ascending: walk
            good = start + 1
            while good < count and blocks[good] == blocks[good - 1] + 1:
                good += 1
        runs.append((start, good))
        start = good
    return runs


def _expanded(runs):
    """Blocks of ``runs`` (``[start, length]`` pairs): a ``range`` if there is one run."""
    if len(runs) == 1:
        start, length = runs[0]
        return range(start, start + length)
    return BlockRuns.from_runs(runs)


def unpack_indexes(packed_list, max_blocks):
    """Expand many packed indexes.

    Returns ``(blocks, problem)`` per index (blocks: see :class:`Entry`). An index
    that starts with a run count, or whose expansion would push the running total past
    ``max_blocks`` (a container cannot hold more distinct blocks than it has), gets a
    problem instead of blocks: hostile counts never turn into huge allocations.
    """
    results = []
    running = 0  # blocks claimed by the indexes that fit on their own
    for packed in packed_list:
        blocks, problem, running = _unpack(packed, max_blocks, running)
        results.append((blocks, problem))
    return results


def _one_run(packed, start, max_blocks, running):
    """``(first, length)`` if ``packed[start:start + 2]`` is one run that fits, else None."""
    first, length = packed[start], 1 - packed[start + 1]
    if first >= 0 and 1 < length <= max_blocks - running and first + length - 1 <= INT64_MAX:
        return first, length
    return None


def _unpack(packed, max_blocks, running):
    """One index of :func:`unpack_indexes`: ``(blocks, problem, running)``, where
    ``running`` counts the blocks of the indexes before it (and of this one if it fits)."""
    if not len(packed):
        return range(0), None, running
    if len(packed) == 2 and (run := _one_run(packed, 0, max_blocks, running)):
        return range(run[0], run[0] + run[1]), None, running + run[1]  # most files
    runs, claims, malformed = [], 0, False
    for item in packed:
        if item >= 0:
            runs.append([item, 1])
            claims += 1
        elif not runs or item == INT64_MIN:
            malformed = True
        else:
            runs[-1][1] -= item
            claims -= item
    if malformed:
        return None, "packed block index is malformed", running
    if claims <= max_blocks:
        running += claims
    if claims > max_blocks or running > max_blocks:
        return None, (f"block index claims {claims} blocks, more than the container has "
                      f"({max_blocks})"), running
    if any(start + length - 1 > INT64_MAX for start, length in runs):
        return None, "packed block index is malformed", running
    return _expanded(runs), None, running


def unpack_index(packed, max_blocks):
    """Expand one packed index (see :func:`unpack_indexes`)."""
    blocks, problem = unpack_indexes([packed], max_blocks)[0]
    if problem:
        raise FormatError(problem)
    return blocks


# ---------------------------------------------------------------- header decode

def _packed_vectors(reader, count):
    """``count`` consecutive ``Int64 n`` + n ``Int64`` vectors: the words they lie in (one
    int64 array) and where each vector starts in it."""
    avail = (reader.limit - reader.pos) // 8
    words = from_big_endian(reader.buf[reader.pos:reader.pos + 8 * avail])
    starts, k = [], 0
    for _ in range(count):
        n = words[k] if k < avail else -1
        if n < 0 or k + 1 + n > avail:
            raise FormatError("block index vectors do not fit in the header")
        starts.append(k + 1)
        k += 1 + n
    reader.pos += 8 * k
    return words, starts


def _v2_indexed_entries(raw, words, starts, max_blocks):
    """Entries of ``raw`` ``(name, size, nested)`` with the index that starts at
    ``starts[i]`` in ``words`` (its length just before it); as :func:`unpack_indexes`,
    without an array per index for the files whose blocks are one run (most)."""
    entries, running = [], 0
    for (name, size, nested), start in zip(raw, starts):
        n = words[start - 1]
        if not name:  # a deleted slot: its index is ignored
            entries.append(Entry(name, size, range(0), nested))
        elif n == 1 and words[start] >= 0 and running < max_blocks:  # one block
            running += 1
            entries.append(Entry(name, size, range(words[start], words[start] + 1), nested))
        elif n == 2 and (first := words[start]) >= 0 \
                and 1 < (length := 1 - words[start + 1]) <= max_blocks - running \
                and first + length - 1 <= INT64_MAX:  # one run (as _one_run, inline)
            running += length
            entries.append(Entry(name, size, range(first, first + length), nested))
        else:
            blocks, problem, running = _unpack(words[start:start + n], max_blocks, running)
            entries.append(Entry(name, size, range(0) if problem else blocks, nested,
                                 problem=problem))
    return entries


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


def _raw_vector(reader, typecode):
    """``Int64 n`` + n items, as MultiFile::writeVector writes them outside AipsIO."""
    count = reader.i64()
    itemsize = array(typecode).itemsize
    if count < 0 or count * itemsize > reader.limit - reader.pos:
        raise FormatError(f"header vector of {count} items does not fit in the header")
    return from_big_endian(reader.take(count * itemsize), typecode)


def _check_block_size(block_size, minimum):
    if not minimum <= block_size <= MAX_BLOCK_SIZE:
        raise FormatError(f"block size {block_size} is out of range")


def _check_block_count(nblocks):
    """A negative block count is refused; one beyond the file is the container's concern
    (``MultiFile`` serves at most the blocks the file holds and reports the difference)."""
    if nblocks < 1:
        raise FormatError(f"block count {nblocks} is invalid (block 0 holds the header)")


def read_header(store, hdrext_path=None, verify_crc=True):
    """Decode the header of the MultiFile in ``store`` (v1 or v2).

    Every FormatError names the container (``store.label``, which for a nested
    one is the path of the virtual file holding it): the codec below raises
    bare reasons and this is the one place that adds the name.
    """
    try:
        return _read_header(store, hdrext_path, verify_crc)
    except FormatError as exc:
        raise FormatError(f"{store.label}: {exc}") from None


def _read_header(store, hdrext_path, verify_crc):
    physical = store.size()
    lead = store.pread(0, LEAD_V1.size)
    if len(lead) < LEAD_V1.size:
        raise FormatError(f"too short for a MultiFile ({physical} bytes)")
    first, second, counter = LEAD_V1.unpack(lead)
    if first == 0:
        return _read_header_v2(store, physical, verify_crc)
    if first > 0:
        return _read_header_v1(store, physical, first, second, counter, hdrext_path)
    raise FormatError("not a MultiFile (negative header size)")


def _read_hdrext(hdrext_path, length):
    """The ``length`` header bytes kept in ``_hdrext`` (a path, or a store: a remote
    object's); refused unless the file holds them (a hostile header size never becomes a
    read of that size)."""
    if hasattr(hdrext_path, "pread"):
        available = hdrext_path.size()
        if available < length:
            raise FormatError(f"{hdrext_path.label} holds {available} bytes, the header needs "
                              f"{length} there")
        return hdrext_path.pread(0, length)
    try:
        with os.fdopen(open_if_regular(hdrext_path, follow=True), "rb") as f:
            available = os.fstat(f.fileno()).st_size
            if available < length:
                raise FormatError(f"{hdrext_path} holds {available} bytes, the header needs "
                                  f"{length} there")
            rest = f.read(length)
    except OSError as exc:
        raise FormatError(f"cannot read {hdrext_path}: {exc.strerror}") from None
    if len(rest) < length:
        raise FormatError(f"{hdrext_path} is shorter than the header needs")
    return rest


def _read_header_v1(store, physical, header_size, block_size, counter, hdrext_path):
    _check_block_size(block_size, LEAD_V1.size)
    in_block0 = min(header_size, block_size)
    if in_block0 > physical:
        raise FormatError(f"header of {header_size} bytes does not fit in the file")
    data = store.pread(0, in_block0)
    has_hdrext = header_size > block_size
    if has_hdrext:
        if hdrext_path is None:
            raise FormatError("header continues in a _hdrext file, which is missing")
        data += _read_hdrext(hdrext_path, header_size - block_size)
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
        _check_block_count(nblocks)
    except FormatError as exc:
        raise FormatError(f"bad MultiFile v1 header: {exc}") from None
    entries = [Entry(name, size, blocks) for name, size, blocks in raw_entries]
    return Header(version=1, block_size=block_size, counter=counter, nblocks=nblocks,
                  header_size=header_size, entries=entries, free_blocks=free,
                  has_hdrext=has_hdrext, fingerprint=_fingerprint(data))


def assemble_v2(store, physical, block_size, header_size, cont_first):
    """Block 0's part of the header plus the pieces of the continuation chain.

    Nothing is read that the file does not hold: a hostile header or block
    size never becomes the size of a read buffer.
    """
    in_block0 = min(header_size, block_size)
    data = bytearray(store.pread(0, in_block0) if in_block0 <= physical else b"")
    if len(data) < in_block0:
        raise FormatError("file ends inside the header")
    physical_blocks = physical // block_size
    piece = block_size - 8
    blk = cont_first
    seen = set()
    while len(data) < header_size:
        if not 0 < blk < physical_blocks:
            raise FormatError(f"header continuation block {blk} is outside the file")
        if blk in seen:
            raise FormatError(f"header continuation chain loops at block {blk}")
        seen.add(blk)
        raw = store.pread(blk * block_size, block_size)
        data += raw[8:8 + min(piece, header_size - len(data))]
        blk = struct.unpack(">q", raw[:8])[0]
    if blk != 0:
        raise FormatError("header continuation chain does not end after the header")
    return bytes(data)


def _read_header_v2(store, physical, verify_crc):
    fixed = store.pread(0, FIXED_V2.size)
    if len(fixed) < FIXED_V2.size:
        raise FormatError("too short for a MultiFile v2 header")
    (_, cont_first, counter, version, header_crc, header_size, block_size, nblocks,
     use_crc, _) = FIXED_V2.unpack(fixed)
    if version != 2:
        raise FormatError(f"MultiFile version {version} is not supported")
    _check_block_size(block_size, FIXED_V2.size)
    _check_block_count(nblocks)
    if not FIXED_V2.size <= header_size <= max(physical, block_size):
        raise FormatError(f"header size {header_size} is invalid")
    data = assemble_v2(store, physical, block_size, header_size, cont_first)
    use_crc = use_crc != 0
    if use_crc and verify_crc:
        actual = crc.crc32_bzip2(data[:28] + b"\0\0\0\0" + data[32:])
        if actual != header_crc:
            raise FormatError(f"header CRC mismatch (stored 0x{header_crc:08x}, "
                              f"computed 0x{actual:08x})")
    try:
        r = AipsReader(data, FIXED_V2.size)
        if r.start("MultiFile", outer=True) != 2:
            raise FormatError("AipsIO version differs from the header version")
        r.start("Block")
        raw = _v2_entries(r, r.u32())
        r.end()
        r.end()
        words, starts = _packed_vectors(r, len(raw) + 1)
        free_start = starts.pop()
        crcs = _raw_vector(r, "I")
        cont_sets = (_raw_vector(r, "q"), _raw_vector(r, "q"))
        cont_used = (r.u32(), r.u32())
    except FormatError as exc:
        raise FormatError(f"bad MultiFile v2 header: {exc}") from None
    # Indexes expand to at most one entry per block that physically exists.
    max_blocks = -(-physical // block_size)
    entries = _v2_indexed_entries(raw, words, starts, max_blocks)
    try:
        free = array("q", unpack_index(words[free_start:free_start + words[free_start - 1]],
                                       max_blocks))
    except FormatError as exc:
        raise FormatError(f"bad free list: {exc}") from None
    return Header(version=2, block_size=block_size, counter=counter, nblocks=nblocks,
                  header_size=header_size, entries=entries, free_blocks=free,
                  use_crc=use_crc, header_crc=header_crc, crcs=crcs, cont_first=cont_first,
                  cont_sets=cont_sets, cont_used=cont_used, fingerprint=_fingerprint(data))


def _fingerprint(header_bytes):
    """What tells one header from any other: a persistent index recorded for a container
    applies only while its header is byte for byte the one it was recorded with."""
    return f"{len(header_bytes)}-{zlib.crc32(header_bytes):08x}"


# ---------------------------------------------------------------- header encode

def encode_indexes(block_lists):
    """``Int64 n`` + packed index per list (big-endian); a one-run list (a range) at once."""
    out = array("q")
    for blocks in block_lists:
        if type(blocks) is range and len(blocks) > 1:
            out.extend((2, blocks.start, 1 - len(blocks)))
        else:
            packed = pack_index(blocks)
            out.append(len(packed))
            out.extend(packed)
    if not BIG_ENDIAN_HOST:
        out.byteswap()
    return out.tobytes()


def encode_body_v2(header):
    """The part of a v2 header that continuation layout never changes: entries and indexes."""
    w = AipsWriter()
    w.start("MultiFile", 2, outer=True)
    w.start("Block", 1)
    w.u32(len(header.entries))
    pack = struct.Struct(">I").pack
    tail = struct.Struct(">qB").pack
    parts = []
    for e in header.entries:
        name = e.name.encode("utf-8", "surrogateescape")
        parts += (pack(len(name)), name, tail(e.size, 1 if e.nested_flag else 0))
    w.out += b"".join(parts)
    w.end()
    w.end()
    return w.getvalue() + encode_indexes([e.blocks for e in header.entries])


def encode_header_v2(header, body=None):
    """The logical v2 header (all continuation pieces joined), CRC filled in if used.

    ``header.cont_first``, ``nblocks`` and the continuation vectors are written
    as given; the caller that splits the result into blocks decides them and
    may pass the ``encode_body_v2`` result once for all its attempts.
    """
    def vector(values, typecode):
        return struct.pack(">q", len(values)) + big_endian_bytes(values, typecode)

    out = bytearray(FIXED_V2.pack(0, header.cont_first, header.counter, 2, 0, 0,
                                  header.block_size, header.nblocks,
                                  1 if header.use_crc else 0, bytes(7)))
    out += body if body is not None else encode_body_v2(header)
    out += vector(pack_index(header.free_blocks), "q")
    out += vector(header.crcs, "I")
    out += vector(header.cont_sets[0], "q")
    out += vector(header.cont_sets[1], "q")
    out += struct.pack(">II", *header.cont_used)
    out[32:40] = struct.pack(">q", len(out))
    if header.use_crc:
        out[28:32] = struct.pack(">I", crc.crc32_bzip2(out))
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


# ---------------------------------------------------------------- sniffing

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
