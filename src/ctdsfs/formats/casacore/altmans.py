"""casacore 3.7-3.8's alternate storage managers (``tables/AlternateMans``) that keep a
MeasurementSet's columns in less room: AntennaPairStMan, UvwStMan and StokesIStMan.

Facts used (AntennaPairFile.h, UvwFile.h, StokesIStMan.cc, StokesIStManColumn.h,
StokesIConversions.h, BufferedColumnarFile.h, RowBasedFile.h, BitPacking.h): each
manager writes one "row-based file" ``table.f<N>`` with POSIX calls, beside ``table.mf``
when the table is stored as a MultiFile (not inside it), always little-endian:

* a private header: ``u32`` tag ``Crbf``, ``u32`` version (major in bits 8-15: at most
  1), ``u32`` its own size, ``u64`` stride (bytes a row), ``u64`` the size of the
  manager's header that follows it; then rows of ``stride`` bytes up to the end of the
  file (a partial last row does not count);
* AntennaPairStMan: header ``AntPair\\0`` and ``u64`` rows in the repeating pattern;
  rows are ``i32`` pairs (ANTENNA1, ANTENNA2). A pattern of 0 rows (never repeated) has
  one pair a row (``INT32_MIN``: not written); else row ``r`` is pair ``r % pattern``;
* UvwStMan: header ``Uvw-col\\0``, ``u64`` rows a block (one time step), ``u64``
  reference antenna, ``u64`` antennas; for each block, one row of three doubles per
  antenna but the reference (whose position is 0): antenna ``a`` at file row
  ``block * (antennas - 1) + (a if a < reference else a - 1)``. A table row's UVW is
  antenna2's minus antenna1's (ANTENNA1/ANTENNA2 read from the table), as doubles;
* StokesIStMan: header ``StkIcol\\0``; each row holds its columns one after another (in
  the table's column order), each a cell's Stokes I: per channel one Complex or Float
  (expanded to ``[v, 0, 0, v]``) or one bit (Bools, lowest bit first, each expanded to
  all four correlations). Rows past the file's read as zeros (False).
"""

import numpy as np

from ...errors import FormatError
from .base import TP_BOOL, TP_COMPLEX, TP_DOUBLE, TP_FLOAT, TP_INT, read_aligned, read_exact

ROW_FILE_TAG = b"Crbf"
ROW_FILE_MAJOR = 1
PRIVATE_HEADER = 28  # what casacore reads of it, whatever size it names
MAX_SPAN = 256 << 20  # bytes of a row file read for one range of table rows
UNSET_ANTENNA = -(1 << 31)
MAX_ROWS = 1 << 62  # row numbers past it do not fit the int64 arithmetic of the readers


class RowFile:
    """The row-based file a manager of ``tables/AlternateMans`` writes (see the module)."""

    def __init__(self, source, name, tag, header_size):
        self.source, self.name = source, name
        size = source.entry_size(name)
        head = read_exact(source, name, 0, min(size, PRIVATE_HEADER), "row file header")
        if len(head) < PRIVATE_HEADER or bytes(head[:4]) != ROW_FILE_TAG:
            raise FormatError(f"{name}: not a casacore row-based file (no 'Crbf' header)")
        version, private = (int.from_bytes(head[i:i + 4], "little") for i in (4, 8))
        self.stride, user = (int.from_bytes(head[i:i + 8], "little") for i in (12, 20))
        if (version & 0xFF00) >> 8 > ROW_FILE_MAJOR:
            raise FormatError(f"{name}: row file version {version:#x} needs a newer reader")
        if user != header_size:
            raise FormatError(f"{name}: manager header of {user} bytes, not {header_size}")
        self.data_at = private + header_size
        if private > size or self.data_at > size:
            raise FormatError(f"{name}: headers of {self.data_at} bytes pass the end of the "
                              f"file ({size} bytes)")
        self.header = bytes(read_exact(source, name, private, header_size, "manager header"))
        if self.header[:8] != tag:
            raise FormatError(f"{name}: manager header tag {self.header[:8]!r}, not {tag!r}")
        self.nrows = 0 if self.stride == 0 else (size - self.data_at) // self.stride

    def u64(self, at):
        return int.from_bytes(self.header[at:at + 8], "little")

    def rows(self, first, count):
        """File rows ``first..first+count`` as a ``uint8`` array (count, stride)."""
        if first < 0 or count < 0 or first + count > self.nrows:
            raise FormatError(f"{self.name}: rows {first}..{first + count} of "
                              f"{self.nrows}")
        if count * self.stride > MAX_SPAN:
            raise FormatError(f"{self.name}: {count} rows of {self.stride} bytes is more "
                              "than one read decodes")
        data = read_aligned(self.source, self.name, self.data_at + first * self.stride,
                            count * self.stride, f"rows {first}..{first + count}")
        return data.reshape(count, self.stride)


def scalar_ints(table, name, start, stop):
    """Rows ``start..stop`` of the table's Int scalar column ``name`` (int64): a manager
    that computes its values from other columns (UvwStMan, SiscoStMan) reads them here."""
    col = table.columns.get(name)
    if col is None or col.data_type != TP_INT or col.is_array:
        raise FormatError(f"the table has no Int column {name}, which this manager needs")
    values = table.read_column(name, start, stop)
    if not isinstance(values, np.ndarray) or values.shape != (stop - start,):
        raise FormatError(f"{name} is not a scalar column of {stop - start} rows")
    return values.astype(np.int64)


def _needs(col, types, what):
    if col.data_type not in types:
        raise FormatError(f"{what} does not store a column of type {col.type_name}")


class AntennaPairReader:
    """ANTENNA1 and ANTENNA2 as one pattern of pairs (see the module)."""

    def __init__(self, source, table, seqnr, columns, dm_info):
        self.name = f"table.f{seqnr}"
        self.file = RowFile(source, self.name, b"AntPair\0", 16)
        if self.file.stride < 8:
            raise FormatError(f"{self.name}: rows of {self.file.stride} bytes hold no pair")
        self.pattern = self.file.u64(8)
        if self.pattern > self.file.nrows:
            raise FormatError(f"{self.name}: a pattern of {self.pattern} rows, the file "
                              f"holds {self.file.nrows}")

    def read(self, col, start, stop):
        _needs(col, (TP_INT,), "AntennaPairStMan")
        which = {"ANTENNA1": 0, "ANTENNA2": 1}.get(col.name)
        if which is None:
            raise FormatError(f"AntennaPairStMan stores ANTENNA1 and ANTENNA2, not {col.name}")
        if stop <= start:
            return np.zeros(0, np.int32)
        if self.pattern == 0:
            if stop > self.file.nrows:
                raise FormatError(f"{self.name}: rows to {stop} asked, {self.file.nrows} "
                                  "written and no repeating pattern found")
            first, index = start, np.arange(stop - start)
            count = stop - start
        else:
            first = start % self.pattern
            if first + stop - start <= self.pattern:
                count, index = stop - start, np.arange(stop - start)
            else:
                first, count = 0, self.pattern
                index = np.arange(start, stop) % self.pattern
        pairs = self.file.rows(first, count)[:, :8].copy().view("<i4")[index, which]
        if self.pattern == 0 and (pairs == UNSET_ANTENNA).any():
            raise FormatError(f"{self.name}: {col.name} of a row was never written")
        return pairs.astype(np.int32)


class UvwReader:
    """UVW recomputed from per-antenna positions, one set a time step (see the module)."""

    def __init__(self, source, table, seqnr, columns, dm_info):
        self.table, self.name = table, f"table.f{seqnr}"
        self.file = RowFile(source, self.name, b"Uvw-col\0", 32)
        if self.file.stride < 24:
            raise FormatError(f"{self.name}: rows of {self.file.stride} bytes hold no UVW")
        self.per_block, self.reference, self.antennas = (self.file.u64(i) for i in (8, 16, 24))
        if self.per_block > MAX_ROWS:
            raise FormatError(f"{self.name}: {self.per_block} rows a time step")
        self.nrows = 0
        if self.antennas > 1:
            if self.file.nrows % (self.antennas - 1):
                raise FormatError(f"{self.name}: {self.file.nrows} rows are not a multiple of "
                                  f"{self.antennas - 1}")
            self.nrows = self.file.nrows // (self.antennas - 1) * self.per_block
        elif self.antennas == 1:
            self.nrows = self.per_block
        if self.nrows and self.antennas <= self.reference:
            raise FormatError(f"{self.name}: reference antenna {self.reference} of "
                              f"{self.antennas}")

    def _antennas(self, name, start, stop):
        values = scalar_ints(self.table, name, start, stop)
        if ((values < 0) | (values >= self.antennas)).any():
            raise FormatError(f"{self.name}: {name} names an antenna past the file's "
                              f"{self.antennas}")
        return values

    def read(self, col, start, stop):
        _needs(col, (TP_DOUBLE,), "UvwStMan")
        if col.cell_shape != (3,):
            raise FormatError("UvwStMan stores cells of shape [3]")
        if stop <= start:
            return np.zeros((0, 3))
        if stop > self.nrows:
            raise FormatError(f"{self.name}: rows to {stop} asked, the file holds "
                              f"{self.nrows}")
        antenna1 = self._antennas("ANTENNA1", start, stop)
        antenna2 = self._antennas("ANTENNA2", start, stop)
        block = np.arange(start, stop) // self.per_block
        stored = self.antennas - 1
        first, last = int(block[0]), int(block[-1])
        rows = self.file.rows(first * stored, (last + 1 - first) * stored)
        positions = np.zeros((last + 1 - first, self.antennas, 3))
        if stored:
            values = rows[:, :24].copy().view("<f8").reshape(-1, stored, 3)
            others = [a for a in range(self.antennas) if a != self.reference]
            positions[:, others] = values
        block -= first
        return positions[block, antenna2] - positions[block, antenna1]


class StokesIReader:
    """Columns stored as their Stokes I, four correlations shown (see the module)."""

    def __init__(self, source, table, seqnr, columns, dm_info):
        self.name = f"table.f{seqnr}"
        self.file = RowFile(source, self.name, b"StkIcol\0", 8)
        self.places, offset = {}, 0
        for col in columns:
            size = self._stored_size(col)
            self.places[col.name] = (offset, size)
            offset += size
            if offset > self.file.stride:
                raise FormatError(f"{self.name}: the columns take {offset} bytes of a "
                                  f"{self.file.stride}-byte row")

    @staticmethod
    def _stored_size(col):
        _needs(col, (TP_BOOL, TP_FLOAT, TP_COMPLEX), "StokesIStMan")
        if col.cell_shape is None or len(col.cell_shape) != 2 or col.cell_shape[1] != 4:
            raise FormatError(f"StokesIStMan shows cells of 4 correlations, {col.name} has "
                              f"shape {col.cell_shape}")
        channels = col.cell_shape[0]
        return (channels + 7) // 8 if col.data_type == TP_BOOL else \
            channels * (8 if col.data_type == TP_COMPLEX else 4)

    def read(self, col, start, stop):
        offset, size = self.places[col.name]
        channels = col.cell_shape[0]
        out = np.zeros((stop - start, channels, 4), col.dtype)
        held = max(0, min(stop, self.file.nrows) - start)
        if held == 0:
            return out
        cells = self.file.rows(start, held)[:, offset:offset + size]
        if col.data_type == TP_BOOL:
            bits = np.unpackbits(cells, axis=1, bitorder="little")[:, :channels]
            out[:held] = bits.astype(bool)[:, :, None]
            return out
        values = cells.copy().view("<c8" if col.data_type == TP_COMPLEX else "<f4")
        out[:held, :, 0] = values
        out[:held, :, 3] = values
        return out


DECODERS = {"AntennaPairStMan": AntennaPairReader, "UvwStMan": UvwReader,
            "StokesIStMan": StokesIReader}
