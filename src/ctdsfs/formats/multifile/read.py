"""Reading a MultiFile: located, CRC-checked block runs, and nested containers told
apart in a listing. Part of ``multifile.MultiFile``, which mixes it in."""

from ...container import Usage
from ...errors import BlockError
from ...io import crc
from .blocks import block_spans
from .header import FIXED_V2, PLAIN, index_runs

# A virtual file named like a container file is one the user stored (a copied
# table.mf), not a subtable: casacore names nested containers after tables.
CONTAINER_FILE_SUFFIXES = (".mf", ".mfh5")
# Telling nested containers in a listing: first bytes of files at most GATHER_GAP apart
# are read together, in pieces of at most GATHER_SPAN.
GATHER_GAP = 64 << 10
GATHER_SPAN = 1 << 20


class MultiFileReading:
    """What a reader of a MultiFile calls (names, sizes, reads, nested containers)."""

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
        for index, at, want in block_spans(blocks, first, bs, offset, end):
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
                   for _, at, want in block_spans(blocks, first, self.block_size, offset, end))

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
            if not e.plain and name not in self._nested and not self._found_plain([name]):
                self._classified(name, e, self._open_nested(name))
            return None if e.plain else self._nested[name]

    def classify(self, names):
        with self._lock:
            entries, nested = self._entries, self._nested
            # (the plain bit read directly: a listing asks for every name, more than once)
            unknown = [name for name in names
                       if name not in nested and not entries[name]._flags & PLAIN]
            if unknown and self._shared is not None:
                found = self._found_plain(unknown)
                unknown = [name for name in unknown if name not in found]
            for name, first in self._first_bytes(unknown).items():
                self._classified(name, entries[name], self._open_nested(name, first))
            return [None if entries[name]._flags & PLAIN else nested[name] if name in nested
                    else self.nested(name) for name in names]

    def _classified(self, name, e, child):
        """Keep what ``name`` holds: a plain file is marked on its entry (the index records
        those) and for the mount's other processes, a nested container (or None for a file
        shown plain for another reason) goes in ``_nested``."""
        if child is None and name not in self._unsure:
            e.plain = True
            if name in self._positions:
                self._shared.mark_plain(self._positions[name])
        else:
            self._nested[name] = child

    def _found_plain(self, names):
        """Those of ``names`` that another process of the mount found plain, marked so
        here too (shared_index)."""
        shared, positions, entries = self._shared, self._positions, self._entries
        if shared is None:
            return set()
        found = {name for name in names if name in positions
                 and shared.plain(positions[name])}
        for name in found:
            entries[name]._flags |= PLAIN
        return found

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
