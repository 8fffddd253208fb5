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
from collections import deque

import numpy as np

from ...errors import FormatError
from .altmans import scalar_ints
from .base import TP_COMPLEX, read_exact

HEADER = 21
VERSION_MAJOR = 2
MODES = {0: "all", 0x4000: "diagonal", 0x8000: "stokes_i"}
STORED = {"diagonal": 2, "stokes_i": 1}
# prediction level -> (earlier values taken, whether the deepest predictor smooths) along
# the channels and along time: 1, 2, 3 or 4 values extrapolated (levels 0 to 3; 10 to
# 12 average, fit a line or a parabola with the deepest); 21 predicts along the channels
# as level 2 and along time as level 1; -1 stores the values themselves
LEVELS = {0: (1, False), 10: (2, True), 1: (2, False), 11: (3, True), 2: (3, False),
          12: (4, True), 3: (4, False)}
LEVELS = {**{level: (p, p) for level, p in LEVELS.items()},
          21: (LEVELS[2], LEVELS[1]), -1: ((0, False), (0, False))}
MAX_CHUNK = 64 << 20  # decompressed bytes of one chunk (casacore writes about 10 MiB)
INFLATE_RATIO = 1032  # deflate's largest ratio of inflated to deflated bytes
BATCH_VALUES = 1 << 18  # values decoded together
MAX_HISTORY = 1 << 30  # bytes of the baselines' last items
RECENT_BYTES = 16 << 20  # decoded rows kept for reads handed over out of order
ID_ROWS = 1 << 18  # rows whose ids are read at a time to count the baselines
BASELINE_IDS = ("FIELD_ID", "DATA_DESC_ID", "ANTENNA1", "ANTENNA2")  # a baseline's ids


class _Chunks:
    """The file's chunks, decompressed one at a time, handing out items in order."""

    def __init__(self, source, name, level):
        self.source, self.name, self.level = source, name, level
        self.size = source.entry_size(name)
        self.at, self.values, self.used = HEADER, 0, 0
        self.planes = None

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
            inflate = zlib.decompressobj(-15)
            plain = inflate.decompress(bytes(data), full)
        except zlib.error as exc:
            raise FormatError(f"{self.name}: chunk does not inflate ({exc})") from None
        if len(plain) != full or not inflate.eof:
            raise FormatError(f"{self.name}: chunk inflates to {len(plain)} bytes, not {full}")
        self.planes = np.frombuffer(plain, np.uint8)
        self.values, self.used = full // width, 0

    def take(self, count, channels):
        """The next ``count`` items of ``channels`` channels (two parts each: real,
        imaginary), as runs within one chunk: (its byte planes, its values, the first
        value of the run, the run's items)."""
        width = 2 * channels
        while count:
            if self.used >= self.values:
                self._next_chunk()
            fit = min(count, (self.values - self.used) // width)
            if fit == 0:
                raise FormatError(f"{self.name}: an item of {channels} channels passes its "
                                  "chunk's end")
            yield self.planes, self.values, self.used, fit
            self.used += fit * width
            count -= fit


class _Stream:
    """The column's cells decoded from the first row on, some rows at a time, each item
    after the one before it, keeping each baseline's last few items."""

    def __init__(self, reader, col, ids=None):
        """``ids``: the baselines' numbers (None: every row's, counted now)."""
        self.reader, self.row = reader, 0
        self.chunks = _Chunks(reader.source, reader.name, reader.level)
        self.channels, self.correlations = col.cell_shape
        self.stored = STORED.get(reader.mode, self.correlations)
        self.along_channels, self.along_time = LEVELS[reader.level]
        # each key's (baseline, correlation and part's) last items, newest first: m, e, s
        # of each channel; made whole at once (new pages, not a copy each time it grew)
        shape = (self.along_time[0], 3, self.channels)
        per_baseline = 2 * self.stored * 8 * int(np.prod(shape))  # bytes of its history
        self.ids = reader.baseline_ids(MAX_HISTORY // max(1, per_baseline)) if ids is None \
            else ids
        self.history = np.zeros((2 * self.stored * len(self.ids),) + shape, np.int64)
        self.held = np.zeros(len(self.history), np.int64)  # items in each key's history
        self.batch = max(1, BATCH_VALUES // max(1, 2 * self.stored * self.channels))

    def _baselines(self, count):
        """Each item's baseline and correlation number, for rows ``row..row+count``."""
        combos = self.reader.id_combos(self.row, self.row + count)
        unique, inverse = np.unique(combos, return_inverse=True)
        try:
            numbers = np.array([self.ids[combo] for combo in unique.tolist()], np.int64)
        except KeyError:  # (the ids changed since they were counted)
            raise FormatError(f"{self.reader.name}: rows {self.row}..{self.row + count} "
                              "have ids not counted before") from None
        return (numbers[inverse.ravel()][:, None] * self.stored +
                np.arange(self.stored)).ravel()

    def rows(self, count):
        """The next ``count`` rows' cells (count, channels, correlations) as complex64."""
        baselines = self._baselines(count)
        cells = np.zeros((count, self.channels, self.correlations), np.complex64)
        self.row += count
        if not self.channels:
            return cells
        keys = (baselines[:, None] * 2 + np.arange(2)).ravel()
        bits = np.empty(len(keys) * self.channels, np.uint32)
        done = 0
        for planes, values, used, fit in self.chunks.take(len(baselines), self.channels):
            span = slice(2 * done, 2 * (done + fit))
            if not self.reader.kernels.decode_items(
                    planes, values, used, fit, self.channels, keys[span], self.history,
                    self.held, self.along_channels, self.along_time,
                    bits[span.start * self.channels:span.stop * self.channels]):
                raise FormatError(f"{self.reader.name}: a run of items does not fit its "
                                  "kernel")
            done += fit
        values = bits.view(np.float32).reshape(count, self.stored, 2, self.channels)
        if self.reader.mode == "all":
            cells.real, cells.imag = (values[:, :, part].transpose(0, 2, 1) for part in (0, 1))
        else:  # Stokes I as [I, 0, 0, I], the diagonal as [XX, 0, 0, YY]
            for column, pol in ((0, 0), (3, self.stored - 1)):
                cells.real[..., column] = values[:, pol, 0]
                cells.imag[..., column] = values[:, pol, 1]
        return cells


class SiscoReader:
    """A SiscoStMan column (see the module); fixed-shape columns only."""

    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.table, self.name = source, table, f"table.f{seqnr}"
        self.size = source.entry_size(self.name)
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
        self._stream, self._recent, self._lock = None, deque(), threading.Lock()
        self._ids = None  # see baseline_ids
        from . import sisco_predict  # (numba: loaded for the tables that have Sisco columns)
        self.kernels = sisco_predict

    def id_combos(self, start, stop):
        """Rows ``start..stop``'s (FIELD_ID, DATA_DESC_ID, ANTENNA1, ANTENNA2), one record
        a row."""
        combos = np.empty(stop - start, [(name, np.int64) for name in BASELINE_IDS])
        for name in BASELINE_IDS:
            combos[name] = scalar_ints(self.table, name, start, stop)
        return combos

    def baseline_ids(self, most):
        """{(FIELD_ID, DATA_DESC_ID, ANTENNA1, ANTENNA2): its number} of every row's
        baseline, counted before decoding, so that the history is made once at its size;
        more than ``most`` baselines are refused."""
        ids = self._ids
        if ids is None:
            ids = {}
            for first in range(0, self.table.nrow, ID_ROWS):
                combos = self.id_combos(first, min(self.table.nrow, first + ID_ROWS))
                for combo in np.unique(combos).tolist():
                    ids.setdefault(combo, len(ids))
                if len(ids) > most:
                    break
            else:
                self._ids = ids
        if len(ids) > most:
            raise FormatError(f"{self.name}: more than {most} baselines keep more history "
                              "than this reader holds")
        return ids

    def warm(self, col):
        """Decode a row of ``col`` (its kernels loaded; no thread started), its baseline
        alone counted: the rows' ids are read when the column is."""
        self._check(col, min(1, self.table.nrow))
        if self.table.nrow:
            first = self.id_combos(0, 1).tolist()[0]
            _Stream(self, col, {first: 0}).rows(1)

    def forget_cached(self):
        """Drop the rows, the ids and the stream kept (the table's files were written)."""
        with self._lock:
            self._stream, self._recent, self._ids = None, deque(), None

    def read(self, col, start, stop):
        shape = self._check(col, stop)
        out = np.empty((max(0, stop - start),) + tuple(shape), np.complex64)
        if stop <= start:
            return out
        with self._lock:
            stream = self._stream
            kept = self._recent[0][0] if self._recent else None
            if stream is None or (start < stream.row and (kept is None or start < kept)):
                stream, self._recent = _Stream(self, col), deque()
                self._stream = stream
            self._copy_recent(start, stop, out)  # (rows decoded before: all kept from ``start``)
            try:
                while stream.row < stop:
                    first = stream.row
                    until = min(stop if first >= start else start, first + stream.batch)
                    cells = stream.rows(until - first)
                    if first >= start:
                        out[first - start:until - start] = cells
                    self._keep(first, cells)
            except FormatError:
                self._stream, self._recent = None, deque()
                raise
        return out

    def _check(self, col, stop):
        """``col``'s cell shape, or why this reader does not decode it or its rows to
        ``stop`` (checked before anything is made at the size the table names: the
        stream decodes from the first row, so those rows' items must fit the file)."""
        if col.data_type != TP_COMPLEX:
            raise FormatError(f"SiscoStMan stores Complex columns, not {col.type_name}")
        shape = col.checked_shape()
        if shape is None or len(shape) != 2:
            raise FormatError("a SiscoStMan column without a fixed 2-D cell shape is not "
                              "decoded")
        if self.mode != "all" and shape[1] != 4:
            raise FormatError(f"a Sisco {self.mode} column shows 4 correlations, not "
                              f"{shape[1]}")
        item = 2 * shape[0] * (4 if self.level == -1 else 5)  # (its bytes, inflated)
        row = STORED.get(self.mode, shape[1]) * item
        if item > MAX_CHUNK or row > INFLATE_RATIO * MAX_CHUNK or \
                stop * row > INFLATE_RATIO * self.size:
            raise FormatError(f"{self.name}: rows to {stop} of cells of shape {list(shape)} "
                              f"are more than its {self.size} bytes hold")
        return shape

    def _keep(self, first, cells):
        """Keep the latest rows decoded (up to RECENT_BYTES): a read that the kernel hands
        over after the one following it, or one that starts a row before the previous one
        ended (as the mount's reads of rows that straddle them do), finds its rows here,
        not by decoding anew from the first row."""
        self._recent.append((first, cells))
        while len(self._recent) > 1 and \
                sum(c.nbytes for _, c in self._recent) > RECENT_BYTES:
            self._recent.popleft()

    def _copy_recent(self, start, stop, out):
        for first, cells in self._recent:
            a, b = max(start, first), min(stop, first + len(cells))
            if a < b:
                out[a - start:b - start] = cells[a - first:b - first]


DECODERS = {"SiscoStMan": SiscoReader}
