"""Dysco's quantisation tables: the value each symbol of a DyscoStMan data column stands for.

Facts used (Dysco's ``StochasticEncoder``, as casacore 3.8 carries it in
``tables/Dysco``): a data column with ``b`` bits has ``Q = 2**b`` symbols; symbol
``Q - 1`` stands for a value that was not finite (NaN), symbol ``i < Q - 1`` for the
value at the centre ``(i + 1/2) / (Q - 1)`` of its share of the distribution. Dysco
builds its tables with a unit scale, as ``float`` values computed in these types:

* Gaussian: ``s * x`` with ``s`` the ``float`` nearest ``sqrt(3)`` and ``x`` the
  standard normal quantile, found by bisection in ``long double`` (start at 1, double
  until the CDF passes the target, then halve until the CDF is within ``1e-13``, or
  has not come closer ten times running), the CDF being ``1/2 + erf(x / sqrt 2) / 2``
  with ``erf`` taken in ``double``; targets under 1/2 are mirrored;
* Uniform: ``s * (-1 + 2 (i + 1/2) / (Q - 1))`` in ``long double``;
* TruncatedGaussian with truncation ``t``: the normal quantile (``double``) of
  ``c * (1 - 2 P(-t)) + P(-t)``, ``P`` the normal CDF and ``c`` the centre above
  rounded to ``double``;
* StudentT with ``nu`` degrees of freedom: Student's t quantile of the centre (GSL's
  ``gsl_cdf_tdist_Pinv`` there; here from the regularised incomplete beta function).

The rounding to ``float`` makes a table independent of how its ``double`` value was
reached to within a unit in its last place, except on the rare value within that
distance of a ``float`` rounding boundary; the tests compare every table with the
values casacore itself decodes.
"""

import functools
import math

import numpy as np

GAUSSIAN, UNIFORM, STUDENT_T, TRUNCATED_GAUSSIAN = 0, 1, 2, 3
NAMES = {GAUSSIAN: "Gaussian", UNIFORM: "Uniform", STUDENT_T: "StudentT",
         TRUNCATED_GAUSSIAN: "TruncatedGaussian"}
NAMES_TO_CODES = {name: code for code, name in NAMES.items()}
BISECTION_TOLERANCE = 1e-13
# StudentT's nu decoded: the incomplete beta's continued fraction takes ever more steps
# as nu grows (a table at nu 200 takes seconds), and under 1/4 the extreme quantiles
# pass a float's range
MIN_NU, MAX_NU = 0.25, 200.0
_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)
_LD = np.longdouble


def _centres(count):
    """``(i + 1/2) / (count - 1)`` for each symbol but the last, in ``long double``."""
    return (np.arange(count - 1, dtype=_LD) + _LD(0.5)) / _LD(count - 1)


def _scale():
    return _LD(np.float32(np.sqrt(3.0)))


def _cumulative(x):
    """The standard normal CDF as Dysco's bisection takes it (``long double`` around a
    ``double`` erf)."""
    arg = (x / np.sqrt(_LD(2))).astype(np.float64)
    return _LD(0.5) + _LD(0.5) * np.asarray(_erf(arg), np.float64).astype(_LD)


def _bisected_quantiles(targets):
    """Dysco's bisection for targets in (1/2, 1), all at once."""
    c = targets
    x = np.ones_like(c)
    fx = _cumulative(x)
    grow = fx < c
    while grow.any():
        x[grow] *= 2
        fx[grow] = _cumulative(x[grow])
        grow &= fx < c
    started_high = x > 1
    low = np.where(started_high, x * _LD(0.5), _LD(0))
    high = np.where(started_high, x, _LD(1))
    error = high.copy()
    stalled = np.zeros(len(c), np.int64)
    result = np.zeros_like(c)
    active = np.ones(len(c), bool)
    while active.any():
        idx = np.flatnonzero(active)
        xm = (low[idx] + high[idx]) * _LD(0.5)
        f = _cumulative(xm)
        above = f > c[idx]
        high[idx[above]] = xm[above]
        low[idx[~above]] = xm[~above]
        err = np.abs(f - c[idx])
        worse = err >= error[idx]
        stalled[idx] = np.where(worse, stalled[idx] + 1, 0)
        error[idx] = err
        done = (worse & (stalled[idx] > 10)) | (err <= _LD(BISECTION_TOLERANCE))
        result[idx[done]] = xm[done]
        active[idx[done]] = False
    return result


def _gaussian(count):
    c = _centres(count)
    x = np.zeros_like(c)
    upper, lower = c > _LD(0.5), c < _LD(0.5)
    x[upper] = _bisected_quantiles(c[upper])
    x[lower] = -_bisected_quantiles(_LD(1) - c[lower])
    return (_scale() * x).astype(np.float32)


def _uniform(count):
    values = _LD(-1) + _LD(2) * (np.arange(count - 1, dtype=_LD) + _LD(0.5)) / _LD(count - 1)
    return (_scale() * values).astype(np.float32)


def _normal_cdf(x):
    """The standard normal CDF in ``double`` (through erfc: accurate in both tails)."""
    return np.asarray(_erfc(-np.asarray(x, np.float64) / math.sqrt(2)), np.float64) / 2


def _normal_quantiles(p):
    """Standard normal quantiles of ``p`` (``double``, 0 < p < 1), to within a unit or two
    in the last place: a rational start (Acklam's) refined by Newton steps on an
    accurate CDF."""
    p = np.asarray(p, np.float64)
    upper = p > 0.5
    tail = np.where(upper, 1 - p, p)  # (exact): the lower tail, where the CDF is accurate
    x = _acklam(tail)
    for _ in range(4):
        x = x - (_normal_cdf(x) - tail) * (math.sqrt(2 * math.pi) * np.exp(x * x / 2))
    return np.where(upper, -x, x)


_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)


def _acklam(p):
    """A start for the normal quantile good to about 1e-9 (Acklam's published rational
    approximation)."""
    x = np.empty_like(p)
    tail = np.minimum(p, 1 - p)
    centre = tail >= 0.02425
    q = p[centre] - 0.5
    r = q * q
    x[centre] = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q / \
        (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1)
    q = np.sqrt(-2 * np.log(tail[~centre]))
    value = (((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
        ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
    x[~centre] = np.where(p[~centre] < 0.5, value, -value)
    return x


def _truncated_gaussian(count, truncation):
    at_truncation = float(_normal_cdf(-truncation))
    factor = 1.0 - 2.0 * at_truncation
    centres = _centres(count).astype(np.float64)
    return _normal_quantiles(centres * factor + at_truncation).astype(np.float32)


TINY = 1e-300


def _fixed(values):
    return np.where(np.abs(values) < TINY, TINY, values)


def _beta_fraction(z, a, b):
    """The continued fraction of the incomplete beta function (modified Lentz), for
    ``z < (a + 1) / (a + b + 2)``, all ``z`` at once."""
    c = np.ones_like(z)
    d = 1 / _fixed(1 - (a + b) * z / (a + 1))
    h = d.copy()
    for m in range(1, 1000):
        for term in (m * (b - m) * z / ((a - 1 + 2 * m) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * z / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1 / _fixed(1 + term * d)
            c = _fixed(1 + term / c)
            h *= d * c
        if (np.abs(d * c - 1) < 1e-15).all():
            break
    return h


def _log_beta(a, b):
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _incomplete_beta(z, a, b):
    """The regularised incomplete beta function ``I_z(a, b)`` (``double``, 0 < z < 1)."""
    out = np.empty_like(z)
    direct = z < (a + 1) / (a + b + 2)
    front = np.exp(a * np.log(z) + b * np.log1p(-z) - _log_beta(a, b))
    out[direct] = front[direct] * _beta_fraction(z[direct], a, b) / a
    out[~direct] = 1 - front[~direct] * _beta_fraction(1 - z[~direct], b, a) / b
    return out


def _inverse_incomplete_beta(target, a, b):
    """``z`` with ``I_z(a, b) = target`` (``0 < target <= 1/2``): Newton's method on
    ``log I`` over ``log z``, from the power law of small ``z``."""
    u = np.minimum((np.log(target * a) + _log_beta(a, b)) / a, math.log(0.5))
    for _ in range(40):
        z = np.exp(u)
        value = _incomplete_beta(z, a, b)
        slope = np.exp(a * u + (b - 1) * np.log1p(-z) - _log_beta(a, b)) / value
        step = (np.log(value) - np.log(target)) / slope
        u = np.where(u - step >= 0, u / 2, u - step)
        if (np.abs(step) <= 1e-13 * np.abs(u)).all():  # (one more step: quadratic)
            break
    z = np.exp(u)
    value = _incomplete_beta(z, a, b)
    slope = np.exp(a * u + (b - 1) * np.log1p(-z) - _log_beta(a, b)) / value
    return np.exp(u - (np.log(value) - np.log(target)) / slope)


def _student_t(count, nu):
    """Student's t quantiles of the centres: the tail ``q`` of ``|t|`` solves
    ``I_x(nu/2, 1/2) = 2 q`` with ``x = nu / (nu + t**2)``, or for a tail near 1/2
    ``I_y(1/2, nu/2) = 1 - 2 q`` with ``y = 1 - x`` (the smaller target, for accuracy)."""
    centres = _centres(count).astype(np.float64)
    tail = np.minimum(centres, 1 - centres)
    size = np.zeros_like(tail)
    small = 2 * tail <= 0.5
    x = _inverse_incomplete_beta(2 * tail[small], nu / 2, 0.5)
    size[small] = np.sqrt(nu * (1 - x) / x)
    near = ~small & (tail < 0.5)
    y = _inverse_incomplete_beta(1 - 2 * tail[near], 0.5, nu / 2)
    size[near] = np.sqrt(nu * y / (1 - y))
    return np.where(centres < 0.5, -size, size).astype(np.float32)


@functools.lru_cache(maxsize=16)
def decode_table(bits, distribution, nu=0.0, truncation=0.0):
    """The ``float32`` value of each of the ``2**bits`` symbols (the last one NaN); ``nu``
    and ``truncation`` matter only to their distributions. A read-only array."""
    count = 1 << bits
    if distribution == GAUSSIAN:
        values = _gaussian(count)
    elif distribution == UNIFORM:
        values = _uniform(count)
    elif distribution == TRUNCATED_GAUSSIAN:
        values = _truncated_gaussian(count, truncation)
    elif distribution == STUDENT_T and MIN_NU <= nu <= MAX_NU:
        values = _student_t(count, nu)
    else:
        raise ValueError(f"distribution {distribution}")
    table = np.append(values, np.float32(np.nan))
    table.flags.writeable = False
    return table
