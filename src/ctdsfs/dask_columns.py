"""A casacore column as a ``dask.array``, read by each worker through the fsspec filesystem.

    from ctdsfs.dask_columns import column_array
    data = column_array("s3://bucket/obs.mf", "DATA", chunks=10_000,
                        endpoint_url="http://127.0.0.1:8333")
    data[1000:2000].compute()

Each chunk is a range of rows of ``columns/NAME.npy`` (``columns=True`` of the
``ctdsfs`` filesystem). The filesystem travels to the workers pickled (fsspec
re-creates it there from its arguments, once per process), and a chunk's read
asks only for its rows' bytes, so only the tiles or buckets holding those rows
are fetched. Needs the ``dask`` extra (``pip install "ctdsfs[dask]"``).
"""

from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np

from .fsspec import CtdsfsFileSystem

HEADER_MAX = 1 << 16  # a .npy header ctdsfs writes is far smaller
CHUNK_BYTES = 64 << 20  # rows per chunk when none is given: about this many bytes


class _RowReader:
    """Rows of one ``NAME.npy`` read in ranges (what ``da.from_array`` slices)."""

    def __init__(self, fs: CtdsfsFileSystem, path: str) -> None:
        self.fs, self.path = fs, path
        size = fs.size(path)
        head = io.BytesIO(fs.cat_file(path, 0, min(size, HEADER_MAX)))
        try:
            version = np.lib.format.read_magic(head)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(head)
        except ValueError as exc:
            raise ValueError(f"{path}: not a .npy file ctdsfs shows: {exc}") from None
        if fortran or not shape or dtype.hasobject:
            raise ValueError(f"{path}: not a row-major column of rows")
        self.offset = head.tell()
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if self.offset + shape[0] * self.row_bytes != size:
            raise ValueError(f"{path}: {size} bytes do not hold a {shape} {dtype} array")

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        return ("ctdsfs-column", self.fs.storage_args, self.fs.storage_options, self.path)

    def __getitem__(self, index: Any) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        rows, rest = (index[0] if index else slice(None)), index[1:]
        if not isinstance(rows, slice):
            row = int(rows) % self.shape[0]
            return self[(slice(row, row + 1),) + rest][0]
        start, stop, step = rows.indices(self.shape[0])
        stop = max(start, stop)
        data = self.fs.cat_file(self.path, self.offset + start * self.row_bytes,
                                self.offset + stop * self.row_bytes)
        values = np.frombuffer(data, self.dtype).reshape((stop - start,) + self.shape[1:])
        return values[(slice(None, None, step),) + rest]


def column_array(url: str, column: str, *, chunks: Optional[int] = None, table: str = "",
                 verify_crc: bool = True, **storage_options: Any) -> Any:
    """Column ``column`` of the table at ``table`` (a path inside the container, "" for
    the main table) of the container at ``url``, as a dask array chunked along rows
    (``chunks`` rows each; by default about 64 MiB). ``storage_options`` are s3fs-style
    (``endpoint_url``, ``key``, ``anon``, ... as the fsspec filesystem's ``target_options``)."""
    import dask.array as da

    fs = CtdsfsFileSystem(fo=url, columns=True, verify_crc=verify_crc,
                          target_options=storage_options or None)
    path = "/".join(p for p in (table.strip("/"), "columns", f"{column}.npy") if p)
    reader = _RowReader(fs, path)
    rows = chunks or max(1, CHUNK_BYTES // max(1, reader.row_bytes))
    return da.from_array(reader, chunks=(rows,) + reader.shape[1:],
                         meta=np.empty((0,) * reader.ndim, reader.dtype))
