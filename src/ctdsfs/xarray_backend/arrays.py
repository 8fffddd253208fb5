"""Main-table columns as lazily indexed xarray backend arrays on a partition's grid.

An index along (time, baseline_id) becomes the rows ``row_map`` names for those cells;
only the spans of rows holding them are decoded (the tiles or buckets that hold them),
and cells without a row keep the column's fill value. The arrays pickle as the MS's
source and options plus the partition's row map.
"""

import numpy as np
from xarray.backends import BackendArray
from xarray.core.indexing import IndexingSupport, OuterIndexer, explicit_indexing_adapter

from .measures import to_unix
from .tables import read_rows


def _length(key, size):
    if isinstance(key, np.ndarray):
        return len(key)
    return len(range(*key.indices(size)))


def _take(values, keys, first_axis):
    """``values`` indexed by ``keys`` (outer indexing) from axis ``first_axis`` on."""
    for axis, key in enumerate(keys, first_axis):
        if isinstance(key, slice):
            if key != slice(None):
                values = values[(slice(None),) * axis + (key,)]
        else:
            values = np.take(values, key, axis=axis)
    return values


class MainColumnArray(BackendArray):
    """Column ``column`` of the main table over (time, baseline_id, *cell)."""

    def __init__(self, tables, column, row_map, cell_shape, dtype, fill, epoch=False):
        self.tables, self.column, self.row_map = tables, column, row_map
        self.cell_shape = tuple(cell_shape)
        self.shape = row_map.shape + self.cell_shape
        self.dtype = np.dtype(dtype)
        self.fill, self.epoch = fill, epoch

    def __getitem__(self, key):
        return explicit_indexing_adapter(key, self.shape, IndexingSupport.OUTER, self._getitem)

    def _getitem(self, key):
        squeeze = tuple(i for i, k in enumerate(key) if isinstance(k, (int, np.integer)))
        key = tuple(slice(int(k), int(k) + 1) if i in squeeze else k
                    for i, k in enumerate(key))
        shape = tuple(_length(k, s) for k, s in zip(key, self.shape))
        rows = _take(self.row_map, key[:2], 0).ravel()
        result = self._one_run(rows, key[2:], shape)
        if result is None:
            result = self._scattered(rows, key, shape)
        if self.epoch:
            result = to_unix(result)
        return result.squeeze(axis=squeeze) if squeeze else result

    def _one_run(self, rows, cell_key, shape):
        """The cells when they are one run of consecutive rows in the grid's order (an MS
        written time by time): the decoded rows are the result, without a scatter."""
        if not rows.size or rows[0] < 0 or rows[-1] - rows[0] + 1 != rows.size or \
                not all(isinstance(k, slice) and k == slice(None) for k in cell_key) or \
                np.any(np.diff(rows) != 1):
            return None
        got = self.tables.main.read_column(self.column, int(rows[0]), int(rows[-1]) + 1)
        if not isinstance(got, np.ndarray) or got.shape[1:] != self.cell_shape:
            return None  # (cells of several shapes: the scatter says which)
        if got.dtype == np.bool_ and self.dtype == np.uint8:
            got = got.view(np.uint8)
        if got.dtype != self.dtype or not got.flags.writeable:
            got = got.astype(self.dtype)
        return got.reshape(shape)

    def _scattered(self, rows, key, shape):
        """The cells of ``rows`` (-1: none, the fill value) placed one by one."""
        result = np.full(shape, self.fill, self.dtype)
        if result.size:
            present = np.flatnonzero(rows >= 0)
            unique, inverse = np.unique(rows[present], return_inverse=True)
            positions = np.empty_like(present)
            positions[inverse] = present  # (a row fills one cell of the grid)
            flat = result.reshape((-1,) + shape[2:])
            if all(isinstance(k, slice) and k == slice(None) for k in key[2:]):
                read_rows(self.tables.main, self.column, unique, self.cell_shape, flat,
                          positions)
            else:
                cells = np.full((unique.size,) + self.cell_shape, self.fill, self.dtype)
                read_rows(self.tables.main, self.column, unique, self.cell_shape, cells,
                          np.arange(unique.size))
                flat[positions] = _take(cells, key[2:], 1)
        return result


class BroadcastArray(BackendArray):
    """A lower-resolution column (WEIGHT, SIGMA, FLAG_ROW) spread over more axes; ``where``
    says per axis of the full shape whether the column has it."""

    def __init__(self, low, where, shape):
        self.low, self.where = low, tuple(where)
        self.shape, self.dtype = tuple(shape), low.dtype

    def __getitem__(self, key):
        return explicit_indexing_adapter(key, self.shape, IndexingSupport.OUTER, self._getitem)

    def _getitem(self, key):
        ints = [i for i, k in enumerate(key) if isinstance(k, (int, np.integer))]
        key = tuple(slice(int(k) % s, int(k) % s + 1) if i in ints else k
                    for i, (k, s) in enumerate(zip(key, self.shape)))
        shape = tuple(_length(k, s) for k, s in zip(key, self.shape))
        low = self.low[OuterIndexer(tuple(k for k, w in zip(key, self.where) if w))]
        low = low[tuple(slice(None) if w else None for w in self.where)]
        out = np.broadcast_to(low, shape)
        return out[tuple(0 if i in ints else slice(None) for i in range(len(shape)))]
