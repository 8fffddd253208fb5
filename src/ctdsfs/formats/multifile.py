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
"""

import bisect
import logging
import os
import threading
from array import array
from collections import OrderedDict

import numpy as np

from ..container import Container, Usage, name_problem
from ..errors import BlockError, CtdsfsError, FormatError, ReadOnlyError
from .crc import crc32_bzip2
from .multifile_header import (FIXED_V2, Entry, Header, encode_body_v2, encode_header_v1,
                               encode_header_v2, looks_like_v2, read_header)
from .store import VirtualFileStore

log = logging.getLogger(__name__)

MAX_NESTING = 32
# A virtual file named like a container file is one the user stored (a copied
# table.mf), not a subtable: casacore names nested containers after tables.
CONTAINER_FILE_SUFFIXES = (".mf", ".mfh5")
VERIFIED_CACHE_BYTES = 32 << 20


def _grown(values, length):
    """``values`` zero-padded to at least ``length`` items."""
    if len(values) >= length:
        return values
    return np.concatenate([values, np.zeros(length - len(values), values.dtype)])


class MultiFile(Container):
    """One MultiFile (top-level or nested); nested ones are reached through ``nested()``."""

    format_name = "MultiFile"
    kernel_write_cache = True  # committed on flush/fsync, after the kernel sent its pages

    @property
    def checks_reads(self):
        return self.verify_crc and self.header.use_crc

    def __init__(self, store, *, hdrext_path=None, verify_crc=True, writable=False, depth=0,
                 lock=None, header=None):
        self.store = store
        self.label = store.label
        self.hdrext_path = hdrext_path
        self.verify_crc = verify_crc
        self.writable = writable
        self.depth = depth
        self.failure = None  # why writing was switched off, if it was
        self._lock = lock or threading.RLock()  # one lock for a whole tree of containers
        self._load(header or read_header(store, hdrext_path, verify_crc))

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
                        header_size=0, entries=[], free_blocks=np.zeros(0, np.int64),
                        use_crc=use_crc, crcs=np.zeros(1 if use_crc else 0, np.uint32))
        container = cls(store, hdrext_path=hdrext_path, writable=True, depth=depth, lock=lock,
                        header=header)
        container._dirty = True
        container.commit()
        return container

    # ------------------------------------------------------------ state

    def _load(self, header):
        self.header = header
        self.block_size = header.block_size
        self.problems = []
        self._entries = self._validate()
        self._orphans = 0  # unlinked files still open: their blocks are in no header list
        if self.writable and self.problems:
            raise FormatError(f"{self.label}: damaged entries ({self.problems[0]}); "
                              "mount it read-only")
        self._free = sorted(header.free_blocks.tolist(), reverse=True)  # allocatable now
        self._pending_free = []  # freed since the last commit, still in the committed state
        self._nblocks = header.nblocks
        self._crcs = np.array(header.crcs, dtype=np.uint32)
        if header.use_crc:
            self._crcs = _grown(self._crcs, self._nblocks)
        self._committed = self._referenced_blocks()
        self._buffers = {}  # id(entry) -> [block index, bytearray, entry]: a dirty partial block
        self._nested = {}
        self._dirty = False
        self._verified = OrderedDict()  # block number -> bytes already CRC-checked
        self._verified_max = max(4, VERIFIED_CACHE_BYTES // self.block_size)

    def _referenced_blocks(self):
        """A bitmap of the blocks that the visible entries (as they are now) use."""
        lists = [np.asarray(e.blocks, dtype=np.int64) for e in self._entries.values()
                 if len(e.blocks)]
        if not lists:
            return np.zeros(0, bool)
        blocks = np.concatenate(lists)  # validated: all within the container
        used = np.zeros(int(blocks.max()) + 1, bool)
        used[blocks] = True
        return used

    def reload_if_changed(self):
        """Re-read the header if another process committed since (its counter moved on).

        Only a top-level container with nothing pending reloads; with local
        changes the next commit detects the conflict instead. True if reloaded.
        """
        with self._lock:
            if self.depth or self._counter_on_disk() == self.header.counter or self.dirty \
                    or self._orphans:
                return False
            header = read_header(self.store, self.hdrext_path, self.verify_crc)
            log.info("%s: changed by another process (header counter %d -> %d): reloaded",
                     self.label, self.header.counter, header.counter)
            for child in self._nested.values():
                if child is not None:
                    child._set_read_only(f"{child.label} was reloaded")
            try:
                self._load(header)
            except FormatError as exc:  # damaged by the other writer: keep serving, read-only
                self._set_read_only(str(exc))
            return True

    @property
    def dirty(self):
        return self._dirty or any(c is not None and c.dirty for c in self._nested.values())

    # ------------------------------------------------------------ validation

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
        for slot, name, why in self._bad_blocks(candidates.values(), limit):
            hidden[slot] = (name, why)
            del candidates[name]
        for slot in sorted(hidden):
            name, why = hidden[slot]
            h.entries[slot].problem = h.entries[slot].problem or why
            self._problem(f"entry {slot} {name!r} hidden: {why}")
        return {name: e for name, (_, e) in candidates.items()}

    @staticmethod
    def _bad_blocks(candidates, limit):
        """(slot, name, reason) of entries with a block outside ``1 .. limit-1``, or one that
        an earlier entry (or the entry itself) already uses; all entries in one pass."""
        candidates = [(slot, e) for slot, e in candidates if len(e.blocks)]
        if not candidates:
            return []
        lengths = [len(e.blocks) for _, e in candidates]
        blocks = np.concatenate([e.blocks for _, e in candidates])
        owner = np.repeat(np.arange(len(candidates)), lengths)
        outside = (blocks < 1) | (blocks >= limit)
        bad = {i: "block number outside the container" for i in np.unique(owner[outside]).tolist()}
        inside = ~outside & ~np.isin(owner, list(bad))
        blocks, owner = blocks[inside], owner[inside]
        order = np.argsort(blocks, kind="stable")
        repeated = blocks[order][1:] == blocks[order][:-1]
        for i in np.unique(owner[order[1:][repeated]]).tolist():
            bad[i] = "uses a block that an earlier entry (or itself) uses"
        return [(candidates[i][0], candidates[i][1].name, why) for i, why in sorted(bad.items())]

    # ------------------------------------------------------------ reading

    def names(self):
        with self._lock:
            return list(self._entries)

    def entry_size(self, key):
        return self._entry(key).size

    def entry_blocks(self, key):
        return len(self._entry(key).blocks)

    def usage(self):
        return Usage(self.block_size, self._nblocks, len(self._free) + len(self._pending_free))

    def read(self, key, offset, size):
        with self._lock:
            e = self._entry(key)
            if id(e) in self._buffers:
                self._flush_buffer(id(e))
            end = min(offset + size, e.size)
            if offset >= end:
                return b""
            bs = self.block_size
            first, last = offset // bs, (end - 1) // bs
            blocks = e.blocks[first:last + 1].tolist()
        name = e.name or "(unlinked file)"
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
        """The error for one unreadable block; the reader logs it (a mount once per block)."""
        detail = f"block {index} {why}"
        return BlockError(f"{self.label}: {name}: {detail}", detail)

    def _read_verified(self, name, first, blocks):
        """Whole blocks, each checked against its stored CRC before any byte is returned.

        Runs of consecutive blocks are read with one pread; single blocks go
        through a small cache, since FUSE reads touch the same block repeatedly.
        """
        parts = []
        i = 0
        while i < len(blocks):
            j = i
            while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
                j += 1
            if i == j:
                parts.append(self._verified_block(name, first + i, blocks[i]))
            else:
                parts.append(self._verified_run(name, first + i, blocks[i:j + 1]))
            i = j + 1
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
        if crc32_bzip2(data) != expected:
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

    def _open_nested(self, name):
        e = self._entry(name)
        if e.size < FIXED_V2.size:
            return None
        if name.endswith(CONTAINER_FILE_SUFFIXES) and not e.nested_flag:
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
                             writable=self.writable, depth=self.depth + 1, lock=self._lock)
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
        self._check_new_name(name)
        if name in self._entries:
            raise FileExistsError(name)
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
        if offset > e.size:
            self._write_range(e, e.size, None, offset - e.size)  # the hole reads as zeros
        self._write_range(e, offset, memoryview(data).cast("B"), len(data))
        self._dirty = True
        return len(data)

    def _write_range(self, e, offset, data, length):
        """Write ``data`` (or zeros if None) at ``offset``; a partial block goes to the buffer."""
        bs = self.block_size
        pos, done, end = offset, 0, offset + length
        while pos < end:
            index, start = divmod(pos, bs)
            whole = (end - pos) // bs if start == 0 else 0  # full blocks from here on
            n = whole * bs if whole else min(bs - start, end - pos)
            piece = bytes(n) if data is None else data[done:done + n]
            if whole:
                buffered = self._buffers.get(id(e))
                if buffered is not None and index <= buffered[0] < index + whole:
                    del self._buffers[id(e)]  # about to be overwritten whole
                elif buffered is not None:
                    self._flush_buffer(id(e))  # one buffered block per file
                self._put_blocks(e, index, piece)
            else:
                buf = self._buffer_for(e, index)
                buf[start:start + n] = piece
            pos += n
            done += n
            e.size = max(e.size, pos)

    def _buffer_for(self, e, index):
        """The entry's dirty block buffer, holding block ``index`` (loaded or zero-filled)."""
        buffered = self._buffers.get(id(e))
        if buffered is not None and buffered[0] == index:
            return buffered[1]
        if buffered is not None:
            self._flush_buffer(id(e))
        bs = self.block_size
        if index < len(e.blocks):
            buf = bytearray(self._read_block(e, index))
            valid = max(0, e.size - index * bs)  # bytes past EOF are stale: never expose them
            buf[valid:] = bytes(bs - valid) if valid < bs else b""
        else:  # a new block: allocated now, as casacore's extend() does at write time
            if not isinstance(e.blocks, array):
                e.blocks = array("q", e.blocks.tolist())
            e.blocks.append(self._allocate())
            buf = bytearray(bs)
        self._buffers[id(e)] = [index, buf, e]
        return buf

    def _read_block(self, e, index):
        b = e.blocks[index]
        data = self.store.pread(b * self.block_size, self.block_size).ljust(self.block_size, b"\0")
        if self.verify_crc and self.header.use_crc and crc32_bzip2(data) != int(self._crcs[b]):
            raise self._block_error(e.name, index, f"(container block {b}) fails its CRC check")
        return data

    def _flush_buffer(self, key):
        index, buf, e = self._buffers.pop(key)
        self._put_blocks(e, index, bytes(buf))

    def _flush_buffers(self):
        for key in list(self._buffers):
            self._flush_buffer(key)

    def _put_blocks(self, e, index, data):
        """Write whole blocks of ``e`` from ``index`` on; committed blocks get fresh ones.

        Physically consecutive blocks go out in one pwrite.
        """
        if not isinstance(e.blocks, array):
            e.blocks = array("q", e.blocks.tolist())
        bs = self.block_size
        count = len(data) // bs
        targets = []
        for i in range(index, index + count):
            if i == len(e.blocks):
                e.blocks.append(self._allocate())
            elif self._is_committed(e.blocks[i]):
                self._pending_free.append(e.blocks[i])
                self._crcs_set(e.blocks[i], 0)
                e.blocks[i] = self._allocate()
            targets.append(e.blocks[i])
        view = memoryview(data)
        run = 0
        for k in range(1, count + 1):
            if k == count or targets[k] != targets[k - 1] + 1:
                self.store.pwrite_bulk(targets[run] * bs, view[run * bs:k * bs])
                run = k
        for k, block in enumerate(targets):
            if self.header.use_crc:
                self._crcs[block] = crc32_bzip2(view[k * bs:(k + 1) * bs])
            self._verified.pop(block, None)
        self._dirty = True

    def _is_committed(self, block):
        return block < len(self._committed) and self._committed[block]

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
                self._pending_free.append(b)
            else:
                bisect.insort(self._free, b, key=lambda x: -x)
            self._crcs_set(b, 0)
            self._verified.pop(b, None)

    def truncate(self, key, size):
        return self._guarded(self._truncate, key, size)

    def _truncate(self, key, size):
        e = self._entry(key)
        if size > e.size:
            self._write_range(e, e.size, None, size - e.size)
        elif size < e.size:
            keep = -(-size // self.block_size)
            buffered = self._buffers.get(id(e))
            if buffered is not None and buffered[0] >= keep:
                del self._buffers[id(e)]
            if not isinstance(e.blocks, array):
                e.blocks = array("q", e.blocks.tolist())
            self._release(e.blocks[keep:].tolist())
            del e.blocks[keep:]
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
            self._release(e.blocks.tolist())
            e.blocks = array("q")
            e.size = 0
        self._dirty = True
        return e if keep_open else None

    def release(self, orphan):
        """Free the blocks of an unlinked file whose last user is gone."""
        def run():
            self._buffers.pop(id(orphan), None)
            self._orphans -= 1
            self._release(orphan.blocks.tolist())
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
        self._flush_buffers()
        self.store.fsync()
        self._check_not_changed_on_disk()
        bs = self.block_size
        free = sorted(self._free + self._pending_free, reverse=True)
        # Blocks free in the committed state too may be cut off the end of the file.
        trimmed = 0
        allocatable = set(self._free)
        while self._nblocks - trimmed - 1 in allocatable:
            trimmed += 1
        nblocks = self._nblocks - trimmed
        free = [b for b in free if b < nblocks]
        h = self.header
        new = Header(version=h.version, block_size=bs, counter=h.counter + 1, nblocks=nblocks,
                     header_size=0, entries=h.entries, free_blocks=np.array(free, np.int64),
                     use_crc=h.use_crc, crcs=self._crcs[:nblocks] if h.use_crc else self._crcs[:0],
                     cont_first=h.cont_first,  # tells which set is active until re-laid out
                     cont_sets=tuple(np.array(s, np.int64) for s in h.cont_sets),
                     cont_used=tuple(h.cont_used))
        if h.version == 1:
            self._write_header_v1(new)
        else:
            self._write_header_v2(new)
        # Committed: the new state is now the one to protect.
        self.header = new
        self._nblocks = new.nblocks
        if h.use_crc:
            self._crcs = _grown(self._crcs, new.nblocks)
        self._free = free
        self._pending_free = []
        self._committed = self._referenced_blocks()
        if trimmed and new.nblocks * bs < self.store.size():
            self.store.truncate(new.nblocks * bs)
        self._dirty = False

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

    def _write_header_v2(self, h):
        """casacore's writeHeader: continuation pieces in the inactive set, then block 0."""
        bs = self.block_size
        active = h.active_cont_set
        sets = [np.asarray(s).tolist() for s in h.cont_sets]
        used = list(h.cont_used)
        used[active] = 0
        h.cont_sets, h.cont_used, h.cont_first = tuple(map(np.array, sets)), tuple(used), 0
        body = encode_body_v2(h)
        raw = encode_header_v2(h, body)
        if len(raw) > bs:
            target = 1 - active
            while True:
                used[target] = len(sets[target])
                h.cont_sets = tuple(np.array(s, np.int64) for s in sets)
                h.cont_used = tuple(used)
                h.cont_first = sets[target][0] if sets[target] else 0
                if h.use_crc:
                    h.crcs = _grown(h.crcs, h.nblocks)[:h.nblocks]  # continuation blocks: CRC 0
                raw = encode_header_v2(h, body)
                needed = -(-(len(raw) - bs) // (bs - 8))
                if needed <= len(sets[target]):
                    break
                # New continuation blocks come from the end, never from the free list.
                for _ in range(needed - len(sets[target])):
                    sets[target].append(h.nblocks)
                    h.nblocks += 1
            blocks = sets[target]
            pieces = [raw[i:i + bs - 8] for i in range(bs, len(raw), bs - 8)]
            for i, piece in enumerate(pieces):
                nxt = blocks[i + 1] if i + 1 < len(pieces) else 0
                self.store.pwrite(blocks[i] * bs,
                                  (nxt.to_bytes(8, "big", signed=True) + piece).ljust(bs, b"\0"))
            self.store.fsync()
        h.header_size = len(raw)
        self.store.pwrite(0, raw[:bs].ljust(bs, b"\0"))
        self.store.fsync()

    def _write_header_v1(self, h):
        """v1: the part past block 0 goes to ``<container>_hdrext`` (replaced atomically) first."""
        bs = self.block_size
        raw = encode_header_v1(h)
        h.header_size = len(raw)
        if len(raw) > bs:
            if self.hdrext_path is None:
                raise OSError("a version-1 header this large needs a _hdrext file")
            tmp = self.hdrext_path + ".ctdsfs-new"
            with open(tmp, "wb") as f:
                f.write(raw[bs:])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.hdrext_path)
        self.store.pwrite(0, raw[:bs].ljust(bs, b"\0"))
        self.store.fsync()

    # ------------------------------------------------------------ description

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
            "free_blocks": np.asarray(h.free_blocks).tolist(),
        }
        if h.version == 1:
            info["hdrext"] = h.has_hdrext
        else:
            info["continuation"] = {
                "active_set": h.active_cont_set,
                "first_block": h.cont_first,
                "sets": [np.asarray(s).tolist() for s in h.cont_sets],
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
        """Release the file of a top-level container (a nested one has none of its own)."""
        if self.depth == 0:
            self.store.close()
