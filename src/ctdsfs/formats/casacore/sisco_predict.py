"""Sisco's decoding loop (casacore 3.8 ``Sisco.h``, ``BitFloat.h``; the stream:
:mod:`.sisco`), compiled: each value read from its chunk's byte planes, plus the
predictions from its item's previous channels and from its baseline's previous items,
then normalised into float32 bits, one value after the other.

A value is a sign ``s``, a 31-bit mantissa ``m`` without an implied bit (predictions
shift it; held in an int64, wrapping as casacore's uint32 does) and an int8 exponent
``e``. A prediction always has the exponent of the value it is for, so predictors give
``(m, s)`` only. Exponents -127 and -128 (zero, subnormals, infinities, NaN) allow no
arithmetic. A predictor from ``k`` earlier values takes them newest first (``q1`` the
latest); the deepest predictor of the levels that smooth is the averaging, linear or
quadratic one instead of the extrapolating one.
"""

import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from .compiled import helper, kernel

M32 = 0xFFFFFFFF
MAX_DEPTH = 4  # earlier values a predictor takes


@helper
def _allows(e):
    return e != -128 and e != -127


@helper
def _add(am, as_, bm, bs):
    """``a += b`` of two values of one exponent: (m, s)."""
    if as_ == bs:
        return (am + bm) & M32, as_
    if am >= bm:
        return am - bm, as_
    return bm - am, not as_


@helper
def _threshold(m, s):
    """A prediction about twice the value's size (by its exponent) becomes 0."""
    if m & 0xFE000000:
        return 0, False
    return m, s


@helper
def _match(m, pe, e):
    """(usable, m shifted to exponent ``e``): not usable when it would lose more than 7
    bits on the left (its mantissa then matters to no one)."""
    if pe == e:
        return True, m
    if pe > e:
        return pe - e <= 7, (m << min(pe - e, 7)) & M32
    if e - pe > 24:
        return True, 0
    return True, m >> (e - pe)


@helper
def _p1(m, pe, s, e):
    if not _allows(pe):
        return 0, False
    if pe == e:
        return m, s
    if pe > e:
        if pe - e > 1:
            return 0, False
        return _threshold((m << 1) & M32, s)
    if e - pe > 24:
        return 0, False
    return m >> (e - pe), s


@helper
def _p2(m2, e2, s2, m1, e1, s1, e, average):
    if not _allows(e1):
        return _p1(m2, e2, s2, e)
    if not _allows(e2):
        return _p1(m1, e1, s1, e)
    ok2, a2 = _match(m2, e2, e)
    ok1, a1 = _match(m1, e1, e)
    if not _allows(e) or not (ok1 and ok2):
        return 0, False
    if average:
        rm, rs = _add(a1, s1, a2, s2)
        return _threshold(rm // 2, rs)
    rm, rs = _add((a1 * 2) & M32, s1, a2, not s2)
    return _threshold(rm, rs)


@helper
def _p3(m3, e3, s3, m2, e2, s2, m1, e1, s1, e, linear):
    if not _allows(e1):
        return _p1(m2, e2, s2, e)
    if not _allows(e2):
        return _p1(m1, e1, s1, e)
    if not _allows(e3):
        return _p2(m2, e2, s2, m1, e1, s1, e, False)
    if not _allows(e):
        return 0, False
    ok3, a3 = _match(m3, e3, e)
    ok2, a2 = _match(m2, e2, e)
    ok1, a1 = _match(m1, e1, e)
    if not ok3:
        return _p2(m2, e2, s2, m1, e1, s1, e, False)
    if not ok2:
        return _p1(m1, e1, s1, e)
    if not ok1:
        return _p1(m2, e2, s2, e)
    if linear:  # (4 p1 + p2 - 2 p3) / 3
        rm, rs = _add((a1 * 4) & M32, s1, a2, s2)
        rm, rs = _add(rm, rs, (a3 * 2) & M32, not s3)
        return _threshold(rm // 3, rs)
    rm, rs = _add((a1 * 3) & M32, s1, (a2 * 3) & M32, not s2)  # 3 p1 - 3 p2 + p3
    rm, rs = _add(rm, rs, a3, s3)
    return _threshold(rm, rs)


@helper
def _p4(q, e, quadratic):
    """From the four earlier values ``q`` (rows m, e, s; newest first)."""
    m1, m2, m3, m4 = q[0, 0], q[0, 1], q[0, 2], q[0, 3]
    e1, e2, e3, e4 = q[1, 0], q[1, 1], q[1, 2], q[1, 3]
    s1, s2, s3, s4 = q[2, 0] != 0, q[2, 1] != 0, q[2, 2] != 0, q[2, 3] != 0
    if not _allows(e1):
        return _p1(m2, e2, s2, e)
    if not _allows(e2):
        return _p1(m1, e1, s1, e)
    if not _allows(e3):
        return _p2(m2, e2, s2, m1, e1, s1, e, False)
    if not _allows(e4):
        return _p3(m3, e3, s3, m2, e2, s2, m1, e1, s1, e, False)
    if not _allows(e):
        return 0, False
    ok4, a4 = _match(m4, e4, e)
    ok3, a3 = _match(m3, e3, e)
    ok2, a2 = _match(m2, e2, e)
    ok1, a1 = _match(m1, e1, e)
    if not ok4:
        return _p3(m3, e3, s3, m2, e2, s2, m1, e1, s1, e, False)
    if not ok3:
        return _p2(m2, e2, s2, m1, e1, s1, e, False)
    if not ok2:
        return _p1(m1, e1, s1, e)
    if not ok1:
        return _p1(m2, e2, s2, e)
    if quadratic:  # (9 p1 - 3 p2 - 5 p3 + 3 p4) / 4
        rm, rs = _add((a1 * 9) & M32, s1, (a2 * 3) & M32, not s2)
        rm, rs = _add(rm, rs, (a3 * 5) & M32, not s3)
        rm, rs = _add(rm, rs, (a4 * 3) & M32, s4)
        return _threshold(rm // 4, rs)
    rm, rs = _add((a1 * 4) & M32, s1, (a2 * 6) & M32, not s2)  # 4 p1 - 6 p2 + 4 p3 - p4
    rm, rs = _add(rm, rs, (a3 * 4) & M32, s3)
    rm, rs = _add(rm, rs, a4, not s4)
    return _threshold(rm, rs)


@helper
def _predicted(m, e, s, q, k, depth, smooth):
    """The value (m, e, s) plus the prediction from its ``k`` earlier values ``q`` (rows
    m, e, s; newest first) where its exponent allows arithmetic: (m, s)."""
    if k == 0 or not _allows(e):
        return m, s
    alternative = smooth and k == depth
    if k == 1:
        pm, ps = _p1(q[0, 0], q[1, 0], q[2, 0] != 0, e)
    elif k == 2:
        pm, ps = _p2(q[0, 1], q[1, 1], q[2, 1] != 0, q[0, 0], q[1, 0], q[2, 0] != 0, e,
                     alternative)
    elif k == 3:
        pm, ps = _p3(q[0, 2], q[1, 2], q[2, 2] != 0, q[0, 1], q[1, 1], q[2, 1] != 0,
                     q[0, 0], q[1, 0], q[2, 0] != 0, e, alternative)
    else:
        pm, ps = _p4(q, e, alternative)
    return _add(m, s, pm, ps)


@helper
def _float_bits(m, e, s):
    """casacore's ``BitFloat::ToFloat``: the mantissa normalised (its top bit moved to bit
    23, the exponent following as an int8), as float32 bits."""
    sign = 0x80000000 if s else 0
    if _allows(e):
        if m == 0:
            return sign
        shift = 63 - leading_zeros(m) - 23  # (its top bit's place, less 23)
        m = m >> shift if shift >= 0 else (m << -shift) & M32
        e = ((e + shift + 128) & 0xFF) - 128
    return (m & 0x7FFFFF) | (((e + 127) & 0xFF) << 23) | sign


@kernel
def decode_items(plain, values, used, count, channels, keys, history, held, along_channels,
                 along_time, out):
    """``count`` items of ``channels`` channels (real parts, then imaginary: two parts)
    from value ``used`` of a chunk of ``values`` values (``plain``: its byte planes, 5
    bytes a value, or 4 at level -1), decoded as float32 bits into ``out``. ``keys``:
    each part's baseline and part; ``history`` (keys, depth, m e s, channels; int64) and
    ``held`` (keys): each key's last values, newest first, and how many; the
    ``along_*``: (depth, smooth) of the predictors. False, nothing written, when the
    sizes or a key do not fit."""
    parts = 2 * count
    width = plain.size // values if values > 0 else 0
    depth = history.shape[1]
    if values <= 0 or plain.size != width * values or width not in (4, 5) or used < 0 or \
            count < 0 or channels <= 0 or used + parts * channels > values or \
            keys.size != parts or out.size != parts * channels or \
            history.shape[0] != held.size or history.shape[2] != 3 or \
            history.shape[3] != channels or depth != along_time[0] or \
            not 0 <= along_channels[0] <= MAX_DEPTH or not 0 <= depth <= MAX_DEPTH:
        return False
    for key in keys:
        if not 0 <= key < held.size:
            return False
    mantissa_planes = 3 if width == 4 else 4
    value = np.empty((3, channels), np.int64)  # m, e, s of the part's channels
    q = np.zeros((3, MAX_DEPTH), np.int64)
    for part in range(parts):
        for c in range(channels):
            at = used + part * channels + c
            mantissa = np.int64(0)
            for plane in range(mantissa_planes):
                mantissa |= np.int64(plain[plane * values + at]) << (8 * plane)
            if width == 4:  # (the third byte gives bits 16-22, bit 23 and the sign)
                mantissa = (mantissa & 0x7FFFFF) | 0x800000 | ((mantissa & 0x800000) << 8)
            exponent = np.int64(plain[mantissa_planes * values + at])
            value[0, c] = mantissa & 0x7FFFFFFF
            value[1, c] = exponent - 256 if exponent >= 128 else exponent
            value[2, c] = mantissa >> 31
        for c in range(channels):  # along the channels
            k = min(c, along_channels[0])
            for j in range(k):
                for row in range(3):
                    q[row, j] = value[row, c - 1 - j]
            m, s = _predicted(value[0, c], value[1, c], value[2, c] != 0, q, k,
                              along_channels[0], along_channels[1])
            value[0, c], value[2, c] = m, s
        key = keys[part]
        k = held[key]
        for c in range(channels):  # along time
            for j in range(k):
                for row in range(3):
                    q[row, j] = history[key, j, row, c]
            m, s = _predicted(value[0, c], value[1, c], value[2, c] != 0, q, k, depth,
                              along_time[1])
            value[0, c], value[2, c] = m, s
            out[part * channels + c] = _float_bits(m, value[1, c], s)
        if depth:
            for j in range(depth - 1, 0, -1):
                history[key, j] = history[key, j - 1]
            history[key, 0] = value
            held[key] = min(k + 1, depth)
    return True
