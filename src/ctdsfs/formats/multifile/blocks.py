"""The block lists of a MultiFile as runs and spans: the arithmetic its reading, writing
and committing (multifile.py and its parts) share."""

import functools
from array import array

from ...io import crc
from .header import index_runs

ZERO_CHUNK = 8 << 20  # zeros that must really be written go out in pieces this large


def zero_padded(values, length):
    """``values`` (an ``array``) zero-padded to at least ``length`` items."""
    if len(values) >= length:
        return values
    return values + array(values.typecode, bytes((length - len(values)) * values.itemsize))


def block_runs(blocks):
    """``(first block, stop)`` of each run of consecutive block numbers in ``blocks``."""
    if type(blocks) is range:
        return [(blocks.start, blocks.stop)] if blocks else []
    return [(blocks[i], blocks[j - 1] + 1) for i, j in index_runs(blocks)]


def block_spans(blocks, first, block_size, offset, end):
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


def entry_block_runs(entries):
    """``block_runs`` of all ``entries``' blocks together."""
    runs = []
    for e in entries:
        run = e.run()
        if run is None:
            runs += block_runs(e.blocks)
        elif run[1] > run[0]:  # (most files: at once)
            runs.append(run)
    return runs


@functools.lru_cache(maxsize=None)
def zero_block_crc(block_size):
    """CRC-32/BZIP2 of an all-zero block, in bounded pieces (blocks may be 1 GiB)."""
    piece = bytes(min(block_size, ZERO_CHUNK))
    value = None
    for start in range(0, block_size, len(piece)):
        value = crc.crc32_bzip2(piece[:block_size - start], value)
    return value
