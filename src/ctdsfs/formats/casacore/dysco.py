"""DyscoStMan (``table.f<N>``): Dysco-compressed visibilities and weights.

Facts used (Dysco's sources, as casacore 3.8 carries them in ``tables/Dysco``; every
number in the file is little-endian, whatever the table's byte order):

* the header: ``uint32`` header size, offset of the column headers, column count; the
  manager's name (``uint32`` length + bytes); ``uint32`` rows per block, antenna count,
  block size; ``uint16`` version major and minor (1.0); ``uint8`` data bits, weight
  bits, distribution (Gaussian, Uniform, StudentT, TruncatedGaussian), normalisation
  (AF, RF, Row); ``double`` Student-t nu and truncation. Then one header per column, in
  the table description's order: ``uint32`` its size, block size, antenna count;
* then blocks of ``rows per block`` rows (a time step: the rows per block and antenna
  count are those of the first time step written) at ``header size + n * block
  size``, each holding every column's part, one after the other in that order. A
  block past the end of the file reads as zeros, as do all rows while the rows per
  block is 0 (no time step was complete);
* a data column's part (Complex, cells of ``[channels, polarisations]``): ``float``
  factors, then the symbols, ``data bits`` each, packed from the lowest bit up, row by
  row, in each row channel by channel, polarisation by polarisation, real then
  imaginary. A value is ``float(double(table[symbol]) * factor)`` (see
  :mod:`.dysco_tables`), the factor in ``double``:

  - AF: the factors are one per channel and polarisation, then per polarisation one per
    antenna: factor = channel's * (antenna1's * antenna2's), the antennas of the row
    (ANTENNA1, ANTENNA2);
  - RF: one per channel and polarisation, then one per row and polarisation:
    factor = channel's * row's;
  - Row: one per row;

* the WEIGHT_SPECTRUM column's part: one ``float``, the block's largest weight, then
  one symbol of ``weight bits`` per row and channel: every polarisation's weight is
  ``float(symbol * double(largest / (2**bits - 1)))``.
"""

import struct
import threading

import numpy as np

from ...errors import FormatError
from ...io.decoded_cache import DecodedCache, shared_pool
from . import dysco_tables
from .base import TP_COMPLEX, TP_FLOAT, read_exact

HEADER_READ = 1 << 16
MAX_NAME = 4096
MAX_BLOCK = 1 << 30  # bytes of one block (every column's part)
ANTENNA_ROWS = 1 << 16  # rows of ANTENNA1/ANTENNA2 read at a time (AF needs each row's)
# a piece (see DyscoReader.read): a power of two rows, so the mount's reads of a power of
# two rows fall within one; at least 4 MiB, where numpy asks for huge pages
PIECE_BYTES = 8 << 20
PIECES_AHEAD = 3  # pieces decoded ahead of a reader going through a column
BITS = (2, 3, 4, 6, 8, 10, 12, 16)  # the symbol widths Dysco packs
NORMALISATIONS = ("AF", "RF", "Row")
AF, RF, ROW = 0, 1, 2
WEIGHT_COLUMN = "WEIGHT_SPECTRUM"  # Dysco tells the weight column by this name
PAGE = 4096
ZERO_TAIL = 8  # zero bytes after those read: the byte after the last symbol's
CHUNK_SYMBOLS = 1 << 20  # symbols decoded at a time: bounds each thread's working arrays
_WORKING = threading.local()  # each thread's working arrays (see _scratch)


def _scratch(name, count, dtype):
    """``count`` items of this thread's working array ``name``, reused from one block to the
    next: a fresh large array costs a page fault for every 4 KiB written to it."""
    held = getattr(_WORKING, name, None)
    if held is None or held.size < count or held.dtype != dtype:
        held = np.empty(count, dtype)
        setattr(_WORKING, name, held)
    return held[:count]


class _Part:
    """One column's part of each block."""

    def __init__(self, col, bits, offset, header):
        self.col, self.bits, self.offset = col, bits, offset
        self.weight = col.name == WEIGHT_COLUMN
        self.channels, self.pols = col.cell_shape
        self.symbols_per_row = self.channels if self.weight else self.channels * self.pols * 2
        rows, antennas = header["rows_per_block"], header["antennas"]
        if self.weight:
            self.meta = 1
        else:
            self.meta = {AF: self.pols * (self.channels + antennas),
                         RF: self.pols * (self.channels + rows),
                         ROW: rows}[header["normalization"]]
        self.symbol_bytes = (rows * self.symbols_per_row * bits + 7) // 8
        self.size = 4 * self.meta + self.symbol_bytes
        self.dtype = np.dtype(np.float32 if self.weight else np.complex64)
        row_bytes = self.channels * self.pols * self.dtype.itemsize
        self.piece_rows = 1 << max(0, (PIECE_BYTES // max(1, row_bytes)).bit_length() - 1)


class DyscoReader:
    def __init__(self, source, table, seqnr, columns, dm_info):
        self.source, self.table = source, table
        self.name = f"table.f{seqnr}"
        self.file_size = source.entry_size(self.name)
        head = self._parse_header(bytes(read_exact(
            source, self.name, 0, min(HEADER_READ, self.file_size), "header")), len(columns))
        self.rows_per_block, self.antennas = head["rows_per_block"], head["antennas"]
        self.normalization = head["normalization"]
        self.header_size = head["header_size"]
        distribution = head["distribution"]
        if distribution not in dysco_tables.NAMES:
            raise FormatError(f"{self.name}: distribution {distribution} is not Dysco's")
        if distribution == dysco_tables.STUDENT_T and \
                not dysco_tables.MIN_NU <= head["nu"] <= dysco_tables.MAX_NU:
            raise FormatError(f"{self.name}: StudentT with nu {head['nu']} is not decoded "
                              f"({dysco_tables.MIN_NU} to {dysco_tables.MAX_NU} are)")
        if distribution == dysco_tables.TRUNCATED_GAUSSIAN and \
                not 0 < head["truncation"] < float("inf"):
            raise FormatError(f"{self.name}: TruncatedGaussian at {head['truncation']}")
        self._table64 = dysco_tables.decode_table(
            head["data_bits"], distribution, head["nu"], head["truncation"]).astype(np.float64)
        self.parts, offset = {}, 0
        for col, column_header in zip(columns, head["columns"]):
            part = self._part(col, head, offset)
            if column_header != (part.size, self.antennas) and self.rows_per_block:
                raise FormatError(f"{self.name}: column {col.name}'s header (block size, "
                                  f"antennas) {column_header} is not its own "
                                  f"{(part.size, self.antennas)}")
            self.parts[col.name] = part
            offset += part.size
        self.block_size = offset
        if self.rows_per_block and offset != head["block_size"]:
            raise FormatError(f"{self.name}: block size {head['block_size']} is not the "
                              f"columns' {offset}")
        if offset > MAX_BLOCK:
            raise FormatError(f"{self.name}: blocks of {offset} bytes are too large")
        past = self.file_size - self.header_size
        self.blocks = past // offset if self.rows_per_block and past > 0 else 0
        self._antenna_chunks = {}
        self._lock = threading.Lock()
        self._pieces = DecodedCache((PIECES_AHEAD + 2) * PIECE_BYTES)
        self._generation = 0  # one more after each write: pieces decoded before are stale
        self._last_piece = {}  # column -> the last piece its previous read reached
        from . import dysco_kernels  # (numba: loaded for the tables that have Dysco columns)
        self._kernels = dysco_kernels

    def _parse_header(self, data, ncolumns):
        name = self.name

        def take(fmt, at):
            end = at + struct.calcsize(fmt)
            if end > len(data):
                raise FormatError(f"{name}: the header is cut short")
            return struct.unpack_from(fmt, data, at), end

        (header_size, column_at, ncol, length), at = take("<4I", 0)
        if length > MAX_NAME:
            raise FormatError(f"{name}: a manager name of {length} bytes")
        at += length
        (rows, antennas, block_size, major, minor, data_bits, weight_bits, distribution,
         normalization, nu, truncation), at = take("<3I2H4B2d", at)
        if (major, minor) != (1, 0):
            raise FormatError(f"{name}: Dysco file format {major}.{minor} (only 1.0 is known)")
        if ncol != ncolumns:
            raise FormatError(f"{name}: {ncol} columns in the file, {ncolumns} bound to it")
        for what, bits in (("data", data_bits), ("weight", weight_bits)):
            if bits not in BITS:
                raise FormatError(f"{name}: {bits} {what} bits per value (Dysco packs "
                                  f"{', '.join(map(str, BITS))})")
        if normalization >= len(NORMALISATIONS):
            raise FormatError(f"{name}: normalisation {normalization} is not Dysco's")
        if header_size > self.file_size or column_at > header_size:
            raise FormatError(f"{name}: header of {header_size} bytes, column headers at "
                              f"{column_at}, in a file of {self.file_size}")
        columns = []
        for _ in range(ncol):
            (size, col_block, col_antennas), _ = take("<3I", column_at)
            if size < 12:
                raise FormatError(f"{name}: a column header of {size} bytes")
            columns.append((col_block, col_antennas))
            column_at += size
        return {"header_size": header_size, "rows_per_block": rows, "antennas": antennas,
                "block_size": block_size, "data_bits": data_bits, "weight_bits": weight_bits,
                "distribution": distribution, "normalization": normalization, "nu": nu,
                "truncation": truncation, "columns": columns}

    def _part(self, col, head, offset):
        weight = col.name == WEIGHT_COLUMN
        wanted = TP_FLOAT if weight else TP_COMPLEX
        if col.data_type != wanted or not col.is_array or col.cell_shape is None or \
                len(col.cell_shape) != 2:
            raise FormatError(f"{self.name}: column {col.name} is not a Dysco "
                              f"{'weight' if weight else 'data'} column (2-D "
                              f"{'Float' if weight else 'Complex'} cells of one shape)")
        if head["rows_per_block"] * (col.cell_shape[0] * col.cell_shape[1] * 2 + 1) * 16 > \
                MAX_BLOCK * 8 or head["antennas"] > MAX_BLOCK:
            raise FormatError(f"{self.name}: {head['rows_per_block']} rows per block of "
                              f"{head['antennas']} antennas are too many")
        return _Part(col, head["weight_bits" if weight else "data_bits"], offset, head)

    def uniform_shape(self, col):
        return col.cell_shape

    def forget_cached(self):
        """Drop the antennas and pieces kept (the table's files were written)."""
        self._antenna_chunks = {}
        self._generation += 1

    def warm(self, col):
        """Decode a row of ``col`` on this thread (its kernels loaded; no piece kept, no
        thread started: a process may fork after it)."""
        self._decode(self.parts[col.name], 0, min(1, self.table.nrow))

    def read(self, col, start, stop):
        """Rows ``start..stop``: a reader going through the column in order gets them from
        pieces of about PIECE_BYTES decoded whole (a read within one is a read-only view
        of it, not a copy), the next pieces decoded ahead in other threads meanwhile
        (reading the file and the kernels release the GIL); other reads decode exactly
        their rows, as does a read whose piece holds a damaged block."""
        part = self.parts[col.name]
        if stop <= start or not self.rows_per_block:
            return self._decode(part, start, stop)
        first, last = start // part.piece_rows, (stop - 1) // part.piece_rows
        in_order = abs(first - self._last_piece.get(col.name, -1)) <= 1
        self._last_piece[col.name] = last
        if not in_order:
            return self._decode(part, start, stop)
        try:
            pieces = [self._piece(part, number) for number in range(first, last + 1)]
        except FormatError:
            return self._decode(part, start, stop)
        self._decode_ahead(part, last)
        rows = [piece[max(0, start - number * part.piece_rows):stop - number * part.piece_rows]
                for number, piece in enumerate(pieces, first)]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def decoded_already(self, col, start, stop):
        """Whether rows ``start..stop`` lie in pieces decoded (ahead) and kept."""
        part = self.parts[col.name]
        if stop <= start or not self.rows_per_block:
            return False
        return all(self._pieces.get((col.name, number), self._generation) is not None
                   for number in range(start // part.piece_rows,
                                       (stop - 1) // part.piece_rows + 1))

    def _piece_rows(self, part, number):
        start = number * part.piece_rows
        return start, min(self.table.nrow, start + part.piece_rows)

    def _decoded_piece(self, part, number):
        """Piece ``number`` as read-only bytes (the cache counts what it holds by length)."""
        data = self._decode(part, *self._piece_rows(part, number)).reshape(-1).view(np.uint8)
        data.flags.writeable = False
        return data

    def _piece(self, part, number):
        data = self._pieces.get_or_load((part.col.name, number), self._generation,
                                        lambda: self._decoded_piece(part, number))
        return data.view(part.dtype).reshape(-1, part.channels, part.pols)

    def _decode_ahead(self, part, last):
        pool = shared_pool("dysco-ahead", PIECES_AHEAD)
        count = -(-self.table.nrow // part.piece_rows)
        for number in range(last + 1, min(count, last + 1 + PIECES_AHEAD)):
            self._pieces.load_ahead((part.col.name, number), self._generation,
                                    lambda number=number: self._decoded_piece(part, number),
                                    pool.submit)

    def _decode(self, part, start, stop):
        """Rows ``start..stop`` decoded into a new array."""
        if stop <= start or not self.rows_per_block:
            return np.zeros((max(0, stop - start), part.channels, part.pols), part.dtype)
        # (not zeros: the memory of pieces dropped before is used again, not cleared)
        out = np.empty((stop - start, part.channels, part.pols), part.dtype)
        rows = self.rows_per_block
        antennas = None
        if not part.weight and self.normalization == AF:
            antennas = self._antennas(start, stop)
        with np.errstate(all="ignore"):  # (NaN and infinite values decode as such)
            for block in range(start // rows, (stop - 1) // rows + 1):
                first, end = max(start, block * rows), min(stop, (block + 1) * rows)
                if block >= self.blocks:  # (past the end of the file: zeros)
                    out[first - start:] = 0
                    break
                into = out[first - start:end - start]
                within = (first - block * rows, end - block * rows)
                if part.weight:
                    self._weights(part, block, within, into)
                else:
                    pair = None if antennas is None else \
                        (antennas[0][first - start:end - start],
                         antennas[1][first - start:end - start])
                    self._data(part, block, within, pair, into)
        return out

    def _antenna_rows(self, name, chunk):
        """Column ``name`` (ANTENNA1 or ANTENNA2) of the ``chunk``-th ANTENNA_ROWS rows, read
        once for the reads of all blocks in them (the last few kept)."""
        key = (name, chunk)
        with self._lock:  # (reads come from several threads)
            values = self._antenna_chunks.get(key)
        if values is None:
            first = chunk * ANTENNA_ROWS
            values = np.asarray(self.table.read_column(
                name, first, min(self.table.nrow, first + ANTENNA_ROWS)))
            with self._lock:
                if len(self._antenna_chunks) >= 4:
                    self._antenna_chunks.pop(next(iter(self._antenna_chunks)))
                self._antenna_chunks[key] = values
        return values

    def _antennas(self, start, stop):
        pair = []
        for name in ("ANTENNA1", "ANTENNA2"):
            values = np.concatenate([
                self._antenna_rows(name, chunk)[max(start - chunk * ANTENNA_ROWS, 0):
                                                stop - chunk * ANTENNA_ROWS]
                for chunk in range(start // ANTENNA_ROWS, (stop - 1) // ANTENNA_ROWS + 1)])
            if values.shape != (stop - start,) or (values < 0).any() or \
                    (values >= self.antennas).any():
                raise FormatError(f"{self.name}: {name} of rows {start}..{stop} is not an "
                                  f"antenna of the {self.antennas} its blocks hold")
            pair.append(values.astype(np.intp))
        return pair

    def _block_at(self, part, block):
        return self.header_size + block * self.block_size + part.offset

    def _read(self, name, offset, size, what):
        """Bytes ``offset .. offset + size`` of the file, then ZERO_TAIL zero bytes, in this
        thread's working array ``name``; from a source that reads into buffers, placed as
        the offset within a page (a copy from the page cache is slower otherwise)."""
        read_into = getattr(self.source, "read_into", None)
        if read_into is None:
            data = np.frombuffer(read_exact(self.source, self.name, offset, size, what),
                                 np.uint8)
            buffer = _scratch(name, size + ZERO_TAIL, np.uint8)
            buffer[:size] = data
        else:
            held = _scratch(name, size + ZERO_TAIL + PAGE, np.uint8)
            place = (offset - held.ctypes.data) % PAGE
            buffer = held[place:place + size + ZERO_TAIL]
            done = read_into(self.name, offset, buffer[:size])
            if done != size:
                raise FormatError(f"{self.name}: {what} (bytes {offset}..{offset + size}) "
                                  f"lies past the end of the file")
        buffer[size:] = 0
        return buffer

    def _factors(self, part, block):
        data = self._read("factors", self._block_at(part, block), 4 * part.meta,
                          "block factors")
        return data[:4 * part.meta].view("<f4").astype(np.float64)

    def _symbols(self, part, block, first, end):
        """(bytes, bit): the bytes holding the symbols of rows ``first..end`` of the block
        (a thread's working array), the first symbol at that bit of the first byte."""
        at = self._block_at(part, block) + 4 * part.meta
        begin, bit = divmod(first * part.symbols_per_row * part.bits, 8)
        stop = min(part.symbol_bytes, -(-end * part.symbols_per_row * part.bits // 8))
        return self._read("raw", at + begin, stop - begin, "block symbols"), bit

    def _block_start(self, part, block, rows):
        """(the block's factors, its symbols of ``rows`` as ``_symbols`` gives them): rows
        from the block's first are read with the factors before them in one read."""
        if rows[0]:
            return self._factors(part, block), self._symbols(part, block, *rows)
        size = 4 * part.meta
        stop = min(part.symbol_bytes, -(-rows[1] * part.symbols_per_row * part.bits // 8))
        data = self._read("raw", self._block_at(part, block), size + stop, "block")
        return data[:size].view("<f4").astype(np.float64), (data[size:], 0)

    def _chunks(self, part, within):
        """The rows ``within`` the block in runs of about CHUNK_SYMBOLS symbols."""
        step = max(1, CHUNK_SYMBOLS // part.symbols_per_row)
        return [(first, min(within[1], first + step))
                for first in range(within[0], within[1], step)]

    def _decoded(self, done):
        if not done:  # (the sizes are the reader's own: a kernel refusing them is a bug)
            raise FormatError(f"{self.name}: a block's sizes do not fit its kernel")

    def _weights(self, part, block, within, into):
        chunks = self._chunks(part, within)
        meta, symbols = self._block_start(part, block, chunks[0])
        scale = meta[0] / np.float64((1 << part.bits) - 1)
        for first, end in chunks:
            raw, bit = symbols if first == chunks[0][0] else \
                self._symbols(part, block, first, end)
            rows = into[first - within[0]:end - within[0]].reshape(-1)
            self._decoded(self._kernels.weight_values(raw, bit, part.bits, scale,
                                                      part.channels, part.pols, rows))

    def _row_factors(self, part, meta, first, end, antennas, within):
        """Each row's factor per polarisation (doubles, rows ``first..end`` of the block)."""
        pols = part.pols
        rest = meta[part.channels * pols:]
        if self.normalization == ROW:
            return np.repeat(meta[first:end], pols)
        if self.normalization == RF:
            return rest.reshape(-1, pols)[first:end].ravel()
        per_antenna = rest.reshape(pols, self.antennas).T
        rows = slice(first - within[0], end - within[0])
        return (per_antenna[antennas[0][rows]] * per_antenna[antennas[1][rows]]).ravel()

    def _data(self, part, block, within, antennas, into):
        """Each value ``float(double(table[symbol]) * factor)`` (see the module), a run of
        rows at a time."""
        chunks = self._chunks(part, within)
        meta, symbols = self._block_start(part, block, chunks[0])
        channel_factors = np.ones(part.channels * part.pols) if self.normalization == ROW \
            else meta[:part.channels * part.pols]
        for first, end in chunks:
            raw, bit = symbols if first == chunks[0][0] else \
                self._symbols(part, block, first, end)
            rows = into[first - within[0]:end - within[0]].view(np.float32).reshape(-1)
            self._decoded(self._kernels.data_values(
                raw, bit, part.bits, self._table64, channel_factors,
                self._row_factors(part, meta, first, end, antennas, within),
                part.channels, part.pols, rows))
