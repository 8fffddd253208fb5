"""The casacore MultiFile container: reads, copy-on-write writes, crash-safe commits.

The container is one class, ``MultiFile``, made of parts: loading and validating
the header (here), reading (``multifile_read``), copy-on-write writing
(``multifile_write``) and committing (``multifile_commit``); the header codec is
``multifile_header``, the index of plain files ``multifile_index``.

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

import logging
import os
import threading
from array import array
from collections import OrderedDict

from ...container import MAX_NESTING, Container, name_problem
from ...errors import BlockError, CtdsfsError, FormatError
from ...io.store import VirtualFileStore, open_store
from ...remote.wire import RemoteError
from .blocks import entry_block_runs, zero_padded
from .commit import MultiFileCommitting
from .header import FIXED_V2, PLAIN, Header, looks_like_multifile, looks_like_v2, read_header
from .index import open_index, plain_bitmap
from .read import MultiFileReading
from .shared_index import file_key, flags_of
from .write import MultiFileWriting

log = logging.getLogger(__name__)

VERIFIED_CACHE_BYTES = 32 << 20


class MultiFile(MultiFileReading, MultiFileWriting, MultiFileCommitting, Container):
    """One MultiFile (top-level or nested); nested ones are reached through ``nested()``."""

    format_name = "MultiFile"
    kernel_write_cache = True  # committed on flush/fsync, after the kernel sent its pages
    atomic_commits = True  # copy-on-write, committed by one header write

    @property
    def checks_reads(self):
        return self.verify_crc and self.header.use_crc

    def __init__(self, store, *, hdrext_path=None, verify_crc=True, writable=False, depth=0,
                 lock=None, header=None, index=None, index_path="", shared_base=None):
        self.store = store
        # A persistent index of plain files (read-only trees): multifile_index.NestedIndex,
        # in which this container's record is ``index_path``.
        self.index = index
        self.index_path = index_path
        # What this container's key in the table of plain files shared by a mount's
        # processes starts with (shared_index), or None: nothing shared.
        self._shared_base = shared_base
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
            self._crcs = zero_padded(self._crcs, self._nblocks)
        self._buffers = {}  # id(entry) -> [block index, bytearray, entry]: a dirty partial block
        self._nested = {}
        # Names shown as files for another reason than their first bytes (a bad block, a
        # nested container that failed to open): the index never records them as plain.
        self._unsure = set()
        if self.index is not None:
            for name in self.index.plain_names(self.index_path, header.fingerprint,
                                               list(self._entries)):
                self._entries[name]._flags |= PLAIN  # (e.plain = True, without a call)
        self._shared_key = self._shared = None
        self._positions = {}  # name -> its place in the header, while shared
        if self._shared_base is not None and not self.writable:
            self._shared_key = f"{self._shared_base}|{header.fingerprint}"
            self._shared = flags_of(self._shared_key, len(self._entries))
        if self._shared is not None:
            self._positions = {name: i for i, name in enumerate(self._entries)}
        self._dirty = False
        self._verified = OrderedDict()  # block number -> bytes already CRC-checked
        self._verified_max = max(4, VERIFIED_CACHE_BYTES // self.block_size)
        self._store_bytes = None  # the container file's size, once the write path needs it

    def _referenced_blocks(self, runs=None):
        """A bitmap (a byte per block) of the blocks that the visible entries (as they are
        now) use, or that ``runs`` (their ``block_runs``) cover; validated: all within
        the container."""
        if runs is None:
            runs = entry_block_runs(self._entries.values())
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
            if self._shared_base is not None:
                self._shared_base = file_key(self.store.fd)
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
        runs = entry_block_runs(e for _, e in holding)
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

    # ------------------------------------------------------------ nested containers

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
                              index=self.index, index_path=f"{self.index_path}/{name}",
                              shared_base=self._shared_key and
                              f"{self._shared_key}/{len(name)}:{name}")
            self._unsure.discard(name)
            return child
        except RemoteError:
            self._unsure.discard(name)
            raise
        except (FormatError, BlockError) as exc:
            self._problem(f"{name!r} shown as a file: looks nested but {exc}")
            return None

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
                         writable=writable, index=index,
                         shared_base=None if writable else file_key(store.fd))
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
