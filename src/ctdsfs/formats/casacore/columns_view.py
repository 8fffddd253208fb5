"""``columns/``: a casacore table's columns as NumPy files, decoded lazily.

For a table read through a source (see :mod:`.casacore_base`) the view shows:

* ``NAME.npy`` for each numeric or Bool column whose cells all have one shape: shape
  ``(nrow, *cell_shape)``, dtype as ``getcol`` gives; a read of a byte range decodes
  only the rows it touches (a sequential reader's small reads: blocks of about
  1 MiB, the last two kept);
* ``NAME.offsets.npy`` (uint64, nrow + 1) and ``NAME.data`` (UTF-8) for String scalars;
* for a numeric variable-shape column: ``NAME.shapes.npy`` (int64, nrow x ndim, -1 in
  undefined rows), ``NAME.offsets.npy`` (uint64, nrow + 1: each row's first element)
  and ``NAME.values.npy`` (all cells' elements, each cell in C order), from which
  ``values[offsets[i]:offsets[i+1]].reshape(shapes[i])`` is ``getvarcol``'s row i;
* for a String array column (any shape) the same, its elements shown as a String scalar
  column is: ``NAME.values.offsets.npy`` (uint64, one more than the elements) into the
  UTF-8 bytes of ``NAME.values.data``;
* ``table.json``: the table's and every column's keywords, type, shape and data manager,
  and which files show the column (none: a manager not decoded; or a column that does
  not decode, with its ``error``).

The files of String and variable-shape columns are decoded when the view is first listed
(their sizes are known only from their values): a column that fails then is left out,
and the rest of the listing stands. ``NAME.npy`` files are decoded as they are read: a
failure there is EIO for the read.

When the table's source is writable (``-o rw,columns``), a write into ``NAME.npy``
stores the cells it changes (see :mod:`.casacore_cell_write`); every other change here
is refused (EPERM) before anything changes.
"""

import json
import logging
import math
import re
import threading

import numpy as np

from ...container import DerivedView
from ...errors import BlockError, FormatError, NotPermitted, ReadOnlyError
from ...io.lazy_files import LazyBytes
from ...io.npy import npy_header
from .base import TP_BOOL, TP_STRING, TP_UCHAR
from .cell_write import commits_atomically, why_not_written, write_cells
from .columns import StringColumn, VarShapeColumn, open_table

BLOCK_BYTES = 1 << 20
MAX_FILE_SIZE = (1 << 63) - 1  # what a file's size (off_t) holds
_SURROGATE = re.compile("[\ud800-\udfff]")

log = logging.getLogger(__name__)


class _ColumnNpy:
    """``NAME.npy`` of a column with one cell shape: rows decoded as reads reach them.

    A read decodes the rows it covers and no others (a ranged read of rows a..b
    reaches only the tiles or buckets holding them; the kernel's 1 MiB reads of a
    sequential reader too: decoding about 1 MiB at a time keeps its copies in the CPU's
    caches; reads in flight in worker threads are decoded side by side, not in turn,
    and a local table's are decoded on the mount's loop: see ColumnsView.cached).
    A reader going through the file in smaller reads gets blocks of about BLOCK_BYTES,
    each decoded once and kept for the reads that follow; the kernel may hand two such
    reads over out of order, so a read up to a block past what is held still counts
    as going through. At most two blocks are kept."""

    def __init__(self, table, name, cell_shape, dtype, label=None):
        self.table, self.name, self.cell_shape = table, name, tuple(cell_shape)
        self.label = label or name
        self.dtype = np.dtype(dtype)
        self.header = npy_header(self.dtype.str, (table.nrow,) + tuple(cell_shape))
        self.row_bytes = math.prod(cell_shape) * self.dtype.itemsize
        if self.size() > MAX_FILE_SIZE:  # (the shape is table.dat's: untrusted)
            raise FormatError(f"column {name}: {table.nrow} rows of cells of shape "
                              f"{list(cell_shape)} pass the largest file size")
        # a power of two, blocks starting at its multiples: tiles hold a power of two
        # rows in practice, and a block that starts and ends where tiles do is cut from
        # its tiles without a copy
        rows = max(1, BLOCK_BYTES // max(1, self.row_bytes))
        self.rows_per_block = 1 << (rows.bit_length() - 1)
        self._exact = (0, 0, memoryview(b""))  # (first row, end row, bytes) of a ranged read
        self._blocks = {}  # block number -> its bytes (the last two used)
        self._generation = 0  # one more after each write: a decode begun before it is not kept
        self._lock = threading.Lock()

    def size(self):
        return len(self.header) + self.table.nrow * self.row_bytes

    def _decode(self, first, stop):
        """Rows ``first..stop`` as read-only bytes (the array's own: reads hand out slices);
        rows that do not decode are a BlockError (EIO for the read)."""
        try:
            values = self.table.read_column(self.name, first, stop)
        except FormatError as exc:
            raise BlockError(str(exc)) from None
        if not isinstance(values, np.ndarray) or values.dtype != self.dtype or \
                values.shape != (stop - first,) + self.cell_shape:
            raise BlockError(f"column {self.name}: rows {first}..{stop} changed shape")
        return memoryview(np.ascontiguousarray(values)).cast("B").toreadonly()

    def _block(self, number):
        """Block ``number``'s bytes: kept, or decoded now."""
        data = self._blocks.get(number)
        if data is None:
            first = number * self.rows_per_block
            data = self._decode(first, min(self.table.nrow, first + self.rows_per_block))
            self._blocks[number] = data
        return data

    def _going_through(self, first):
        """Whether a read from row ``first`` carries on from the rows held (or is at most a
        block past them: the kernel's reads may come in out of order)."""
        starts = [self._exact[0]] + [n * self.rows_per_block for n in self._blocks]
        ends = [self._exact[1]] + [(n + 1) * self.rows_per_block for n in self._blocks]
        return any(a <= first <= b + self.rows_per_block
                   for a, b in zip(starts, ends) if b > 0)

    def _block_numbers(self, first, end, size):
        """The blocks a read of ``size`` bytes (rows ``first..end``) may be answered from:
        a read under a block's size, over at most two blocks; else None."""
        block = self.rows_per_block
        numbers = range(first // block, (end - 1) // block + 1)
        return numbers if size < block * self.row_bytes and len(numbers) <= 2 else None

    def _in_blocks(self, first, end, size):
        """The block numbers a read of ``size`` bytes (rows ``first..end``) is answered
        from, or None when it decodes its own rows."""
        numbers = self._block_numbers(first, end, size)
        if numbers is not None and (all(n in self._blocks for n in numbers)
                                    or self._going_through(first)):
            return numbers
        return None

    def _rows(self, first, end, size):
        """(first row held, bytes) of decoded rows that include rows ``first..end``."""
        with self._lock:
            held_first, held_end, data = self._exact
            if held_first <= first and end <= held_end:
                return held_first, data
            numbers = self._in_blocks(first, end, size)
            if numbers is not None:
                return self._from_blocks(first, end, numbers)
            generation = self._generation
        data = self._decode(first, end)  # outside the lock: reads in flight side by side
        with self._lock:
            if generation == self._generation:  # (no write came in between)
                self._exact = (first, end, data)
        return first, data

    def _from_blocks(self, first, end, numbers):
        parts = [self._block(n) for n in numbers]
        for n in [n for n in self._blocks if n not in numbers]:
            if len(self._blocks) > 2:
                del self._blocks[n]
        block = self.rows_per_block
        if len(parts) == 1:
            return numbers[0] * block, parts[0]
        # rows on both sides of a block boundary: their bytes joined (one read's)
        rb, cut = self.row_bytes, numbers[1] * block
        return first, memoryview(b"".join((parts[0][(first - numbers[0] * block) * rb:],
                                           parts[1][:(end - cut) * rb])))

    def _row_span(self, offset, size):
        """(first byte, end byte) of the rows' bytes a read covers, then its rows."""
        head = len(self.header)
        at, stop = max(offset, head) - head, min(offset + size, self.size()) - head
        return at, stop, at // self.row_bytes, -(-stop // self.row_bytes)

    def forget_decoded(self):
        with self._lock:
            self._forget()

    def _forget(self):
        self._exact, self._blocks = (0, 0, memoryview(b"")), {}
        self._generation += 1

    def held(self, offset, size):
        """Whether the bytes ``offset..offset+size`` are decoded already (a read of them
        is a slice, or two joined: the mount answers it without a worker thread's hop)."""
        if offset < len(self.header) or self.row_bytes == 0:
            return False
        _, _, first, end = self._row_span(offset, size)
        held_first, held_end, _ = self._exact
        if held_first <= first and end <= held_end:
            return True
        numbers = self._block_numbers(first, end, size)  # (no lock: the loop asks)
        return (numbers is not None and all(n in self._blocks for n in numbers)) or \
            self.table.decoded_already(self.name, first, end)

    def read(self, offset, size):
        head = len(self.header)
        out = self.header[offset:offset + size] if offset < head else b""
        if self.row_bytes == 0 or offset + size <= head or offset >= self.size():
            return out
        at, stop, first, end = self._row_span(offset, size)
        held_first, data = self._rows(first, end, size)
        inner = at - held_first * self.row_bytes
        values = data[inner:inner + stop - at]
        return out + values if out else values

    # -- writing (``-o rw,columns``): see casacore_cell_write

    def write(self, offset, data):
        """Store the cells ``data`` covers; the header and bytes past the end stay as they
        are (a write that would change them is refused, as is one of a column not written,
        before anything changes). Only elements whose bytes change are written."""
        data = bytes(data)
        end, head = offset + len(data), len(self.header)
        if offset < 0 or end > self.size():
            raise NotPermitted(f"{self.label}: a write past the end ({self.size()} bytes): "
                               "a column is not resized")
        if offset < head and data[:head - offset] != self.header[offset:min(end, head)]:
            raise NotPermitted(f"{self.label}: the .npy header is not written")
        col = self.table.columns[self.name]
        why = why_not_written(self.table, col)
        if why is None and not all(commits_atomically(self.table.source, file)
                                   for file in self.table.manager_files(self.name)):
            why = ("the table's files are written in place, not by an atomic commit (only a "
                   "MultiFile table's cells are written)")
        if why:
            raise NotPermitted(f"{self.label}: {why}")
        if end <= head or self.row_bytes == 0:
            return len(data)
        at, stop, first, last = self._row_span(offset, len(data))
        with self._lock:
            try:
                current = np.ascontiguousarray(self.table.read_column(self.name, first, last))
            except FormatError as exc:
                raise BlockError(str(exc)) from None
            if current.dtype != self.dtype or current.shape != (last - first,) + self.cell_shape:
                raise BlockError(f"{self.label}: rows {first}..{last} changed shape")
            old = current.view(np.uint8).reshape(-1)
            new = old.copy()
            skip = first * self.row_bytes
            new[at - skip:stop - skip] = np.frombuffer(data, np.uint8, stop - at,
                                                       max(head - offset, 0))
            values = new.view(self.dtype).reshape(current.shape)
            self._check_storable(col, new, values)
            changed = (new != old).reshape(-1, self.dtype.itemsize).any(axis=1)
            if changed.any():
                try:
                    write_cells(self.table, col, first, values, changed.reshape(current.shape))
                finally:
                    self._forget()  # (the lock is held)
        return len(data)

    def _check_storable(self, col, raw, values):
        if col.data_type == TP_BOOL and (raw > 1).any():
            raise NotPermitted(f"{self.label}: a Bool byte other than 0 or 1")
        if col.data_type == TP_UCHAR and (values > 255).any():
            raise NotPermitted(f"{self.label}: a uChar value above 255")


def _shapes(column, ndim):
    """Each row's cell shape (``int64``, nrow x ndim): -1 in an undefined row, and after the
    shape of a cell of lower rank than the column's widest."""
    ranks = [len(s) for s in column.shapes if s is not None]
    ndim = max([max(ndim, 0)] + ranks)
    out = np.full((len(column.shapes), ndim), -1, np.int64)
    for i in np.flatnonzero(column.defined).tolist():
        out[i, :len(column.shapes[i])] = column.shapes[i]
    return out


def _json_bytes(value):
    """``value`` as UTF-8 JSON. A byte of the table that is not UTF-8 (a string keeps it as
    a surrogate escape) is written as the JSON escape ``\\udcNN``, as ``ctdsfs tableinfo
    --json`` writes it: ``text.encode("utf-8", "surrogateescape")`` gives the byte back."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n"
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


def _npy_bytes(array):
    array = np.ascontiguousarray(array)
    return npy_header(array.dtype.str, array.shape) + array.tobytes()


class ColumnsView(DerivedView):
    format_name = "casacore columns"
    read_only_note = " (columns/ is written only on a read-write mount)"
    holds_directories = False  # so a stat of columns/ does not list (decode) it

    def __init__(self, source, label, table_label=None):
        super().__init__(label)
        self.source, self.table_label = source, table_label or label
        self.table = None  # table.dat is read when the view is first used, not when shown
        self._single = {}  # column name -> its NAME.npy made before the view was listed

    # -- writing: only into NAME.npy (see _ColumnNpy.write); nothing is made, removed,
    # renamed or resized

    @property
    def _source_writable(self):
        return bool(getattr(self.source, "writable", False))

    @property
    def kernel_keeps_pages(self):
        """Not on a read-write mount: writes into the table's own files change the values."""
        return not self._source_writable

    def _refuse(self, *args, **kwargs):
        if not self._source_writable:
            raise ReadOnlyError(f"{self.label} is read-only{self.read_only_note}")
        raise NotPermitted(f"{self.label}: files here are not made, removed, renamed or "
                           "resized; only the cells of NAME.npy are written")

    create = remove = rename = make_nested = _refuse

    def write(self, key, offset, data):
        entry = self._entry(key)
        if not self._source_writable:
            self._refuse()
        if not isinstance(entry, _ColumnNpy):
            raise NotPermitted(f"{self.label}/{key}: only NAME.npy of numeric and Bool "
                               "columns is written")
        return entry.write(offset, data)

    def truncate(self, key, size):
        entry = self._entry(key)
        if self._source_writable and isinstance(entry, _ColumnNpy) and size == entry.size():
            return None
        self._refuse()

    def forget_decoded(self):
        """Drop the decoded rows kept for reads: the table's files were written."""
        with self._lock:
            files = list(self._single.values()) + [e for e in (self._built or {}).values()
                                                   if isinstance(e, _ColumnNpy)]
        for entry in files:
            entry.forget_decoded()
        if self.table is not None:
            self.table.forget_cached()

    def _open_table(self):
        if self.table is None:
            self.table = open_table(self.source, self.table_label)
        return self.table

    def warm_decoders(self):
        """See :meth:`CasacoreTable.warm_decoders`; a table that does not decode says so
        when it is listed or read, not here."""
        try:
            self._open_table().warm_decoders()
        except (FormatError, BlockError, OSError) as exc:
            log.debug("%s: decoders not warmed: %s", self.label, exc)

    def _entry(self, key):
        if self._built is None and isinstance(key, str) and key.endswith(".npy"):
            single = self._single_npy(key[:-len(".npy")])
            if single is not None:
                return single
        return super()._entry(key)

    def _single_npy(self, name):
        """``NAME.npy`` of a column whose one cell shape is known without reading a value
        (a fixed shape, or the tiled managers' hypercubes), made without listing the
        whole view: a reader of one column (a Dask worker) pays for that column only.
        None when the listing has to tell (it then shows the same file)."""
        with self._lock:
            if name in self._single:
                return self._single[name]
            try:
                table = self._open_table()
                col = table.columns.get(name)
                if col is None or not col.decoded or col.data_type == TP_STRING:
                    return None
                shape = col.checked_shape()
                if shape is None and col.manager.startswith("Tiled"):
                    known, shape = table.uniform_shape(name)
                    shape = shape if known else None
            except (FormatError, BlockError, OSError):
                return None  # the listing says why
            if shape is None:
                return None
            try:
                single = _ColumnNpy(table, name, shape, col.dtype, f"{self.label}/{name}.npy")
            except FormatError:
                return None  # (as above)
            self._single[name] = single
            return single

    def _build(self):
        """Say what you show: a table that does not decode gives an empty view, a column
        that does not decode no files; either with the reason in the log and
        ``problems`` (and a column's in table.json)."""
        try:
            self._open_table()
        except (FormatError, BlockError, OSError) as exc:
            self._problem(f"no columns shown: {exc}")
            return {}
        entries, shown, failed = {}, {}, {}
        for name, col in self.table.columns.items():
            files = {}
            try:
                shown[name] = self._column_entries(files, name, col)
                for entry in files.values():  # a size only the values tell: decoded now,
                    if isinstance(entry, LazyBytes):  # so a failure leaves out this column,
                        entry.data()  # not the whole listing that asks the sizes
            except (FormatError, BlockError) as exc:
                shown[name], failed[name] = [], str(exc)
                self._problem(f"column {name} not shown: {exc}")
                continue
            entries.update(files)
        described = self.table.describe()
        for name, files in shown.items():
            described["columns"][name]["files"] = files
            if name in failed:
                described["columns"][name]["error"] = failed[name]
        entries["table.json"] = _json_bytes(described)
        return entries

    def cached(self, key, offset, size):
        try:
            entry = self._entry(key)
        except FileNotFoundError:
            return False
        if isinstance(entry, _ColumnNpy):
            return self._decodes_at_once(entry) or entry.held(offset, size)
        return isinstance(entry, bytes) or (isinstance(entry, LazyBytes) and entry.made())

    def _decodes_at_once(self, entry):
        """Whether ``entry`` is a column of a tiled manager in local files (the source reads
        into buffers): its rows decode in a fraction of a millisecond a MiB from the page
        cache, so the mount decodes them on its loop, as it serves small reads, rather
        than in worker threads, whose hops and contention for the GIL cost more than the
        decoding (a third of the daemon's CPU over a 125 MiB MeasurementSet's tiled
        columns). Other managers' cells may take tens of milliseconds a MiB (an
        indirect array's cells one by one): they keep the loop free for other requests."""
        return getattr(self.source, "read_into", None) is not None and \
            entry.table.columns[entry.name].manager.startswith("Tiled")

    def _problem(self, text):
        self.problems.append(text)
        log.warning("%s: %s", self.label, text)

    def _column_entries(self, entries, name, col):
        if not col.decoded:
            return []
        if col.data_type == TP_STRING and not col.is_array:
            column = LazyBytes(lambda: self._decoded(name, StringColumn))
            entries[f"{name}.offsets.npy"] = LazyBytes(lambda: _npy_bytes(column.data().offsets))
            entries[f"{name}.data"] = LazyBytes(lambda: column.data().data)
            return [f"{name}.offsets.npy", f"{name}.data"]
        if col.data_type != TP_STRING:
            shape = col.checked_shape()
            if shape is None:
                shape = self._uniform_shape(name)
            if shape is not None:
                entries[f"{name}.npy"] = self._single.get(name) or _ColumnNpy(
                    self.table, name, shape, col.dtype, f"{self.label}/{name}.npy")
                return [f"{name}.npy"]
        whole = LazyBytes(lambda: self._decoded(name, VarShapeColumn))
        files = {f"{name}.shapes.npy": lambda: _npy_bytes(_shapes(whole.data(), col.ndim)),
                 f"{name}.offsets.npy": lambda: _npy_bytes(whole.data().offsets)}
        if col.data_type == TP_STRING:  # the elements as a String scalar column's files
            files[f"{name}.values.offsets.npy"] = lambda: _npy_bytes(whole.data().values.offsets)
            files[f"{name}.values.data"] = lambda: whole.data().values.data
        else:
            files[f"{name}.values.npy"] = lambda: _npy_bytes(whole.data().values)
        entries.update((key, LazyBytes(make)) for key, make in files.items())
        return list(files)

    def _decoded(self, name, kind):
        column = self.table.read_column(name)
        if not isinstance(column, kind):
            raise FormatError(f"column {name} did not decode as {kind.__name__}")
        return column

    def _uniform_shape(self, name):
        """The one cell shape of a variable-shape column, or None. The tiled managers tell it
        from their hypercubes; other managers' columns are decoded whole to find out."""
        known, shape = self.table.uniform_shape(name)
        if known:
            return shape
        values = self.table.read_column(name)
        return None if isinstance(values, VarShapeColumn) else values.shape[1:]
