"""Committing a MultiFile: data, then the inactive continuation set, then block 0, with
fsync between, so a crash at any moment leaves the last committed state or the new one.
Part of ``multifile.MultiFile``, which mixes it in."""

import errno
import os
from array import array

from ...errors import BlockError, ContainerFull
from ...io.store import create_exclusive
from .blocks import zero_padded
from .header import Header, encode_body_v2, encode_header_v1, encode_header_v2


class MultiFileCommitting:
    """Making a MultiFile's changes durable (commit) and its header's layout."""

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
            self._crcs = zero_padded(array("I", new.crcs), new.nblocks)
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
                new.crcs = zero_padded(self._crcs, nblocks)[:nblocks]  # (a slice: a copy)
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
