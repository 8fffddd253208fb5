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
from . import dysco_tables
from .base import TP_COMPLEX, TP_FLOAT, read_exact

HEADER_READ = 1 << 16
MAX_NAME = 4096
MAX_BLOCK = 1 << 30  # bytes of one block (every column's part)
ANTENNA_ROWS = 1 << 16  # rows of ANTENNA1/ANTENNA2 read at a time (AF needs each row's)
# bits -> (bytes, symbols) of the smallest run of whole bytes holding whole symbols
GROUPS = {2: (1, 4), 3: (3, 8), 4: (1, 2), 6: (3, 4), 8: (1, 1), 10: (5, 4), 12: (3, 2),
          16: (2, 1)}
NORMALISATIONS = ("AF", "RF", "Row")
AF, RF, ROW = 0, 1, 2
WEIGHT_COLUMN = "WEIGHT_SPECTRUM"  # Dysco tells the weight column by this name


def unpack_symbols(raw, bits, skip, count):
    """Symbols ``skip .. skip + count`` of ``raw`` (starting where a group of whole bytes
    starts), ``bits`` each, packed from the lowest bit up, as ``intp`` (numpy's ``take``
    converts narrower indices slowly). A symbol of the widths Dysco packs lies within
    the two bytes from the one it starts in: the j-th symbol of every group is cut at
    once from those bytes read as little-endian words, a group's size apart."""
    size, per = GROUPS[bits]
    groups = -(-(skip + count) // per)
    if bits in (8, 16):  # (a symbol a group: nothing to skip)
        return np.frombuffer(raw, "<u1" if bits == 8 else "<u2", count).astype(np.intp)
    padded = np.zeros(groups * size + 1, np.uint8)  # (a last group cut short, and the
    available = min(len(raw), groups * size)       # byte after it, read as zeros)
    padded[:available] = np.frombuffer(raw, np.uint8, available)
    out = np.empty((groups, per), np.intp)
    part = np.empty(groups, np.uint16)
    mask = np.uint16((1 << bits) - 1)
    for j in range(per):
        first, shift = divmod(j * bits, 8)
        words = np.ndarray((groups,), "<u2", buffer=padded, offset=first, strides=(size,))
        np.right_shift(words, shift, out=part)
        np.bitwise_and(part, mask, out=out[:, j])
    return out.reshape(-1)[skip:skip + count]


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
        self._table = dysco_tables.decode_table(head["data_bits"], distribution, head["nu"],
                                                head["truncation"])
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
            if bits not in GROUPS:
                raise FormatError(f"{name}: {bits} {what} bits per value (Dysco packs "
                                  f"{', '.join(map(str, GROUPS))})")
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
        """Drop the antennas kept (the table's files were written)."""
        self._antenna_chunks = {}

    def read(self, col, start, stop):
        part = self.parts[col.name]
        out = np.zeros((stop - start, part.channels, part.pols),
                       np.float32 if part.weight else np.complex64)
        if stop <= start or not self.rows_per_block:
            return out
        rows = self.rows_per_block
        antennas = None
        if not part.weight and self.normalization == AF:
            antennas = self._antennas(start, stop)
        for block in range(start // rows, (stop - 1) // rows + 1):
            if block >= self.blocks:
                break
            first, end = max(start, block * rows), min(stop, (block + 1) * rows)
            into = out[first - start:end - start]
            within = (first - block * rows, end - block * rows)
            if part.weight:
                self._weights(part, block, within, into)
            else:
                pair = None if antennas is None else \
                    (antennas[0][first - start:end - start], antennas[1][first - start:end - start])
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

    def _symbols(self, part, block, within):
        """(factors, symbols of the rows ``within`` the block)."""
        at = self.header_size + block * self.block_size + part.offset
        meta = np.frombuffer(read_exact(self.source, self.name, at, 4 * part.meta,
                                        "block factors"), "<f4")
        size, per = GROUPS[part.bits]
        first_symbol = within[0] * part.symbols_per_row
        count = (within[1] - within[0]) * part.symbols_per_row
        group = first_symbol // per
        begin = group * size
        end = min(part.symbol_bytes, -(-(first_symbol + count) // per) * size)
        raw = read_exact(self.source, self.name, at + 4 * part.meta + begin, end - begin,
                         "block symbols")
        symbols = unpack_symbols(np.frombuffer(raw, np.uint8), part.bits,
                                 first_symbol - group * per, count)
        return meta.astype(np.float64), symbols

    def _weights(self, part, block, within, into):
        meta, symbols = self._symbols(part, block, within)
        scale = meta[0] / np.float64((1 << part.bits) - 1)
        values = (symbols.astype(np.float64) * scale).astype(np.float32)
        into[...] = values.reshape(-1, part.channels, 1)

    def _data(self, part, block, within, antennas, into):
        meta, symbols = self._symbols(part, block, within)
        channels, pols = part.channels, part.pols
        nrow = within[1] - within[0]
        if self.normalization == ROW:
            factor = meta[within[0]:within[1]].reshape(nrow, 1, 1)
        else:
            per_channel = meta[:channels * pols].reshape(1, channels, pols)
            rest = meta[channels * pols:]
            if self.normalization == RF:
                per_row = rest.reshape(-1, pols)[within[0]:within[1]]
            else:
                per_antenna = rest.reshape(pols, self.antennas).T
                per_row = per_antenna[antennas[0]] * per_antenna[antennas[1]]
            factor = per_channel * per_row.reshape(nrow, 1, pols)
        values = np.take(self._table, symbols).reshape(nrow, channels, pols, 2)
        out = into.view(np.float32).reshape(values.shape)
        for part in (0, 1):  # real, imaginary: one factor for both, a double product
            np.multiply(values[..., part], factor, out=out[..., part], dtype=np.float64,
                        casting="unsafe")
