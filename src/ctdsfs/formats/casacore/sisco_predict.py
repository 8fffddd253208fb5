"""Sisco's predictors (casacore 3.8 ``Sisco.h``, ``BitFloat.h``) over NumPy arrays.

A value is a sign, a 31-bit mantissa without an implied bit (predictions shift it)
and an int8 exponent: held here as arrays ``m`` (int64 holding a uint32), ``e``
(int64) and ``s`` (bool). Every operation is casacore's integer arithmetic (uint32
mantissas wrap), done for many values at once: the values of one channel across many
items, or of one item's channels across many baselines. A prediction always has the
exponent of the value it is for, so predictors give ``(m, s)`` only. Exponents -127
and -128 (zero, subnormals, infinities, NaN) allow no arithmetic.
"""

import numpy as np

M32 = 0xFFFFFFFF


def _clip(values, low, high):
    """``np.clip`` of integers without its checks of the bounds' types, which cost more
    than the clipping on the arrays predictions work on."""
    return np.minimum(np.maximum(values, low), high)


def allows(e):
    return (e != -128) & (e != -127)


def add(am, as_, bm, bs):
    """``a += b`` of two values of one exponent: (m, s)."""
    same, ge = as_ == bs, am >= bm
    m = np.where(same, (am + bm) & M32, np.where(ge, am - bm, bm - am))
    return m, np.where(same | ge, as_, ~as_)


def sub(am, as_, bm, bs):
    return add(am, as_, bm, ~bs)


def _threshold(m, s):
    """A prediction about twice the value's size (by its exponent) becomes 0."""
    big = (m & 0xFE000000) != 0
    return np.where(big, 0, m), s & ~big


def _match(p, e):
    """(usable, m, s): ``p`` shifted to exponent ``e``; not usable when it would lose more
    than 7 bits on the left."""
    m, pe, s = p
    up = _clip(pe - e, 0, 7)
    down = _clip(e - pe, 0, 24)
    shifted = np.where(pe > e, (m << up) & M32,
                       np.where(e - pe > 24, 0, m >> down))
    return (pe <= e) | (pe - e <= 7), np.where(pe == e, m, shifted), s


def _zero(e):
    return np.zeros(e.shape, np.int64), np.zeros(e.shape, bool)


def _choose(cases, default):
    """The first case whose condition holds, else ``default``; each case (condition, a
    function giving (m, s)), called only when its condition holds somewhere (in most
    data no fallback is ever needed)."""
    m, s = default
    taken = np.zeros(m.shape, bool)
    for cond, make in cases:
        use = cond & ~taken
        if use.any():
            cm, cs = make()
            m, s = np.where(use, cm, m), np.where(use, cs, s)
            taken |= use
    return m, s


def p1(p, e):
    m, pe, s = p
    up_m, up_s = _threshold((m << 1) & M32, s)
    shifted = np.where(e - pe > 24, 0, m >> _clip(e - pe, 0, 24))
    return _choose([(~allows(pe), lambda: _zero(e)), (pe == e, lambda: (m, s)),
                    ((pe > e) & (pe - e > 1), lambda: _zero(e)), (pe > e, lambda: (up_m, up_s)),
                    (e - pe > 24, lambda: _zero(e))], (shifted, s))


def _two(q2, q1, e, average):
    ok2, m2, s2 = _match(q2, e)
    ok1, rm, rs = _match(q1, e)
    if average:
        rm, rs = add(rm, rs, m2, s2)
        rm = rm // 2
    else:
        rm, rs = sub((rm * 2) & M32, rs, m2, s2)
    return _choose([(~allows(q1[1]), lambda: p1(q2, e)), (~allows(q2[1]), lambda: p1(q1, e)),
                    (~allows(e), lambda: _zero(e)), (~(ok1 & ok2), lambda: _zero(e))],
                   _threshold(rm, rs))


def p2(q2, q1, e):
    return _two(q2, q1, e, False)


def average2(q2, q1, e):
    return _two(q2, q1, e, True)


def _three(q3, q2, q1, e, linear):
    ok3, m3, s3 = _match((q3[0], q3[1], ~q3[2]) if linear else q3, e)
    ok2, m2, s2 = _match(q2, e)
    ok1, rm, rs = _match(q1, e)
    if linear:  # (4 p1 + p2 - 2 p3) / 3
        rm, rs = add(*add((rm * 4) & M32, rs, m2, s2), (m3 * 2) & M32, s3)
        rm = rm // 3
    else:  # 3 p1 - 3 p2 + p3
        rm, rs = add(*sub((rm * 3) & M32, rs, (m2 * 3) & M32, s2), m3, s3)
    back2, back1, other = (lambda: p2(q2, q1, e)), (lambda: p1(q1, e)), (lambda: p1(q2, e))
    return _choose([(~allows(q1[1]), other), (~allows(q2[1]), back1),
                    (~allows(q3[1]), back2), (~allows(e), lambda: _zero(e)), (~ok3, back2),
                    (~ok2, back1), (~ok1, other)], _threshold(rm, rs))


def p3(q3, q2, q1, e):
    return _three(q3, q2, q1, e, False)


def linear3(q3, q2, q1, e):
    return _three(q3, q2, q1, e, True)


def _four(q4, q3, q2, q1, e, quadratic):
    ok4, m4, s4 = _match(q4, e)
    ok3, m3, s3 = _match(q3, e)
    ok2, m2, s2 = _match(q2, e)
    ok1, rm, rs = _match(q1, e)
    if quadratic:  # (9 p1 - 3 p2 - 5 p3 + 3 p4) / 4
        rm, rs = sub((rm * 9) & M32, rs, (m2 * 3) & M32, s2)
        rm, rs = add(*sub(rm, rs, (m3 * 5) & M32, s3), (m4 * 3) & M32, s4)
        rm = rm // 4
    else:  # 4 p1 - 6 p2 + 4 p3 - p4
        rm, rs = sub((rm * 4) & M32, rs, (m2 * 6) & M32, s2)
        rm, rs = sub(*add(rm, rs, (m3 * 4) & M32, s3), m4, s4)
    back3, back2 = (lambda: p3(q3, q2, q1, e)), (lambda: p2(q2, q1, e))
    back1, other = (lambda: p1(q1, e)), (lambda: p1(q2, e))
    return _choose([(~allows(q1[1]), other), (~allows(q2[1]), back1),
                    (~allows(q3[1]), back2), (~allows(q4[1]), back3),
                    (~allows(e), lambda: _zero(e)), (~ok4, back3), (~ok3, back2), (~ok2, back1),
                    (~ok1, other)], _threshold(rm, rs))


def p4(q4, q3, q2, q1, e):
    return _four(q4, q3, q2, q1, e, False)


def quadratic4(q4, q3, q2, q1, e):
    return _four(q4, q3, q2, q1, e, True)


# prediction level -> the predictors used with 1, 2, ... earlier values
PREDICTORS = {0: (p1,), 10: (p1, average2), 1: (p1, p2), 11: (p1, p2, linear3),
              2: (p1, p2, p3), 12: (p1, p2, p3, quadratic4), 3: (p1, p2, p3, p4)}
# level -> (predictors along the channels, along time); 21 predicts along the channels
# as level 2 and along time as level 1; -1 stores the values themselves
LEVELS = {level: (p, p) for level, p in PREDICTORS.items()}
LEVELS[21] = (PREDICTORS[2], PREDICTORS[1])
LEVELS[-1] = ((), ())


def predicted(value, earlier, predictors):
    """``value`` (m, e, s) plus the prediction from ``earlier`` values (oldest first) where
    its exponent allows arithmetic."""
    m, e, s = value
    if not earlier:
        return value
    pm, ps = predictors[len(earlier) - 1](*earlier, e)
    am, as_ = add(m, s, pm, ps)
    ok = allows(e)
    return np.where(ok, am, m), e, np.where(ok, as_, s)


def along_channels(m, e, s, predictors):
    """Items' values (arrays items x channels), each channel plus the prediction from the
    item's channels before it (decoded first); worked channel by channel across the
    items, each channel's values side by side in memory."""
    m, e, s = (np.ascontiguousarray(a.T) for a in (m, e, s))
    depth = len(predictors)
    for i in range(1, len(m)):
        k = min(i, depth)
        earlier = [(m[j], e[j], s[j]) for j in range(i - k, i)]
        m[i], _, s[i] = predicted((m[i], e[i], s[i]), earlier, predictors)
    return m.T, e.T, s.T


def float_bits(m, e, s):
    """casacore's ``BitFloat::ToFloat``: the mantissa normalised (its top bit moved to bit
    23, the exponent following as an int8), as uint32 float bits."""
    ok = allows(e)
    math = ok & (m != 0)
    top = np.frexp(np.where(math, m, 1).astype(np.float64))[1] - 1
    shift = np.where(math, top - 23, 0)
    m = np.where(shift >= 0, m >> _clip(shift, 0, 31), (m << _clip(-shift, 0, 31)) & M32)
    e = np.where(math, (e + shift + 128) % 256 - 128, e)
    sign = np.where(s, 0x80000000, 0)
    bits = np.where(ok & ~math, sign, (m & 0x007FFFFF) | (((e + 127) & 0xFF) << 23) | sign)
    return bits.astype(np.uint32)
