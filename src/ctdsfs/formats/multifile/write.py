"""Copy-on-write changes to a MultiFile: a block the committed header references is never
overwritten, and the room a change needs is reserved before anything changes (see the
rules in multifile.py). Part of ``multifile.MultiFile``, which mixes it in."""

import bisect
import errno
import logging
from array import array

from ...errors import BlockError, ContainerFull, CtdsfsError, ReadOnlyError, TooLarge
from ...io import crc
from .blocks import ZERO_CHUNK, zero_block_crc, zero_padded
from .header import Entry

log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1  # casacore keeps sizes and offsets in Int64
HOLE_PIECE_BLOCKS = 1 << 16  # a hole is filled this many blocks at a time
GROW_AHEAD = 64 << 20  # how far past the last block a growing container file is allocated


class MultiFileWriting:
    """What a writer of a MultiFile calls (create, write, truncate, remove, rename)."""

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
            zero_crc = zero_block_crc(bs)
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
            self._crcs = zero_padded(self._crcs, block + 1 + block // 4)
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
