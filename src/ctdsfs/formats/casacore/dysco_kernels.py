"""Dysco's decoding loops (the layout: :mod:`.dysco`), compiled: each value's symbol cut
from its bits, looked up and multiplied by its factor in one pass, written straight into
the rows decoded. Each kernel checks its arrays' sizes against the counts it is given
and returns False, writing nothing, when they do not fit."""

import numpy as np

from .compiled import helper, kernel


@helper
def _symbol(raw, position, bits):
    """The symbol of ``bits`` bits at bit ``position`` of ``raw`` (packed from the lowest
    bit up): within the two bytes from the one it starts in, for every width Dysco packs."""
    at = position >> 3
    word = np.int64(raw[at]) | (np.int64(raw[at + 1]) << 8)
    return (word >> (position & 7)) & ((1 << bits) - 1)


@helper
def _fits(raw, bit, bits, count):
    """Whether ``raw`` holds ``count`` symbols from bit ``bit``, and the byte after."""
    return 0 <= bit < 8 and 0 < bits <= 16 and count >= 0 and \
        (bit + count * bits + 15) // 8 <= raw.size


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
    position = bit
    at = 0
    for row in range(nrow):
        for channel in range(channels):
            for pol in range(pols):
                factor = channel_factors[channel * pols + pol] * row_factors[row * pols + pol]
                for _ in range(2):  # (real, imaginary: one factor)
                    out[at] = table[_symbol(raw, position, bits)] * factor
                    position += bits
                    at += 1
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
    position = bit
    at = 0
    for _ in range(nrow):
        for _ in range(channels):
            value = np.float32(_symbol(raw, position, bits) * scale)
            position += bits
            for _ in range(pols):
                out[at] = value
                at += 1
    return True
