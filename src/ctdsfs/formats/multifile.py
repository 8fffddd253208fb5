"""The casacore MultiFile container: reads, copy-on-write writes, crash-safe commits.

Everything read from a container is untrusted: the header codec bounds counts
and sizes by the bytes present, and an entry that fails validation here is
hidden (with its reason in ``problems``) instead of failing the container.

Writes follow casacore's own rules (free list kept descending and used from
its tail, new blocks appended at the end, per-block CRC-32/BZIP2, freed blocks
get CRC 0, deleted files keep an empty-name slot, trailing free blocks shrink
the file) with one deliberate difference: a block that the committed header
references is never overwritten. Its new content goes to a fresh block, and
blocks freed since the last commit are reused only after the next one. A
commit writes data, then the inactive continuation set, then block 0, with
fsync between, so a crash at any moment leaves the last committed state (or
the new one) complete and readable — casacore's in-place updates can only
promise a readable header.

Two more differences keep the file no larger than its content and a full disk
harmless: the header's continuation blocks go to the lowest blocks free in
both states (casacore appends them at the end, where they stop the file from
ever shrinking), so every block the new state does not use is cut off the end
once block 0 is durable; and the room a change needs is checked and reserved
(the file grown with allocated zeros) before anything changes, so a full disk
or an impossible size refuses the whole change (ENOSPC, EFBIG) and leaves the
container writable. Blocks appended for a hole are never written: they read as
zeros already.
"""

import bisect
import errno
import functools
import logging
import os
import threading
from array import array
from collections import OrderedDict

from ..container import Container, Usage, name_problem
from ..errors import BlockError, ContainerFull, CtdsfsError, FormatError, ReadOnlyError, TooLarge
from . import crc
from .multifile_header import (FIXED_V2, PLAIN, Entry, Header, encode_body_v2, encode_header_v1,
                               encode_header_v2, index_runs, looks_like_multifile,
                               looks_like_v2, read_header)
from .multifile_index import open_index, plain_bitmap
from .remote_wire import RemoteError
from .store import VirtualFileStore, create_exclusive, open_store

log = logging.getLogger(__name__)

MAX_NESTING = 32
# A virtual file named like a container file is one the user stored (a copied
# table.mf), not a subtable: casacore names nested containers after tables.
CONTAINER_FILE_SUFFIXES = (".mf", ".mfh5")
VERIFIED_CACHE_BYTES = 32 << 20
# Telling nested containers in a listing: first bytes of files at most GATHER_GAP apart
# are read together, in pieces of at most GATHER_SPAN.
GATHER_GAP = 64 << 10
GATHER_SPAN = 1 << 20
INT64_MAX = (1 << 63) - 1  # casacore keeps sizes and offsets in Int64
ZERO_CHUNK = 8 << 20  # zeros that must really be written go out in pieces this large
HOLE_PIECE_BLOCKS = 1 << 16  # a hole is filled this many blocks at a time
GROW_AHEAD = 64 << 20  # how far past the last block a growing container file is allocated


def _grown(values, length):
    """``values`` (an ``array``) zero-padded to at least ``length`` items."""
    if len(values) >= length:
        return values
    return values + array(values.typecode, bytes((length - len(values)) * values.itemsize))


def _block_runs(blocks):
    """``(first block, stop)`` of each run of consecutive block numbers in ``blocks``."""
    if type(blocks) is range:
        return [(blocks.start, blocks.stop)] if blocks else []
    return [(blocks[i], blocks[j - 1] + 1) for i, j in index_runs(blocks)]


def _spans(blocks, first, block_size, offset, end):
    """``[(block index in the file, container offset, length)]``: the runs of consecutive
    ``blocks`` (the file's from block ``first`` on) that its bytes ``offset`` to ``end``
    lie in, one pread each."""
    spans, pos = [], offset
    for i, j in index_runs(blocks):
        run_end = min(end, (first + j) * block_size)
        spans.append((first + i, int(blocks[i]) * block_size + pos - (first + i) * block_size,
                      run_end - pos))
        pos = run_end
    return spans


def _entry_runs(entries):
    """``_block_runs`` of all ``entries``' blocks together."""
    runs = []
    for e in entries:
        run = e.run()
        if run is None:
            runs += _block_runs(e.blocks)
        elif run[1] > run[0]:  # (most files: at once)
            runs.append(run)
    return runs


@functools.lru_cache(maxsize=None)
def _zero_block_crc(block_size):
    """CRC-32/BZIP2 of an all-zero block, in bounded pieces (blocks may be 1 GiB)."""
    piece = bytes(min(block_size, ZERO_CHUNK))
    value = None
    for start in range(0, block_size, len(piece)):
        value = crc.crc32_bzip2(piece[:block_size - start], value)
    return value


class MultiFile(Container):
    """One MultiFile (top-level or nested); nested ones are reached through ``nested()``."""

    format_name = "MultiFile"
    kernel_write_cache = True  # committed on flush/fsync, after the kernel sent its pages

    @property
    def checks_reads(self):
        return self.verify_crc and self.header.use_crc

    def __init__(self, store, *, hdrext_path=None, verify_crc=True, writable=False, depth=0,
                 lock=None, header=None, index=None, index_path=""):
        self.store = store
        # A persistent index of plain files (read-only trees): multifile_index.NestedIndex,
        # in which this container's record is ``index_path``.
        self.index = index
        self.index_path = index_path
        self.label = store.label
        self.hdrext_path = hdrext_path
        self.verify_crc = verify_crc
        self.writable = writable
        self.depth = depth
        self.failure = None  # why writing was switched off, if it was
        self._lock = lock or threading.RLock()  # one lock for a whole tree of containers
        if header is None:
            self._load(read_header(store, hdrext_path, verify_crc))
        else:  # a new container, not yet on disk
            self._load(header, on_disk=False)

    @classmethod
    def new(cls, store, *, block_size, use_crc=False, version=2, hdrext_path=None, depth=0,
               lock=None):
        """Write an empty container (header block only, as casacore makes one) into ``store``."""
        if version not in (1, 2):
            raise CtdsfsError(f"MultiFile version {version} cannot be written")
        if not 64 <= block_size <= 1 << 30:
            raise CtdsfsError(f"block size {block_size} is out of range (64 .. 1 GiB)")
        if version == 1 and use_crc:
            raise CtdsfsError("MultiFile version 1 has no CRCs")
        header = Header(version=version, block_size=block_size, counter=0, nblocks=1,
                        header_size=0, entries=[], free_blocks=array("q"),
                        use_crc=use_crc, crcs=array("I", [0] * (1 if use_crc else 0)))
        container = cls(store, hdrext_path=hdrext_path, writable=True, depth=depth, lock=lock,
                        header=header)
        container._dirty = True
        container.commit()
        return container

    # ------------------------------------------------------------ state

    def _load(self, header, on_disk=True):
        self.header = header
        self.block_size = header.block_size
        self.problems = []
        self._nblocks = self._blocks_present(header) if on_disk else header.nblocks
        self._entries, runs = self._validate()
        self._committed = self._referenced_blocks(runs)
        self._check_spare_lists()
        if not self.writable:  # only writes ask which blocks are committed: 1 byte a block
            self._committed = bytearray()
        self._orphans = 0  # unlinked files still open: their blocks are in no header list
        if self.writable and self.problems:
            raise FormatError(f"{self.label}: damaged ({self.problems[0]}); "
                              "mount it read-only")
        self._free = sorted(header.free_blocks, reverse=True)  # allocatable now
        self._pending_free = []  # freed since the last commit, still in the committed state
        self._crcs = array("I", header.crcs)
        if header.use_crc:
            self._crcs = _grown(self._crcs, self._nblocks)
        self._buffers = {}  # id(entry) -> [block index, bytearray, entry]: a dirty partial block
        self._nested = {}
        # Names shown as files for another reason than their first bytes (a bad block, a
        # nested container that failed to open): the index never records them as plain.
        self._unsure = set()
        if self.index is not None:
            for name in self.index.plain_names(self.index_path, header.fingerprint,
                                               list(self._entries)):
                self._entries[name]._flags |= PLAIN  # (e.plain = True, without a call)
        self._dirty = False
        self._verified = OrderedDict()  # block number -> bytes already CRC-checked
        self._verified_max = max(4, VERIFIED_CACHE_BYTES // self.block_size)
        self._store_bytes = None  # the container file's size, once the write path needs it

    def _referenced_blocks(self, runs=None):
        """A bitmap (a byte per block) of the blocks that the visible entries (as they are
        now) use, or that ``runs`` (their ``_block_runs``) cover; validated: all within
        the container."""
        if runs is None:
            runs = _entry_runs(self._entries.values())
        used = bytearray(max((stop for _, stop in runs), default=0))
        for first, stop in runs:
            used[first:stop] = b"\1" * (stop - first)
        return used

    def reload_if_changed(self):
        """Re-read the header if another process committed since (its counter moved on).

        Only a top-level container with nothing pending reloads; with local
        changes the next commit detects the conflict instead. True if reloaded.
        """
        with self._lock:
            if self.depth or self.dirty or self._orphans:
                return False
            replaced = self.store.replaced()  # a remote object with a new ETag
            if not replaced and self._counter_on_disk() == self.header.counter:
                return False
            header = read_header(self.store, self.hdrext_path, self.verify_crc)
            if not replaced:  # (a replaced store has said so itself)
                log.info("%s: changed by another process (header counter %d -> %d): reloaded",
                         self.label, self.header.counter, header.counter)
            for child in self._nested.values():
                if child is not None:
                    child._set_read_only(f"{child.label} was reloaded")
            self.index = None  # made for the file as it was
            try:
                self._load(header)
            except FormatError as exc:  # damaged by the other writer: keep serving, read-only
                self._set_read_only(str(exc))
            return True

    @property
    def dirty(self):
        if not (self.writable or self.failure):
            return False  # never written: no walk over every nested entry on each request
        return self._dirty or any(c is not None and c.dirty for c in self._nested.values())

    # ------------------------------------------------------------ validation

    def _problem(self, text):
        self.problems.append(text)
        log.warning("%s: %s", self.label, text)

    @property
    def nblocks(self):
        """How many blocks the container has: the header's count, bounded by the file."""
        return self._nblocks

    def _blocks_present(self, header):
        """The header's block count, bounded by the blocks the file holds.

        A header claiming more (a truncated copy, or a hostile count such as
        2**62) is a problem, and the count served is the file's: no vector,
        check, map or statfs is ever sized by the number the header states.
        """
        present = -(-self.store.size() // header.block_size)
        if header.nblocks > present:
            self._problem(f"header claims {header.nblocks} blocks, the file holds {present}")
            return present
        return header.nblocks

    def _check_spare_lists(self):
        """The free list and continuation sets name blocks a write may reuse: each must be
        a block of the container that no file uses (else a problem, so never written to)."""
        used = self._committed
        for what, blocks in (("free list", list(self.header.free_blocks)),
                             ("continuation sets", [b for s in self.header.cont_sets for b in s])):
            outside = [b for b in blocks if not 1 <= b < self._nblocks]
            if outside:
                self._problem(f"{what} names block {int(outside[0])}, outside the container")
            elif any(b < len(used) and used[b] for b in blocks) or len(set(blocks)) < len(blocks):
                self._problem(f"{what} names a block twice or one that a file uses")

    def _validate(self):
        """The entries that can be served, by name (every other one is reported and hidden),
        and the runs of blocks they use (None if some entry was hidden for its blocks)."""
        h = self.header
        bs = h.block_size
        hidden = {}
        entries = {}
        holding = []  # (slot, entry) of the entries with blocks
        for slot, e in enumerate(h.entries):
            name = e.name
            if name == "":
                continue  # deleted slot
            why = name_problem(name) or e.problem
            if why is None and name in entries:
                why = "duplicate name"
            if why is None:
                count = e.block_count
                if not 0 <= e.size <= count * bs:
                    why = f"size {e.size} does not match its {count} blocks"
            if why is not None:
                hidden[slot] = (name, why)
                continue
            entries[name] = e
            if count:
                holding.append((slot, e))
        runs = _entry_runs(e for _, e in holding)
        bad = self._bad_blocks(holding, runs, self._nblocks)
        for slot, name, why in bad:
            hidden[slot] = (name, why)
            del entries[name]
        for slot in sorted(hidden):
            name, why = hidden[slot]
            h.entries[slot].problem = h.entries[slot].problem or why
            self._problem(f"entry {slot} {name!r} hidden: {why}")
        return entries, None if bad else runs

    @classmethod
    def _bad_blocks(cls, holding, runs, limit):
        """(slot, name, reason) of the entries ``holding`` blocks with a block outside
        ``1 .. limit-1``, or one that an earlier entry (or the entry itself) already uses;
        ``runs`` are all their blocks' runs (sorted here).

        Blocks are compared as runs, without numpy: a sound container's files are mostly
        one run each. Only when runs leave the container or overlap (a damaged container)
        is the culprit found block by block."""
        runs.sort()
        if runs and (runs[0][0] < 1 or max(stop for _, stop in runs) > limit
                     or any(runs[k][0] < runs[k - 1][1] for k in range(1, len(runs)))):
            return cls._bad_blocks_exactly(holding, limit)
        return []

    @staticmethod
    def _bad_blocks_exactly(candidates, limit):
        """``_bad_blocks`` of a damaged container, block by block (numpy, in one pass)."""
        import numpy as np

        lengths = [len(e.blocks) for _, e in candidates]
        blocks = np.concatenate([e.blocks for _, e in candidates])
        owner = np.repeat(np.arange(len(candidates)), lengths)
        outside = (blocks < 1) | (blocks >= limit)
        bad = dict.fromkeys(owner[outside].tolist(), "block number outside the container")
        has_bad_block = np.zeros(len(candidates), bool)
        has_bad_block[list(bad)] = True
        inside = ~outside & ~has_bad_block[owner]
        blocks, owner = blocks[inside], owner[inside]
        order = np.argsort(blocks, kind="stable")
        repeated = blocks[order][1:] == blocks[order][:-1]
        for i in owner[order[1:][repeated]].tolist():
            bad[i] = "uses a block that an earlier entry (or itself) uses"
        return [(candidates[i][0], candidates[i][1].name, why) for i, why in sorted(bad.items())]

    # ------------------------------------------------------------ reading

    def names(self):
        with self._lock:
            return list(self._entries)

    def entry_size(self, key):
        return self._entry(key).size

    def entry_blocks(self, key):
        return self._entry(key).block_count

    def entry_stats(self, names):
        with self._lock:
            entries = self._entries
            if not all(name in entries for name in names):
                return super().entry_stats(names)  # (raises FileNotFoundError)
            return [(e.size, e.block_count) for e in map(entries.__getitem__, names)]

    def usage(self):
        return Usage(self.block_size, self._nblocks, len(self._free) + len(self._pending_free))

    def _located(self, key, offset, size):
        """(entry, first block index, end offset, the blocks from the first on) of the
        bytes ``offset`` to ``offset + size`` of a file (its pending writes flushed), or
        None if none lie before its end."""
        with self._lock:
            e = self._entry(key)
            if id(e) in self._buffers:
                self._flush_buffer(id(e))
            end = min(offset + size, e.size)
            if offset >= end:
                return None
            first = offset // self.block_size
            return e, first, end, e.blocks[first:(end - 1) // self.block_size + 1]

    def read(self, key, offset, size):
        located = self._located(key, offset, size)
        if located is None:
            return b""
        e, first, end, blocks = located
        bs = self.block_size
        name = e.name or "(unlinked file)"
        if self.verify_crc and self.header.use_crc:
            data = self._read_verified(name, first, blocks)
            skip = offset - first * bs
            return data[skip:skip + end - offset]
        chunks = []
        for index, at, want in _spans(blocks, first, bs, offset, end):
            data = self.store.view(at, want)
            if len(data) < want:
                raise self._block_error(name, index, "lies past the end of the container")
            chunks.append(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def cached(self, key, offset, size):
        if self.writable or (self.verify_crc and self.header.use_crc):
            return False  # (CRCs are CPU work, kept off the mount's loop)
        located = self._located(key, offset, size)
        if located is None:
            return True
        _, first, end, blocks = located
        return all(self.store.cached(at, want)
                   for _, at, want in _spans(blocks, first, self.block_size, offset, end))

    def waits(self, key, offset, size):
        located = self._located(key, offset, size)
        if located is None or self.writable:
            return False
        _, first, end, blocks = located
        return any(self.store.waits(at, want)
                   for _, at, want in _spans(blocks, first, self.block_size, offset, end))

    def _block_error(self, name, index, why):
        """The error for one unreadable block; the reader logs it (a mount once per block)."""
        detail = f"block {index} {why}"
        return BlockError(f"{self.label}: {name}: {detail}", detail)

    def _read_verified(self, name, first, blocks):
        """Whole blocks, each checked against its stored CRC before any byte is returned.

        Runs of consecutive blocks are read with one pread; single blocks go
        through a small cache, since FUSE reads touch the same block repeatedly.
        """
        parts = []
        for i, j in index_runs(blocks):
            if j - i == 1:
                parts.append(self._verified_block(name, first + i, int(blocks[i])))
            else:
                parts.append(self._verified_run(name, first + i, list(blocks[i:j])))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _verified_run(self, name, first, run):
        bs = self.block_size
        data = self.store.pread(run[0] * bs, len(run) * bs)
        view = memoryview(data)
        with self._lock:
            crcs = self._crcs
        for k, b in enumerate(run):
            piece = view[k * bs:(k + 1) * bs]
            self._check_block(name, first + k, b, piece, int(crcs[b]) if b < len(crcs) else None)
        return data

    def _check_block(self, name, index, block, data, expected):
        if len(data) < self.block_size:
            raise self._block_error(name, index, "lies past the end of the container")
        if expected is None:
            raise self._block_error(name, index, f"(container block {block}) has no CRC")
        if crc.crc32_bzip2(data) != expected:
            raise self._block_error(name, index, f"(container block {block}) fails its CRC check")

    def _verified_block(self, name, index, b):
        with self._lock:
            cached = self._verified.get(b)
            if cached is not None:
                self._verified.move_to_end(b)
                return cached
            expected = int(self._crcs[b]) if b < len(self._crcs) else None
        data = self.store.pread(b * self.block_size, self.block_size)
        self._check_block(name, index, b, data, expected)
        with self._lock:
            self._verified[b] = data
            while len(self._verified) > self._verified_max:
                self._verified.popitem(last=False)
        return data

    @staticmethod
    def _may_be_nested(name, e):
        return (e.size >= FIXED_V2.size
                and (e.nested_flag or not name.endswith(CONTAINER_FILE_SUFFIXES)))

    def nested(self, name):
        with self._lock:
            e = self._entry(name)
            if not e.plain and name not in self._nested:
                self._classified(name, e, self._open_nested(name))
            return None if e.plain else self._nested[name]

    def classify(self, names):
        with self._lock:
            entries, nested = self._entries, self._nested
            # (the plain bit read directly: a listing asks for every name, more than once)
            unknown = [name for name in names
                       if name not in nested and not entries[name]._flags & PLAIN]
            for name, first in self._first_bytes(unknown).items():
                self._classified(name, entries[name], self._open_nested(name, first))
            return [None if entries[name]._flags & PLAIN else nested[name] if name in nested
                    else self.nested(name) for name in names]

    def _classified(self, name, e, child):
        """Keep what ``name`` holds: a plain file is marked on its entry (the index records
        those), a nested container (or None for a file shown plain for another reason)
        goes in ``_nested``."""
        if child is None and name not in self._unsure:
            e.plain = True
        else:
            self._nested[name] = child

    def _first_bytes(self, names):
        """name -> the first bytes of each file in ``names`` that may hold a nested
        MultiFile, read in container order with neighbouring reads merged: a cold listing
        costs a few large reads instead of one small read per file. The bytes are not
        CRC-checked: they only decide whether to try opening, and opening checks."""
        want, bs = FIXED_V2.size, self.block_size
        if bs < want:
            return {}  # (a header spans blocks: read one by one)
        starts = sorted((int(e.blocks[0]) * bs, name) for name in names
                        if self._may_be_nested(name, e := self._entries[name])
                        and id(e) not in self._buffers)
        found = {}
        i = 0
        while i < len(starts):
            first = starts[i][0]
            j = i + 1
            while (j < len(starts) and starts[j][0] - starts[j - 1][0] <= GATHER_GAP
                   and starts[j][0] + want - first <= GATHER_SPAN):
                j += 1
            try:
                data = self.store.pread(first, starts[j - 1][0] + want - first)
            except BlockError:
                data = b""  # each file of this span is read on its own (and found bad)
            for offset, name in starts[i:j]:
                piece = data[offset - first:offset - first + want]
                if len(piece) == want:
                    found[name] = piece
            i = j
        return found

    def _open_nested(self, name, first=None):
        """The nested MultiFile in ``name``, or None; ``first``: its first bytes if read."""
        e = self._entry(name)
        if not self._may_be_nested(name, e):
            return None
        try:
            if not looks_like_v2(first or self.read(name, 0, FIXED_V2.size)):
                return None
        except RemoteError:
            raise  # a failed GET tells nothing of the file: EIO now, tried again next time
        except BlockError:
            self._unsure.add(name)
            return None
        self._unsure.add(name)  # (until it opens)
        if self.depth + 1 > MAX_NESTING:
            self._problem(f"{name!r} shown as a file: nested more than {MAX_NESTING} deep")
            return None
        try:
            child = MultiFile(VirtualFileStore(self, name), verify_crc=self.verify_crc,
                              writable=self.writable, depth=self.depth + 1, lock=self._lock,
                              index=self.index, index_path=f"{self.index_path}/{name}")
            self._unsure.discard(name)
            return child
        except RemoteError:
            self._unsure.discard(name)
            raise
        except (FormatError, BlockError) as exc:
            self._problem(f"{name!r} shown as a file: looks nested but {exc}")
            return None

    # ------------------------------------------------------------ writing

    def _check_writable(self):
        if not self.writable:
            raise ReadOnlyError(self.failure or f"{self.label} is read-only")

    def _fail(self, exc):
        """Switch the whole tree to read-only after a write-path failure (committed state intact)."""
        reason = f"{self.label}: write failed ({exc}); container switched to read-only"
        log.error("%s", reason)
        self._set_read_only(reason)

    def _guarded(self, func, *args):
        """Run a write-path step under the lock; an I/O error makes the tree read-only."""
        with self._lock:
            self._check_writable()
            try:
                return func(*args)
            except (FileExistsError, FileNotFoundError):
                raise  # a wrong name, not a failed write
            except (OSError, BlockError) as exc:
                self._fail(exc)
                raise

    def create(self, name):
        """A new empty virtual file (casacore reuses the last deleted slot)."""
        return self._guarded(self._create, name)

    def _create(self, name):
        self._check_new_entry(name)
        entry = Entry(name, 0, array("q"))
        slots = self.header.entries
        free_slots = [i for i, e in enumerate(slots) if e.name == "" and e.problem is None]
        if free_slots:
            slots[free_slots[-1]] = entry
        else:
            slots.append(entry)
        self._entries[name] = entry
        self._dirty = True
        return entry

    def write(self, key, offset, data):
        return self._guarded(self._write, key, offset, data)

    def _write(self, key, offset, data):
        e = self._entry(key)
        if not len(data):
            return 0  # write(2) of nothing moves no end of file
        end = offset + len(data)
        self._make_room(e, min(offset, e.size), end)
        if offset > e.size:
            self._write_range(e, e.size, None, offset - e.size)  # the hole reads as zeros
        self._write_range(e, offset, memoryview(data).cast("B"), len(data))
        self._dirty = True
        return len(data)

    def _make_room(self, e, start, end):
        """Check and reserve all that writing bytes ``start .. end`` of ``e`` needs, before
        anything changes, so a full disk or a size past the format's limits fails the
        whole call (ContainerFull, TooLarge) and never leaves it half done.

        Fresh blocks are those past the file's last block and new homes for its
        committed blocks in the range (copy-on-write); the ones the free list
        cannot give are appended to the container, whose file grows now.
        """
        name = e.name or "(unlinked file)"
        if start < 0:
            raise CtdsfsError(f"{self.label}: {name}: negative offset {start}")
        if end > INT64_MAX:
            raise TooLarge(f"{self.label}: {name}: offset {end} is past what a MultiFile holds")
        if end == start:
            return
        bs = self.block_size
        first, stop = start // bs, -(-end // bs)
        have = len(e.blocks)
        existing = e.blocks[first:min(stop, have)]
        if isinstance(existing, range):
            rewritten = self._committed[existing.start:existing.stop].count(1)
        else:
            rewritten = sum(1 for b in existing if self._is_committed(b))
        fresh = max(0, stop - have) + rewritten
        self._reserve(fresh, stop - first, name)

    def make_room(self, name, count, block_size):
        """Reserve room for a nested container's writes of ``count`` blocks of ``block_size``
        bytes into virtual file ``name`` (as if each landed on committed blocks)."""
        per_block = -(-block_size // self.block_size) + (block_size % self.block_size != 0)
        return self._guarded(self._reserve, count * per_block, count * per_block, name)

    def _reserve(self, fresh, touched, name):
        """Room for ``fresh`` allocations and ``touched`` block writes: the container file
        grows over the blocks appended past the free list (zeros, disk space allocated),
        and a parent container makes room for the writes into it."""
        self._reserve_blocks(self._nblocks + max(0, fresh - len(self._free)), touched, name)

    def _reserve_blocks(self, nblocks, touched, name):
        bs = self.block_size
        if nblocks * bs > INT64_MAX:
            raise TooLarge(f"{self.label}: {name}: {nblocks} blocks of {bs} bytes are past "
                           "what a MultiFile holds")
        try:
            self.store.room(touched, bs)
            if nblocks * bs > self._store_end():
                self._grow_store(nblocks * bs)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ContainerFull(f"{self.label}: {name}: no space left on the disk for "
                                    f"{nblocks - self._nblocks} more blocks of {bs} "
                                    "bytes") from None
            if exc.errno == errno.EFBIG:
                raise TooLarge(f"{self.label}: {name}: the file system cannot hold "
                               f"{nblocks * bs} bytes") from None
            raise

    def _grow_store(self, size):
        """Grow the container file to ``size`` (a top-level one a good step further, so a
        sequential writer grows it rarely; the commit cuts what was not used)."""
        if self.depth == 0:
            ahead = min(size + GROW_AHEAD, INT64_MAX // self.block_size * self.block_size)
            try:
                self.store.extend(ahead)
                self._store_bytes = ahead
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise
        self.store.extend(size)
        self._store_bytes = size

    def _store_end(self):
        """The container file's size. Bytes past the last block (a crash's leftovers, or
        blocks a commit freed) are cut when it is first asked, so that they always read
        as zeros."""
        if self._store_bytes is None:
            size = self.store.size()
            if size > self._nblocks * self.block_size:
                size = self._nblocks * self.block_size
                self.store.truncate(size)
            self._store_bytes = size
        return self._store_bytes

    def _write_range(self, e, offset, data, length):
        """Write ``data`` (or zeros if None) at ``offset``; a partial block goes to the buffer."""
        bs = self.block_size
        pos, done, end = offset, 0, offset + length
        while pos < end:
            index, start = divmod(pos, bs)
            whole = (end - pos) // bs if start == 0 else 0  # full blocks from here on
            if data is None:
                whole = min(whole, HOLE_PIECE_BLOCKS)  # bounded bookkeeping per piece
            n = whole * bs if whole else min(bs - start, end - pos)
            if whole:
                buffered = self._buffers.get(id(e))
                if buffered is not None and index <= buffered[0] < index + whole:
                    del self._buffers[id(e)]  # about to be overwritten whole
                elif buffered is not None:
                    self._flush_buffer(id(e))  # one buffered block per file
                self._put_blocks(e, index, whole, None if data is None else data[done:done + n])
            else:
                buf = self._buffer_for(e, index)
                buf[start:start + n] = bytes(n) if data is None else data[done:done + n]
            pos += n
            done += n
            e.size = max(e.size, pos)

    def _buffer_for(self, e, index):
        """The entry's dirty block buffer, holding block ``index`` (loaded or zero-filled).

        Its container block is fresh from the start (a committed one is replaced
        now), so flushing it writes in place and never needs room.
        """
        buffered = self._buffers.get(id(e))
        if buffered is not None and buffered[0] == index:
            return buffered[1]
        if buffered is not None:
            self._flush_buffer(id(e))
        bs = self.block_size
        blocks = self._block_list(e)
        if index < len(blocks):
            buf = bytearray(self._read_block(e, index))
            valid = max(0, e.size - index * bs)  # bytes past EOF are stale: never expose them
            buf[valid:] = bytes(bs - valid) if valid < bs else b""
            if self._is_committed(blocks[index]):
                self._retire(blocks[index])
                blocks[index] = self._allocate()
        else:  # a new block: allocated now, as casacore's extend() does at write time
            blocks.append(self._allocate())
            buf = bytearray(bs)
        self._buffers[id(e)] = [index, buf, e]
        return buf

    def _read_block(self, e, index):
        b = e.blocks[index]
        data = self.store.pread(b * self.block_size, self.block_size).ljust(self.block_size, b"\0")
        if self.verify_crc and self.header.use_crc and crc.crc32_bzip2(data) != int(self._crcs[b]):
            raise self._block_error(e.name, index, f"(container block {b}) fails its CRC check")
        return data

    def _flush_buffer(self, key):
        index, buf, e = self._buffers.pop(key)
        self._put_blocks(e, index, 1, bytes(buf))

    def _flush_buffers(self):
        for key in list(self._buffers):
            self._flush_buffer(key)

    @staticmethod
    def _block_list(e):
        """``e.blocks`` as an appendable array (a loaded entry may hold a ``range``)."""
        if not isinstance(e.blocks, array):
            e.blocks = array("q", e.blocks)
        return e.blocks

    def _put_blocks(self, e, index, count, data=None):
        """Write ``count`` whole blocks of ``e`` from ``index`` on (zeros if ``data`` is None);
        committed blocks get fresh ones.

        Blocks appended to the container for zeros are not written at all: the
        file was grown with zeros (``_reserve``), so they only get the CRC of a
        zero block. Physically consecutive blocks go out in one pwrite; zeros
        in bounded pieces.
        """
        blocks = self._block_list(e)
        bs = self.block_size
        zeros_from = self._nblocks  # blocks appended from here on already read as zeros
        targets = []
        for i in range(index, index + count):
            if i == len(blocks):
                blocks.append(self._allocate())
            elif self._is_committed(blocks[i]):
                self._retire(blocks[i])
                blocks[i] = self._allocate()
            targets.append(blocks[i])
        view = None if data is None else memoryview(data)
        run = 0
        for k in range(1, count + 1):
            if k == count or targets[k] != targets[k - 1] + 1:
                if view is not None:
                    self.store.pwrite_bulk(targets[run] * bs, view[run * bs:k * bs])
                elif targets[run] < zeros_from:
                    self._write_zeros(targets[run], min(k - run, zeros_from - targets[run]))
                run = k
        if view is None and self.header.use_crc:
            zero_crc = _zero_block_crc(bs)
            for block in targets:
                self._crcs[block] = zero_crc
        for k, block in enumerate(targets):
            if view is not None and self.header.use_crc:
                self._crcs[block] = crc.crc32_bzip2(view[k * bs:(k + 1) * bs])
            self._verified.pop(block, None)
        self._dirty = True

    def _write_zeros(self, first, count):
        bs = self.block_size
        step = max(1, ZERO_CHUNK // bs)
        zeros = memoryview(bytes(min(count, step) * bs))
        for start in range(first, first + count, step):
            n = min(step, first + count - start)
            self.store.pwrite_bulk(start * bs, zeros[:n * bs])

    def _is_committed(self, block):
        return block < len(self._committed) and self._committed[block]

    def _retire(self, block):
        """A committed block replaced by a fresh one: free after the next commit."""
        self._pending_free.append(block)
        self._crcs_set(block, 0)
        self._verified.pop(block, None)

    def _crcs_set(self, block, value):
        if self.header.use_crc:
            self._crcs[block] = value

    def _allocate(self):
        """A block free in both the committed and the current state: lowest free, else a new one."""
        if self._free:
            return self._free.pop()
        block = self._nblocks
        self._nblocks += 1
        if self.header.use_crc and len(self._crcs) <= block:
            self._crcs = _grown(self._crcs, block + 1 + block // 4)
        return block

    def _release(self, blocks):
        for b in blocks:
            if self._is_committed(b):
                self._retire(b)
            else:
                bisect.insort(self._free, b, key=lambda x: -x)
                self._crcs_set(b, 0)
                self._verified.pop(b, None)

    def truncate(self, key, size):
        return self._guarded(self._truncate, key, size)

    def _truncate(self, key, size):
        e = self._entry(key)
        if size < 0:
            raise CtdsfsError(f"{self.label}: {e.name or '(unlinked file)'}: "
                              f"negative size {size}")
        if size > e.size:
            self._make_room(e, e.size, size)
            self._write_range(e, e.size, None, size - e.size)
        elif size < e.size:
            keep = -(-size // self.block_size)
            buffered = self._buffers.get(id(e))
            if buffered is not None and buffered[0] >= keep:
                del self._buffers[id(e)]
            blocks = self._block_list(e)
            self._release(blocks[keep:].tolist())
            del blocks[keep:]
            e.size = size
        self._dirty = True

    def remove(self, name, keep_open=False):
        """Delete ``name``; with ``keep_open`` its data lives on (unnamed) until ``release()``."""
        return self._guarded(self._remove, name, keep_open)

    def _remove(self, name, keep_open):
        e = self._entry(name)
        slots = self.header.entries
        slots[next(i for i, s in enumerate(slots) if s is e)] = Entry("", 0, array("q"))
        del self._entries[name]
        child = self._nested.pop(name, None)
        if child is not None:
            child._set_read_only(f"{child.label} was removed")
        e.name = ""
        self._orphans += keep_open
        if not keep_open:
            self._buffers.pop(id(e), None)
            self._release(list(e.blocks))
            e.blocks = array("q")
            e.size = 0
        self._dirty = True
        return e if keep_open else None

    def release(self, orphan):
        """Free the blocks of an unlinked file whose last user is gone."""
        def run():
            self._buffers.pop(id(orphan), None)
            self._orphans -= 1
            self._release(list(orphan.blocks))
            orphan.blocks = array("q")
            self._dirty = True
        return self._guarded(run)

    def rename(self, old, new):
        """Rename within this container; an existing ``new`` is replaced (rename(2))."""
        return self._guarded(self._rename, old, new)

    def _rename(self, old, new):
        self._rename_entry(old, new, lambda e, name: setattr(e, "name", name))
        self._dirty = True

    def _relabel(self, label, name):
        self.store.name = name
        self.store.label = label
        super()._relabel(label, name)

    def make_nested(self, name):
        """A new virtual file holding an empty nested MultiFile (a subdirectory)."""
        def run():
            if self.header.version != 2:
                raise CtdsfsError(f"{self.label}: MultiFile version 1 cannot nest containers")
            self._create(name).nested_flag = True  # unambiguous, and casacore keeps it
            child = MultiFile.new(VirtualFileStore(self, name), block_size=self.block_size,
                                     depth=self.depth + 1, lock=self._lock)
            child.verify_crc = self.verify_crc
            self._nested[name] = child
            return child
        return self._guarded(run)

    # ------------------------------------------------------------ committing

    def commit(self):
        """Make every change durable: children first, then data, continuation blocks, block 0."""
        with self._lock:
            if not self.writable or not self.dirty:
                return False
            try:
                for child in list(self._nested.values()):
                    if child is not None and child.dirty:
                        child.commit()
                if self._dirty:
                    self._commit_self()
            except (OSError, BlockError) as exc:
                self._fail(exc)
                raise
            return True

    def _commit_self(self):
        """Data (fsync), the header's continuation blocks (fsync), block 0 (fsync), then trim.

        Once block 0 is durable nothing needs a block the new state does not use,
        so the file is cut after the last one the new state uses; the new header
        is laid out within that (``_layout_header_v2``). Its room is reserved
        before anything is written: a full disk fails the commit with
        ContainerFull, the committed state and the writability intact. A header
        that found no low blocks free in both states stays dirty: the next commit
        lays it out in the blocks this one frees.
        """
        self._flush_buffers()  # buffered blocks are fresh already: no room needed
        self.store.fsync()
        self._check_not_changed_on_disk()
        h = self.header
        bs = self.block_size
        used = self._referenced_blocks()  # by the new state: committed once this returns

        def unused(b):
            return 0 < b < self._nblocks and not (b < len(used) and used[b]) \
                and not self._is_committed(b)

        old_sets = [[b for b in s if unused(b)] for s in h.cont_sets]
        held = set(old_sets[h.active_cont_set]) if h.header_size > bs else set()  # its chain
        free_now = set(self._free)  # free in both states
        unused_now = free_now.union(self._pending_free, *old_sets)
        nblocks = self._nblocks
        while nblocks > 1 and nblocks - 1 in unused_now:
            nblocks -= 1
        new = Header(version=h.version, block_size=bs, counter=h.counter + 1, nblocks=nblocks,
                     header_size=0, entries=h.entries, free_blocks=array("q"),
                     use_crc=h.use_crc, crcs=self._crcs[:0])
        if h.version == 1:
            new.free_blocks = array("q", sorted((b for b in unused_now if b < nblocks),
                                                reverse=True))
            raw, chain = encode_header_v1(new), []
        else:
            spare = sorted(free_now.union(*old_sets) - held)
            raw, chain = self._layout_header_v2(new, unused_now, spare, held)
        new.header_size = len(raw)
        # Appended past blocks that the old state held and this commit frees: the next
        # commit can lay the header out low and cut the file, so one is left to do.
        relayout = bool(self._pending_free) and nblocks < self._nblocks \
            and any(b >= self._nblocks for b in chain)
        self._reserve_blocks(new.nblocks, 1 + len(chain), "(header)")
        if h.version == 1:
            self._write_header_v1(raw)
        else:
            self._write_header_v2(raw, chain)
        # Committed: the new state is now the one to protect.
        self.header = new
        self._nblocks = new.nblocks
        if h.use_crc:
            self._crcs = _grown(array("I", new.crcs), new.nblocks)
        self._free = list(new.free_blocks)
        self._pending_free = []
        self._committed = used
        self._store_bytes = None
        self._store_end()  # cuts the blocks the new state does not use off the end
        self._dirty = relayout

    def _layout_header_v2(self, new, unused, spare, held):
        """Fill in ``new``'s block count, free list, CRCs and continuation sets; returns the
        encoded header and the continuation blocks of its chain, in order.

        As casacore, the chain goes to the set the committed header does not use,
        but that set is laid out afresh: in the lowest blocks free in both states
        (``spare``), else in new ones past the end. The committed header's set
        (``held``) stays reserved for the next commit only where it lies below the
        new end; everything else goes back to the free list or off the end.
        """
        bs = self.block_size
        base = new.nblocks
        target = 1 - self.header.active_cont_set
        body = encode_body_v2(new)
        chain = []
        while True:
            nblocks = max([base] + [b + 1 for b in chain])
            kept = sorted(b for b in held if b < nblocks)
            taken = set(chain).union(kept)
            sets = [kept, kept]
            sets[target] = chain
            new.nblocks = nblocks
            new.free_blocks = array("q", sorted((b for b in unused
                                                 if b < nblocks and b not in taken), reverse=True))
            new.cont_sets = tuple(array("q", s) for s in sets)
            new.cont_used = tuple(len(chain) if i == target else 0 for i in (0, 1))
            new.cont_first = chain[0] if chain else 0
            if new.use_crc:
                new.crcs = _grown(self._crcs, nblocks)[:nblocks]  # (a slice: a copy)
                for block in taken:
                    new.crcs[block] = 0  # continuation blocks have no CRC
            raw = encode_header_v2(new, body)
            needed = max(0, -(-(len(raw) - bs) // (bs - 8)))
            if needed <= len(chain):
                return raw, chain
            appended = range(self._nblocks, self._nblocks + max(0, needed - len(spare)))
            chain = spare[:needed] + list(appended)

    def _counter_on_disk(self):
        """The header counter as the file holds it now (offset 16 in both versions)."""
        lead = self.store.pread(16, 8)
        return int.from_bytes(lead, "big", signed=True) if len(lead) == 8 else None

    def _check_not_changed_on_disk(self):
        """Another writer must not have committed since we read the header."""
        if self.depth == 0 and self.header.counter:
            on_disk = self._counter_on_disk()
            if on_disk != self.header.counter:
                raise OSError(f"the container was changed by another writer "
                              f"(header counter {on_disk}, expected {self.header.counter})")

    def _write_header_v2(self, raw, chain):
        """casacore's writeHeader order: continuation pieces (fsync), then block 0 (fsync)."""
        bs = self.block_size
        pieces = [raw[i:i + bs - 8] for i in range(bs, len(raw), bs - 8)]
        for i, piece in enumerate(pieces):
            nxt = chain[i + 1] if i + 1 < len(pieces) else 0
            self.store.pwrite(chain[i] * bs,
                              (nxt.to_bytes(8, "big", signed=True) + piece).ljust(bs, b"\0"))
        if pieces:
            self.store.fsync()
        self.store.pwrite(0, raw[:bs].ljust(bs, b"\0"))
        self.store.fsync()

    def _write_header_v1(self, raw):
        """v1: the part past block 0 goes to ``<container>_hdrext`` (replaced atomically) first."""
        bs = self.block_size
        if len(raw) > bs:
            if self.hdrext_path is None:
                raise OSError("a version-1 header this large needs a _hdrext file")
            tmp = self.hdrext_path + ".ctdsfs-new"
            try:
                with os.fdopen(create_exclusive(tmp), "wb") as f:  # (never a planted link)
                    f.write(raw[bs:])
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ContainerFull(f"{self.label}: no space left on the disk for "
                                        f"{self.hdrext_path}") from None
                raise
            os.replace(tmp, self.hdrext_path)
        self.store.pwrite(0, raw[:bs].ljust(bs, b"\0"))
        self.store.fsync()

    # ------------------------------------------------------------ description

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        version = info["version"]
        lines = [f"{info['container']}: {info['format']} version {version}",
                 f"  block size       {info['block_size']}",
                 f"  blocks           {info['blocks']}",
                 f"  CRC              {'yes' if info['crc'] else 'no'}",
                 f"  header counter   {info['header_counter']}",
                 f"  header size      {info['header_size']} bytes"]
        if version == 1:
            lines.append(f"  _hdrext file     {'yes' if info['hdrext'] else 'no'}")
        else:
            cont = info["continuation"]
            lines.append(f"  continuation     active set {cont['active_set']}, first block "
                         f"{cont['first_block']}, used {cont['used'][0]}/{cont['used'][1]}")
            for i, blocks in enumerate(cont["sets"]):
                lines.append(f"    set {i}          {_block_list_text(blocks)}")
        lines.append(f"  free blocks      {_block_list_text(info['free_blocks'])}")
        lines.append(f"  files            {len(info['files'])}")
        width = max([len(str(f["size"])) for f in info["files"]] + [4])
        lines.append(f"    {'SIZE':>{width}}  {'BLOCKS':>6}  NAME")
        for f in info["files"]:
            suffix = "/  (nested container)" if f["nested"] else ""
            lines.append(f"    {f['size']:>{width}}  {f['blocks']:>6}  {f['name']}{suffix}")
        for problem in info["problems"]:
            lines.append(f"  problem: {problem}")
        return lines

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
            "free_blocks": [int(b) for b in h.free_blocks],
        }
        if h.version == 1:
            info["hdrext"] = h.has_hdrext
        else:
            info["continuation"] = {
                "active_set": h.active_cont_set,
                "first_block": h.cont_first,
                "sets": [[int(b) for b in s] for s in h.cont_sets],
                "used": list(h.cont_used),
            }
        info["files"] = [
            {"name": n, "size": e.size, "blocks": len(e.blocks),
             "nested": self.nested(n) is not None}
            for n, e in list(self._entries.items())
        ]
        info["problems"] = list(self.problems)
        return info

    def abandon(self):
        """Release the file of a top-level container (a nested one has none of its own),
        recording what the index learnt first."""
        if self.depth == 0:
            if self.index is not None:
                with self._lock:
                    self.index.save(self._index_records())
            self.store.close()

    def _index_records(self):
        """{index path: (header fingerprint, plain_bitmap)} of this container and every
        nested one opened, for ``NestedIndex.save``."""
        plain = [e.plain and self._may_be_nested(name, e) for name, e in self._entries.items()]
        records = {self.index_path: (self.header.fingerprint, plain_bitmap(plain))}
        for child in self._nested.values():
            if child is not None:
                records.update(child._index_records())
        return records


# ---------------------------------------------------------------- the registry's entry points

looks_like = looks_like_multifile


def open_file(path, *, verify_crc=True, writable=False):
    """The MultiFile at ``path`` (a version 1 header continues in ``PATH_hdrext``)."""
    store = open_store(path, writable=writable, lock=writable)
    try:
        index = None if writable else open_index(store.fd)
        return MultiFile(store, hdrext_path=path + "_hdrext", verify_crc=verify_crc,
                         writable=writable, index=index)
    except BaseException:
        store.close()
        raise


def open_from_store(store, *, verify_crc=True):
    """The MultiFile in a read-only ``store`` (a remote object; a version 1 header continues
    in the object named like it plus ``_hdrext``)."""
    return MultiFile(store, hdrext_path=store.sibling("_hdrext"), verify_crc=verify_crc)


def create_file(path, *, variant, block_size, use_crc):
    """A new, empty MultiFile of version 2 (``variant`` mf2) or 1 (mf1) at ``path``."""
    store = open_store(path, writable=True, create=True, lock=True)
    try:
        return MultiFile.new(store, block_size=block_size, use_crc=use_crc,
                             version=1 if variant == "mf1" else 2, hdrext_path=path + "_hdrext")
    except BaseException:
        store.close()
        os.unlink(path)
        raise


def _block_list_text(blocks):
    """A block list for ``ctdsfs info``: the count and the first 20."""
    if not blocks:
        return "none"
    shown = ", ".join(map(str, blocks[:20]))
    return f"{len(blocks)}: [{shown}{', ...' if len(blocks) > 20 else ''}]"
