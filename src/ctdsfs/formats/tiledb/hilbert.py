"""Hilbert cell order (cell order 4): the global order libtiledb reads a sparse Hilbert
array in is by the Hilbert value of each cell's coordinates, ties broken by the
coordinates in row-major order (TileDB's ``misc/hilbert.h``, facts only).

Each of the n dimensions gets ``63 // n`` bits: a coordinate is mapped to
``floor((v - low) / (high - low) * (2**bits - 1))`` (in double precision), the n values
are turned into the transpose form of their Hilbert index by Skilling's method (in
TileDB's variant of its Gray-code step), and the transpose's bits are interleaved,
dimension n - 1 in the lowest bit of each group.
"""

import numpy as np

ONE = np.uint64(1)


def hilbert_values(coords, domains):
    """The uint64 Hilbert value of every cell: ``coords`` one array per dimension,
    ``domains`` their (low, high)."""
    n = len(coords)
    bits = 63 // n
    top = float((1 << bits) - 1)
    axes = []
    for values, (low, high) in zip(coords, domains):
        span = float(high) - float(low)
        scaled = (values.astype(np.float64) - float(low)) / span * top if span else \
            np.zeros(len(values))
        axes.append(scaled.astype(np.uint64))
    _axes_to_transpose(axes, bits)
    result = np.zeros(len(coords[0]), np.uint64)
    position = 0
    for j in range(bits):
        for i in range(n - 1, -1, -1):
            result |= ((axes[i] >> np.uint64(j)) & ONE) << np.uint64(position)
            position += 1
    return result


def _axes_to_transpose(x, bits):
    """Skilling's coordinates to transpose form, in place, as TileDB computes it."""
    n = len(x)
    q = 1 << (bits - 1)
    while q > 1:
        big_q, p = np.uint64(q), np.uint64(q - 1)
        x[0] = np.where(x[0] & big_q, x[0] ^ p, x[0])
        for i in range(1, n):
            hit = (x[i] & big_q) != 0
            swap = np.where(hit, np.uint64(0), (x[0] ^ x[i]) & p)
            x[0] = np.where(hit, x[0] ^ p, x[0] ^ swap)
            x[i] = x[i] ^ swap
        q >>= 1
    for i in range(1, n):
        x[i] = x[i] ^ x[i - 1]
    before = x[n - 1].copy()
    shift = 1
    while shift < bits:
        x[n - 1] = x[n - 1] ^ (x[n - 1] >> np.uint64(shift))
        shift <<= 1
    change = before ^ x[n - 1]
    for i in range(n - 2, -1, -1):
        x[i] = x[i] ^ change
