"""A MeasurementSet's tables read through ctdsfs's decoders, for the xarray backend.

:func:`open_root` is the one place a source becomes a container (a local MS directory in
separate files or MultiFile, a packed container, a MultiFile or MultiHDF5 file, ``s3://``
or ``http(s)://``, an ``s3://`` prefix ending in ``/`` holding an MS directory's files); :class:`MSTables` opens the main table and its subtables from it once
per process, and travels pickled as its source and options only (Dask workers, pickled
datasets reopen it there).
"""

import os
import threading
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np

from ..errors import CtdsfsError
from ..formats.casacore.columns import StringColumn, VarShapeColumn, open_table
from ..fsspec import open_source

GAP_BYTES = 1 << 20  # rows between two wanted ones are read through when under this


def local_path(source):
    """The local path ``source`` names (``file://`` included), or None for a URL."""
    source = os.fspath(source)
    if source.startswith("file://"):
        parsed = urlparse(source)
        return url2pathname(("" if parsed.netloc == "localhost" else parsed.netloc) +
                            parsed.path)
    return None if "://" in source or "::" in source else source


def open_root(source, storage_options):
    """The container of the MS at ``source``, opened by the one opener as a mount shows it
    (a local file or directory, ``s3://``/``http(s)://`` objects and prefixes, fsspec URLs)."""
    path = local_path(source)
    if path is not None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist")
        return open_source(path)
    return open_source(source, target_options=storage_options or None)


def ms_name(source):
    """The partitions' name prefix: the source's last name without its extension."""
    tail = os.fspath(source).split("::")[0].rstrip("/").rsplit("/", 1)[-1]
    return os.path.splitext(tail)[0]


_OPEN = {}  # (source, options) -> MSTables state of this process
_OPEN_LOCK = threading.Lock()


class MSTables:
    """The main table and subtables of one MS (opened lazily, once per process)."""

    def __init__(self, source, storage_options=None):
        self.source = os.fspath(source)
        self.storage_options = dict(storage_options or {})
        self._state = None

    def __getstate__(self):
        return {"source": self.source, "storage_options": self.storage_options}

    def __setstate__(self, state):
        self.__init__(state["source"], state["storage_options"])

    def _opened(self):
        if self._state is None:
            key = (self.source, repr(sorted(self.storage_options.items())))
            with _OPEN_LOCK:
                if key not in _OPEN:
                    root = open_root(self.source, self.storage_options)
                    _OPEN[key] = {"root": root, "tables": {}, "lock": threading.Lock()}
                self._state = _OPEN[key]
        return self._state

    @property
    def main(self):
        table = self._table("")
        if table is None:
            raise ValueError(f"{self.source}: not a casacore table (no table.dat)")
        return table

    def subtable(self, name):
        """Subtable ``name`` as a :class:`Subtable` (no rows when the MS has none)."""
        table = self._table(name)
        return Subtable(name, table)

    def _table(self, name):
        state = self._opened()
        with state["lock"]:
            if name not in state["tables"]:
                state["tables"][name] = self._open_table(state["root"], name)
            return state["tables"][name]

    def _open_table(self, root, name):
        label = f"{self.source}/{name}" if name else self.source
        container = root if not name else root.nested(name) if root.contains(name) else None
        if container is None or not container.contains("table.dat"):
            return None
        try:
            return open_table(container, label)
        except CtdsfsError as exc:
            raise OSError(f"{label}: {exc}") from None


def cells(column):
    """A decoded whole column as Python-friendly values: an ndarray, a list of str, or a
    list of cells (ndarray, or None when undefined)."""
    if isinstance(column, np.ndarray):
        return column
    if isinstance(column, StringColumn):
        return column.tolist()
    if isinstance(column, VarShapeColumn):
        return [column.cell(i) for i in range(len(column.defined))]
    raise TypeError(type(column))


class Subtable:
    """A subtable's columns, each decoded whole on first use (subtables are small)."""

    def __init__(self, name, table):
        self.name, self.table = name, table
        self.nrow = 0 if table is None else table.nrow
        self._columns = {}

    def has(self, column):
        return self.table is not None and column in self.table.columns

    def keywords(self, column):
        return self.table.columns[column].keywords if self.has(column) else {}

    def column(self, name):
        if name not in self._columns:
            if not self.has(name):
                raise KeyError(f"{self.name}: no column {name}")
            self._columns[name] = cells(self.table.read_column(name))
        return self._columns[name]

    def array(self, name, rows=None):
        """Column ``name`` (of ``rows``) stacked into one ndarray (cells of one shape)."""
        values = self.column(name)
        if rows is not None:
            values = values[np.asarray(rows)] if isinstance(values, np.ndarray) \
                else [values[int(r)] for r in rows]
        return values if isinstance(values, np.ndarray) else np.array(values)


def row_spans(rows, row_bytes):
    """(start, stop) spans covering sorted ``rows``, reading through gaps under GAP_BYTES."""
    if rows.size == 0:
        return []
    gap = max(1, GAP_BYTES // max(1, row_bytes))
    breaks = np.flatnonzero(np.diff(rows) > gap)
    starts = np.concatenate([[rows[0]], rows[breaks + 1]])
    stops = np.concatenate([rows[breaks], [rows[-1]]]) + 1
    return list(zip(starts.tolist(), stops.tolist()))


def read_rows(table, column, rows, cell_shape, out, positions):
    """Cells of ``column`` at ``rows`` (sorted, unique) into ``out[positions]``; cells that
    are undefined stay as ``out`` holds them. Only the spans holding the rows are decoded."""
    row_bytes = int(np.prod(cell_shape, dtype=np.int64)) * 8
    for start, stop in row_spans(rows, row_bytes):
        lo, hi = np.searchsorted(rows, [start, stop])
        got = table.read_column(column, start, stop)
        local = rows[lo:hi] - start
        where = positions[lo:hi]
        if isinstance(got, np.ndarray):
            if got.shape[1:] != tuple(cell_shape):
                raise ValueError(f"{table.label}: column {column} has cells of shape "
                                 f"{got.shape[1:]}, the partition needs {tuple(cell_shape)}")
            out[_as_slice(where)] = got[_as_slice(local)]
        else:
            _gather_cells(table, column, got, local, cell_shape, out, where)


def _as_slice(index):
    """A run of consecutive indices as a slice (a view, not a copy), else the indices."""
    if index.size and index[-1] - index[0] + 1 == index.size:
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def _gather_cells(table, column, got, local, cell_shape, out, where):
    """The defined cells among ``local`` of a column of several shapes."""
    size = int(np.prod(cell_shape, dtype=np.int64))
    defined = got.defined[local]
    for i in np.flatnonzero(defined):
        if got.shapes[local[i]] != tuple(cell_shape):
            raise ValueError(f"{table.label}: column {column} row has cells of shape "
                             f"{got.shapes[local[i]]}, the partition needs "
                             f"{tuple(cell_shape)}")
    keep = local[defined]
    firsts = got.offsets[keep].astype(np.int64)
    index = firsts[:, None] + np.arange(size)[None, :]
    out[where[defined]] = got.values[index].reshape((keep.size,) + tuple(cell_shape))
