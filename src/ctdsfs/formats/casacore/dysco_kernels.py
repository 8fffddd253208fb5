"""Dysco's decoding loops (the layout: :mod:`.dysco`), compiled: each value's symbol cut
from its bits, looked up and multiplied by its factor in one pass, written straight into
the rows decoded. Each kernel checks its arrays' sizes against the counts it is given
and returns False, writing nothing, when they do not fit."""

import numpy as np

from .compiled import helper, kernel


@helper
def _fits(raw, bit, bits, count):
    """Whether ``raw`` holds ``count`` symbols from bit ``bit``, and the byte after."""
    return 0 <= bit < 8 and 0 < bits <= 16 and count >= 0 and \
        (bit + count * bits + 15) // 8 <= raw.size


@helper
def _first_bits(raw, bit):
    """The bit reader at bit ``bit`` of ``raw``: (bits held, how many, next byte)."""
    if raw.size == 0:
        return np.uint64(0), np.uint64(0), 0
    return np.uint64(raw[0]) >> np.uint64(bit), np.uint64(8 - bit), 1


@helper
def _refill(raw, held, count, at, bits):
    """The bit reader with at least ``bits`` bits held where ``raw`` has them: the next
    four bytes taken at once (symbols then come from a register, not from two loads
    each), or byte by byte near the end of ``raw``."""
    if count >= bits:
        return held, count, at
    if at + 4 <= raw.size:
        word = np.uint64(raw[at]) | (np.uint64(raw[at + 1]) << np.uint64(8)) | \
            (np.uint64(raw[at + 2]) << np.uint64(16)) | (np.uint64(raw[at + 3]) << np.uint64(24))
        return held | (word << count), count + np.uint64(32), at + 4
    while count < bits and at < raw.size:
        held |= np.uint64(raw[at]) << count
        count += np.uint64(8)
        at += 1
    return held, count, at


@kernel
def data_values(raw, bit, bits, table, channel_factors, row_factors, channels, pols, out):
    """Rows of a data column: the ``2 * channels * pols`` symbols of each row from bit
    ``bit`` of ``raw``, each ``float(double(table[symbol]) * (channel's * row's factor))``
    into ``out`` (float32, real and imaginary parts); ``channel_factors`` one per channel
    and polarisation, ``row_factors`` one per row and polarisation (doubles)."""
    values = 2 * channels * pols
    nrow = row_factors.size // pols if pols > 0 else 0
    if channels <= 0 or pols <= 0 or row_factors.size != nrow * pols or \
            channel_factors.size != channels * pols or out.size != nrow * values or \
            table.size != 1 << bits or not _fits(raw, bit, bits, out.size):
        return False
    width, mask = np.uint64(bits), np.uint64((1 << bits) - 1)
    held, count, at = _first_bits(raw, bit)
    factors = np.empty(channels * pols, np.float64)  # the row's, channel by polarisation
    done = 0
    for row in range(nrow):
        for channel in range(channels):
            for pol in range(pols):
                factors[channel * pols + pol] = \
                    channel_factors[channel * pols + pol] * row_factors[row * pols + pol]
        for factor in factors:
            for _ in range(2):  # (real, imaginary: one factor)
                held, count, at = _refill(raw, held, count, at, width)
                out[done] = table[held & mask] * factor
                held >>= width
                count -= width
                done += 1
    return True


@kernel
def weight_values(raw, bit, bits, scale, channels, pols, out):
    """Rows of the weight column: one symbol a row and channel from bit ``bit`` of
    ``raw``, ``float(symbol * scale)`` for every polarisation, into ``out`` (float32)."""
    cells = channels * pols
    nrow = out.size // cells if cells > 0 else 0
    if channels <= 0 or pols <= 0 or out.size != nrow * cells or \
            not _fits(raw, bit, bits, nrow * channels):
        return False
    width, mask = np.uint64(bits), np.uint64((1 << bits) - 1)
    held, count, at = _first_bits(raw, bit)
    done = 0
    for _ in range(nrow):
        for _ in range(channels):
            held, count, at = _refill(raw, held, count, at, width)
            value = np.float32((held & mask) * scale)
            held >>= width
            count -= width
            for _ in range(pols):
                out[done] = value
                done += 1
    return True
