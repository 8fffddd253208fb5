"""``ctdsfs check``: every structural fault of a container, with its location.

A reader hides what it cannot serve; this looks for everything: the header
CRC, every block CRC, blocks outside the container or used twice (by files,
the free list or the continuation sets), sizes that do not match block
counts, a file shorter than its block count, and nested containers, in turn.
Blocks that belong to nothing (left by a crash between an unlink and a
commit, or casacore's stale continuation blocks) are reported as notes: they
waste space but harm nothing.

A MultiHDF5 has no block numbers or CRCs: there the check is that HDF5 can
read every stored row each file needs, and that every group is one the header
lists; entries hidden as escapes (external storage or links, virtual datasets,
filters) or as repeated HDF5 objects are problems.
"""

from collections import Counter
from contextlib import nullcontext

import numpy as np

from ..container import Container
from ..errors import CtdsfsError
from ..io import crc
from .multifile.container import MultiFile
from .multifile.header import assemble_v2

RUN_BYTES = 16 << 20  # bytes of one read while checking (glibc reuses, not maps, buffers this size)


def check_multifile(container, location=None, bar=None):
    """(problems, notes) for a MultiFile tree, each a 'location: text' line."""
    where = location or container.label
    problems, notes = [], []
    h = container.header
    bs = h.block_size
    # Opening the nested containers first adds their failures to container.problems.
    children = {n: container.nested(n) for n in container.names()}
    problems += [f"{where}: {p}" for p in container.problems]
    if h.version == 2 and h.use_crc:
        computed = crc.crc32_bzip2(_logical_header(container))
        if computed != h.header_crc:
            problems.append(f"{where}: header CRC mismatch (stored 0x{h.header_crc:08x}, "
                            f"computed 0x{computed:08x})")
    physical = container.store.size()
    # (A claim of more blocks than the file holds is among the container's problems.)
    if physical < h.nblocks * bs and container.nblocks == h.nblocks:
        problems.append(f"{where}: file has {physical} bytes, its {h.nblocks} blocks need "
                        f"{h.nblocks * bs}")
    owners = Counter()
    for name in container.names():
        e = container._entry(name)
        needed = -(-e.size // bs)
        if len(e.blocks) != needed:
            problems.append(f"{where}/{name}: holds {len(e.blocks)} blocks, its {e.size} "
                            f"bytes need {needed}")
        owners.update(e.blocks)
    free = [int(b) for b in h.free_blocks]
    cont = [int(b) for s in h.cont_sets for b in s]
    nblocks = container.nblocks  # bounded by the file (the header's claim is a problem above)
    for label, blocks in (("free list", free), ("continuation sets", cont)):
        for b, n in Counter(blocks).items():
            if n > 1:
                problems.append(f"{where}: block {b} appears {n} times in the {label}")
            if not 0 < b < nblocks:
                problems.append(f"{where}: {label} block {b} is outside the container")
            if b in owners:
                problems.append(f"{where}: block {b} is in the {label} and used by a file")
    for b in set(free) & set(cont):
        problems.append(f"{where}: block {b} is both free and a continuation block")
    belongs = np.zeros(nblocks, bool)
    belongs[:1] = True  # block 0: the header
    for blocks in (list(owners), free, cont):
        blocks = np.asarray(blocks, np.int64)
        belongs[blocks[(blocks >= 0) & (blocks < nblocks)]] = True
    unused = np.flatnonzero(~belongs)
    if len(unused):
        notes.append(f"{where}: {len(unused)} blocks belong to nothing "
                     f"(first: {unused[:10].tolist()})")
    if h.use_crc:
        owned = {name: container._entry(name).blocks for name in container.names()}
        for name, blocks in owned.items():
            for index, b in enumerate(blocks):
                if b >= len(h.crcs):
                    problems.append(f"{where}/{name}: block {index} (container block {b}) "
                                    "has no CRC")
        everything = np.concatenate([np.asarray(b, np.int64) for b in owned.values()] or
                                    [np.zeros(0, np.int64)])
        bad = bad_crc_blocks(container, everything, bar)
        if bad:
            for name, blocks in owned.items():
                for index in np.flatnonzero(np.isin(np.asarray(blocks, np.int64), bad)):
                    problems.append(f"{where}/{name}: block {index} (container block "
                                    f"{blocks[index]}) fails its CRC check")
    for name, child in children.items():
        if child is not None:
            more_problems, more_notes = check_multifile(child, f"{where}/{name}", bar)
            problems += more_problems
            notes += more_notes
    return problems, notes


def progress_for(progress, total):
    """``progress(total)``, or no bar (None) when there is no factory or nothing to do."""
    return progress(total) if progress and total else nullcontext()


def bad_crc_blocks(container, blocks, bar=None):
    """Which of ``blocks`` (of a MultiFile with CRCs) fail their stored CRC.

    Consecutive blocks are read in one pread of up to RUN_BYTES, so a check
    runs at disk speed rather than one system call per block.
    """
    h = container.header
    bs = h.block_size
    blocks = np.unique(np.asarray(blocks, np.int64))
    blocks = blocks[(blocks > 0) & (blocks < min(len(h.crcs), h.nblocks))]
    per_run = max(1, RUN_BYTES // bs)
    bad = []
    for run in np.split(blocks, np.flatnonzero(np.diff(blocks) != 1) + 1):
        for first in range(0, len(run), per_run):
            start, count = int(run[first]), len(run[first:first + per_run])
            data = memoryview(container.store.pread(start * bs, count * bs))
            for k in range(count):
                piece = data[k * bs:(k + 1) * bs]
                if len(piece) == bs and crc.crc32_bzip2(piece) != h.crcs[start + k]:
                    bad.append(start + k)
            if bar is not None:
                bar.update(len(data))
    return bad


def check_multihdf5(container, location=None, bar=None):
    """(problems, notes) for a MultiHDF5 tree: unreadable data, unlisted groups."""
    from .multihdf5.container import HDF5_ERRORS, HEADER

    where = location or container.label
    children = {n: container.nested(n) for n in container.names()}
    problems = [f"{where}: {p}" for p in container.problems]
    notes = []
    listed = {f.link for f in container._entries.values()}
    try:
        unlisted = sorted(k for k in container.group if k != HEADER and k not in listed
                          and k != "FileData")
    except HDF5_ERRORS as exc:
        problems.append(f"{where}: its group cannot be listed ({exc})")
        unlisted = []
    if unlisted:
        notes.append(f"{where}: {len(unlisted)} groups no header entry lists "
                     f"(first: {unlisted[:10]})")
    step = max(1, RUN_BYTES // container.block_size) * container.block_size
    for name, child in children.items():
        if child is not None:
            more_problems, more_notes = check_multihdf5(child, f"{where}/{name}", bar)
            problems += more_problems
            notes += more_notes
            continue
        try:
            spans = container.stored_spans(name)
        except HDF5_ERRORS as exc:
            problems.append(f"{where}/{name}: its chunk index cannot be read ({exc})")
            continue
        _check_stored_rows(container, name, spans, step, f"{where}/{name}", problems, bar)
    return problems, notes


def _check_stored_rows(container, name, spans, step, where, problems, bar):
    """Read every stored row of a file (rows never written read as zeros: nothing to check),
    so the work follows what the file holds, not the size its header claims."""
    bs, end = container.block_size, container.entry_size(name)
    runs = []  # [start, stop) byte ranges of stored rows, touching ones merged
    for first, rows, _, _ in sorted(spans):
        start, stop = first * bs, min((first + rows) * bs, end)
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], stop)
        elif start < stop:
            runs.append([start, stop])
    for start, stop in runs:
        for offset in range(start, stop, step):
            try:
                data = container.read(name, offset, min(step, stop - offset))
                if bar is not None:
                    bar.update(len(data))
            except CtdsfsError as exc:  # the container names the unreadable blocks
                problems.append(f"{where}: bytes from {offset} unreadable: {exc}")
                return


def _logical_header(container):
    """The header bytes the CRC covers: as stored, with the CRC field zeroed."""
    h = container.header
    store = container.store
    raw = bytearray(assemble_v2(store, store.size(), h.block_size, h.header_size, h.cont_first))
    raw[28:32] = bytes(4)
    return bytes(raw)


def work_bytes(container):
    """How many bytes a check reads: CRC-checked blocks, or a MultiHDF5's file data."""
    total = 0
    for name in container.names():
        child = container.nested(name)
        if child is not None:
            total += work_bytes(child)
        if isinstance(container, MultiFile):
            if container.header.use_crc:
                total += container.entry_blocks(name) * container.block_size
        elif child is None:
            try:
                total += container.entry_size(name)
            except CtdsfsError:  # a size that cannot be worked out: the check says why
                pass
    return total


def check_container(container, progress=None):
    """(problems, notes) of an opened container (opened without trusting its CRCs).

    ``progress(total_bytes)``, if given, makes a tqdm-like context manager
    whose ``update(bytes)`` follows the reading (not called when nothing is read).
    """
    if isinstance(container, MultiFile):
        check = check_multifile
    elif container.format_name == "MultiHDF5":
        check = check_multihdf5
    elif type(container).check is Container.check:
        return container.check()  # (nothing to read beyond what opening did)
    else:
        check = type(container).check
    with progress_for(progress, work_bytes(container) if progress else 0) as bar:
        return check(container, bar=bar)
