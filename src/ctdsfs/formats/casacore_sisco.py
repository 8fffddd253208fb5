"""SiscoStMan (casacore 3.8): single-precision complex data columns compressed by
predicting each value from its neighbours, then deflate.

Facts used (SiscoStManColumn.h, SiscoReader.cc, SiscoWriter.cc, Sisco.h, Sisco.cc,
BitFloat.h, StokesIConversions.h): ``table.f<N>`` (written with POSIX calls, beside
``table.mf`` in a MultiFile table) holds a 20-byte header (``Sisco\\0\\0\\0``, ``u16``
major version 2 with the store mode in its top two bits: 0 all correlations, 0x4000
the diagonal, 0x8000 Stokes I; ``u16`` minor version), one signed byte, the prediction
level, then chunks: ``u64`` decompressed size, ``u64`` compressed size, raw deflate
(zlib's wbits -15). A decompressed chunk holds N values as four planes of their
mantissas' bytes (least significant first; level -1 keeps three, the third giving bits
16-22, bit 23 always set and the sign) and then N signed exponents.

The rows' cells come in row order, each as one item per stored correlation (all of
them, 2 on the diagonal, 1 for Stokes I), an item being one correlation's channels:
their real parts, then their imaginary parts. Items never straddle chunks. Each value
is a sign, a 31-bit mantissa (no implied bit: predictions shift it) and an exponent;
a value is decoded by adding to its residual the prediction from the previous channels
of the item, and then that from the previous items of the same "baseline" (first
appearance of (FIELD_ID, DATA_DESC_ID, ANTENNA1, ANTENNA2, correlation)), with
casacore's exact integer arithmetic (uint32 mantissas wrap, exponents are int8), and
turned into a float32 by normalising the mantissa. Exponents -127 and -128 (zero,
subnormals, infinities, NaN) take no prediction and keep their bits.

The stream has no index: a range of rows is decoded from the first row (or from where
the previous read stopped), keeping only each baseline's last few rows of values.
"""

import threading
import zlib

import numpy as np

from ..errors import FormatError
from .casacore_base import TP_COMPLEX, read_exact

HEADER = 21
VERSION_MAJOR = 2
MODES = {0: "all", 0x4000: "diagonal", 0x8000: "stokes_i"}
STORED = {"diagonal": 2, "stokes_i": 1}
MAX_CHUNK = 64 << 20  # decompressed bytes of one chunk (casacore writes about 10 MiB)
ID_ROWS = 4096  # rows of the id columns read at a time
M32 = 0xFFFFFFFF


def _allows(e):
    return e != -128 and e != -127


def _add(a, b):
    if a[2] == b[2]:
        return ((a[0] + b[0]) & M32, a[1], a[2])
    if a[0] >= b[0]:
        return (a[0] - b[0], a[1], a[2])
    return (b[0] - a[0], a[1], not a[2])


def _sub(a, b):
    return _add(a, (b[0], b[1], not b[2]))


def _mul(a, factor):
    return ((a[0] * factor) & M32, a[1], a[2])


def _threshold(v):
    return (0, v[1], False) if v[0] & 0xFE000000 else v


def _match(v, e):
    if v[1] == e:
        return v
    if v[1] > e:
        shift = v[1] - e
        return None if shift > 7 else ((v[0] << shift) & M32, e, v[2])
    shift = e - v[1]
    return (0, e, v[2]) if shift > 24 else (v[0] >> shift, e, v[2])


def _p1(p, e):
    if not _allows(p[1]):
        return (0, e, False)
    if p[1] == e:
        return p
    if p[1] > e:
        shift = p[1] - e
        return (0, e, False) if shift > 1 else _threshold(((p[0] << shift) & M32, e, p[2]))
    shift = e - p[1]
    return (0, e, False) if shift > 24 else (p[0] >> shift, e, p[2])


def _two(p2, p1, e, average):
    if not _allows(p1[1]):
        return _p1(p2, e)
    if not _allows(p2[1]):
        return _p1(p1, e)
    if not _allows(e):
        return (0, e, False)
    m2, r = _match(p2, e), _match(p1, e)
    if m2 is None or r is None:
        return (0, e, False)
    if average:
        r = _add(r, m2)
        return _threshold((r[0] // 2, e, r[2]))
    return _threshold(_sub(_mul(r, 2), m2))


def _p2(p2, p1, e):
    return _two(p2, p1, e, False)


def _average(p2, p1, e):
    return _two(p2, p1, e, True)


def _three(p3, p2, p1, e, linear):
    if not _allows(p1[1]):
        return _p1(p2, e)
    if not _allows(p2[1]):
        return _p1(p1, e)
    if not _allows(p3[1]):
        return _p2(p2, p1, e)
    if not _allows(e):
        return (0, e, False)
    m3 = _match((p3[0], p3[1], not p3[2]) if linear else p3, e)
    if m3 is None:
        return _p2(p2, p1, e)
    m2 = _match(p2, e)
    if m2 is None:
        return _p1(p1, e)
    r = _match(p1, e)
    if r is None:
        return _p1(p2, e)
    if linear:  # (4 p1 + p2 - 2 p3) / 3
        r = _add(_add(_mul(r, 4), m2), _mul(m3, 2))
        return _threshold((r[0] // 3, e, r[2]))
    return _threshold(_add(_sub(_mul(r, 3), _mul(m2, 3)), m3))


def _p3(p3, p2, p1, e):
    return _three(p3, p2, p1, e, False)


def _linear(p3, p2, p1, e):
    return _three(p3, p2, p1, e, True)


def _four(p4, p3, p2, p1, e, quadratic):
    if not _allows(p1[1]):
        return _p1(p2, e)
    if not _allows(p2[1]):
        return _p1(p1, e)
    if not _allows(p3[1]):
        return _p2(p2, p1, e)
    if not _allows(p4[1]):
        return _p3(p3, p2, p1, e)
    if not _allows(e):
        return (0, e, False)
    m4 = _match(p4, e)
    if m4 is None:
        return _p3(p3, p2, p1, e)
    m3 = _match(p3, e)
    if m3 is None:
        return _p2(p2, p1, e)
    m2 = _match(p2, e)
    if m2 is None:
        return _p1(p1, e)
    r = _match(p1, e)
    if r is None:
        return _p1(p2, e)
    if quadratic:  # (9 p1 - 3 p2 - 5 p3 + 3 p4) / 4
        r = _add(_sub(_sub(_mul(r, 9), _mul(m2, 3)), _mul(m3, 5)), _mul(m4, 3))
        return _threshold((r[0] // 4, e, r[2]))
    return _threshold(_sub(_add(_sub(_mul(r, 4), _mul(m2, 6)), _mul(m3, 4)), m4))


def _p4(p4, p3, p2, p1, e):
    return _four(p4, p3, p2, p1, e, False)


def _quadratic4(p4, p3, p2, p1, e):
    return _four(p4, p3, p2, p1, e, True)


# prediction level -> the predictors used with 1, 2, ... earlier values
PREDICTORS = {0: (_p1,), 10: (_p1, _average), 1: (_p1, _p2), 11: (_p1, _p2, _linear),
              2: (_p1, _p2, _p3), 12: (_p1, _p2, _p3, _quadratic4), 3: (_p1, _p2, _p3, _p4)}
# level 21 predicts along the channels as level 2, along time as level 1
LEVELS = {level: (p, p) for level, p in PREDICTORS.items()}
LEVELS[21] = (PREDICTORS[2], PREDICTORS[1])
LEVELS[-1] = ((), ())


def _to_float_bits(v):
    m, e, sign = v
    if _allows(e):
        if m == 0:
            return 0x80000000 if sign else 0
        while m & 0xFF000000:
            e, m = e + 1, m >> 1
        while not m & 0x00800000:
            e, m = e - 1, (m << 1) & M32
        e = (e + 128) % 256 - 128
    return (m & 0x007FFFFF) | (((e + 127) & 0xFF) << 23) | (0x80000000 if sign else 0)


def _along_channels(mantissas, exponents, predictors):
    """One item's values: each residual plus the prediction from the channels before."""
    out, depth = [], len(predictors)
    for i, (m, e) in enumerate(zip(mantissas, exponents)):
        v = (m & 0x7FFFFFFF, e, m > 0x7FFFFFFF)
        k = min(i, depth)
        if k and _allows(e):
            v = _add(v, predictors[k - 1](*out[i - k:i], e))
        out.append(v)
    return out


def _along_time(values, history, predictors):
    """Add the prediction from the baseline's earlier items; keep this one in its history."""
    k = min(len(history), len(predictors))
    if k:
        if any(len(h) != len(values) for h in history):
            raise FormatError("a baseline's items change their channel count")
        earlier, predict = history[-k:], predictors[k - 1]
        values = [_add(v, predict(*(h[i] for h in earlier), v[1])) if _allows(v[1]) else v
                  for i, v in enumerate(values)]
    history.append(values)
    if len(history) > len(predictors):
        del history[0]
    return values


class _Chunks:
    """The file's chunks, decompressed one at a time, handing out items in order."""

    def __init__(self, source, name, level):
        self.source, self.name, self.level = source, name, level
        self.size = source.entry_size(name)
        self.at, self.values, self.used = HEADER, 0, 0
        self.mantissas = self.exponents = None

    def _next_chunk(self):
        if self.at + 16 > self.size:
            raise FormatError(f"{self.name}: the data end at byte {self.at}, before the "
                              "table's rows")
        head = read_exact(self.source, self.name, self.at, 16, "chunk header")
        full, packed = (int.from_bytes(head[i:i + 8], "little") for i in (0, 8))
        width = 4 if self.level == -1 else 5
        if full > MAX_CHUNK or full % width or packed > self.size - self.at - 16:
            raise FormatError(f"{self.name}: chunk at byte {self.at}: {full} bytes from "
                              f"{packed} is out of range")
        data = read_exact(self.source, self.name, self.at + 16, packed, "chunk")
        self.at += 16 + packed
        try:
            plain = zlib.decompressobj(-15).decompress(bytes(data), full)
        except zlib.error as exc:
            raise FormatError(f"{self.name}: chunk does not inflate ({exc})") from None
        if len(plain) != full:
            raise FormatError(f"{self.name}: chunk inflates to {len(plain)} bytes, not {full}")
        n = full // width
        planes = np.frombuffer(plain, np.uint8)
        if self.level == -1:
            third = planes[2 * n:3 * n].astype(np.uint32)
            mantissas = (planes[:n].astype(np.uint32) | planes[n:2 * n].astype(np.uint32) << 8
                         | (third | 0x80) << 16 | (third & 0x80) << 24)
        else:
            mantissas = planes[:4 * n].reshape(4, n).T.copy().view("<u4").ravel()
        self.mantissas, self.exponents = mantissas, planes[(width - 1) * n:].view(np.int8)
        self.values, self.used = n, 0

    def take(self, channels):
        """The next item: (real mantissas, exponents, imaginary mantissas, exponents)."""
        if self.used >= self.values:
            self._next_chunk()
        a, b, c = self.used, self.used + channels, self.used + 2 * channels
        if c > self.values:
            raise FormatError(f"{self.name}: an item of {channels} channels passes its "
                              "chunk's end")
        self.used = c
        return (self.mantissas[a:b].tolist(), self.exponents[a:b].tolist(),
                self.mantissas[b:c].tolist(), self.exponents[b:c].tolist())


class _Stream:
    """The column's cells decoded from the first row on."""

    def __init__(self, reader, col):
        self.reader, self.row = reader, 0
        self.chunks = _Chunks(reader.source, reader.name, reader.level)
        self.ids, self.history = {}, {}
        self.channels, self.correlations = col.cell_shape
        self.id_first, self.id_rows = 0, []

    def _row_ids(self, row):
        """(FIELD_ID, DATA_DESC_ID, ANTENNA1, ANTENNA2) of ``row``, read ID_ROWS at a time."""
        if not self.id_first <= row < self.id_first + len(self.id_rows):
            stop = min(self.reader.table.nrow, row + ID_ROWS)
            self.id_first, self.id_rows = row, list(zip(*(
                self.reader.ids(name, row, stop)
                for name in ("FIELD_ID", "DATA_DESC_ID", "ANTENNA1", "ANTENNA2"))))
        return self.id_rows[row - self.id_first]

    def next_row(self):
        """The next row's cell (channels, correlations) as complex64."""
        along_channels, along_time = LEVELS[self.reader.level]
        key = self._row_ids(self.row)
        stored = STORED.get(self.reader.mode, self.correlations)
        bits = np.zeros((stored, 2, self.channels), np.uint32)
        for pol in range(stored):
            baseline = self.ids.setdefault(key + (pol,), len(self.ids))
            if not self.channels:
                continue
            item = self.chunks.take(self.channels)
            for part in (0, 1):
                mantissas, exponents = item[2 * part], item[2 * part + 1]
                if self.reader.level == -1:
                    values = [(m & 0x7FFFFFFF, e, m > 0x7FFFFFFF)
                              for m, e in zip(mantissas, exponents)]
                else:
                    values = _along_channels(mantissas, exponents, along_channels)
                    values = _along_time(values, self.history.setdefault((baseline, part), []),
                                         along_time)
                bits[pol, part] = [_to_float_bits(v) for v in values]
        floats = bits.view(np.float32)
        self.row += 1
        cell = np.zeros((self.channels, self.correlations), np.complex64)
        if self.reader.mode == "all":
            cell.real, cell.imag = floats[:, 0].T, floats[:, 1].T
        else:  # Stokes I as [I, 0, 0, I], the diagonal as [XX, 0, 0, YY]
            for column, pol in ((0, 0), (3, stored - 1)):
                cell.real[:, column], cell.imag[:, column] = floats[pol, 0], floats[pol, 1]
        return cell


class SiscoReader:
    """A SiscoStMan column (see the module); fixed-shape columns only."""

    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.table, self.name = source, table, f"table.f{seqnr}"
        head = read_exact(source, self.name, 0, HEADER, "Sisco header")
        major = int.from_bytes(head[8:10], "little")
        if major & 0x3FFF != VERSION_MAJOR:
            raise FormatError(f"{self.name}: Sisco version {major & 0x3FFF}, not "
                              f"{VERSION_MAJOR}")
        if major & 0xC000 not in MODES:
            raise FormatError(f"{self.name}: unknown Sisco store mode {major & 0xC000:#x}")
        self.mode = MODES[major & 0xC000]
        self.level = int.from_bytes(head[20:21], "little", signed=True)
        if self.level not in LEVELS:
            raise FormatError(f"{self.name}: unknown Sisco prediction level {self.level}")
        self._stream, self._lock = None, threading.Lock()

    def ids(self, name, start, stop):
        values = self.table.read_column(name, start, stop)
        if not isinstance(values, np.ndarray) or values.shape != (stop - start,):
            raise FormatError(f"{name} is not a scalar column of {stop - start} rows")
        return values.tolist()

    def read(self, col, start, stop):
        if col.data_type != TP_COMPLEX:
            raise FormatError(f"SiscoStMan stores Complex columns, not {col.type_name}")
        shape = col.cell_shape
        if shape is None or len(shape) != 2:
            raise FormatError("a SiscoStMan column without a fixed 2-D cell shape is not "
                              "decoded")
        if self.mode != "all" and shape[1] != 4:
            raise FormatError(f"a Sisco {self.mode} column shows 4 correlations, not "
                              f"{shape[1]}")
        out = np.empty((max(0, stop - start),) + tuple(shape), np.complex64)
        with self._lock:
            stream = self._stream
            if stream is None or stream.row > start:
                stream = self._stream = _Stream(self, col)
            try:
                while stream.row < stop:
                    cell = stream.next_row()
                    if stream.row > start:
                        out[stream.row - 1 - start] = cell
            except FormatError:
                self._stream = None
                raise
        return out


DECODERS = {"SiscoStMan": SiscoReader}
