"""A bcolz ctable rootdir: ``COLUMN.npy`` per column, ``table.npy`` (the rows as one
structured array), ``attrs.json`` and ``COLUMN/`` as a carray."""

import logging
import os
import stat
from collections import OrderedDict

import numpy as np

from ...container import name_problem
from ...errors import FormatError
from ...io.beneath import kind_beneath
from ...io.decoded_cache import DecodedCache
from ...io.lazy_files import json_file
from ...io.npy import npy_header
from .carray import Carray
from .view import (
    NpyFile,
    View,
    attrs_line,
    carray_info_lines,
    read_attrs,
    read_json,
    readahead_for_chunks,
    refuse,
)

log = logging.getLogger(__name__)


def rows_file_name(columns):
    """The file of all rows: ``table.npy``, unless a column's own file has that name (a
    column named ``table``): then ``table_.npy``, one more ``_`` until the name is free."""
    taken = {f"{name}.npy" for name in columns}
    name = "table"
    while f"{name}.npy" in taken:
        name += "_"
    return f"{name}.npy"


class Ctable(View):
    """A ctable rootdir: COLUMN.npy per column, table.npy, attrs.json, COLUMN/ (a carray)."""

    format_name = "bcolz ctable"

    def __init__(self, path, *, writable=False):
        super().__init__(path, writable)
        self.path = path
        self.cache = DecodedCache(name="bcolz chunks")
        names = read_json(path, "__rootdirs__").get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise FormatError(f"{path}: __rootdirs__: names is not a list of strings")
        self.attrs = read_attrs(path, "__attrs__")
        self.columns = OrderedDict()
        for name in names:
            why = name_problem(name) or ("listed twice" if name in self.columns else None)
            if why is None and not kind_beneath(path, name, stat.S_ISDIR):
                why = "no such column directory"
            if why is None:
                try:
                    self.columns[name] = Carray(path, writable=writable, label=f"{path}/{name}",
                                                cache=self.cache, column=name)
                except FormatError as exc:
                    why = str(exc)
            if why:
                self.problems.append(f"column {name!r} hidden: {why}")
                log.warning("%s: column %r hidden: %s", path, name, why)
        for name, column in self.columns.items():
            self._add(f"{name}.npy", column._entries["array.npy"])
        lengths = {c.shape[0] for c in self.columns.values()}
        try:
            self.row_dtype = np.dtype([(n, c.dtype, c.shape[1:])
                                       for n, c in self.columns.items()])
        except (TypeError, ValueError) as exc:  # (names NumPy does not take as fields)
            lengths = {f"no record type ({exc})"}
        self.table_name = rows_file_name(self.columns)
        if len(lengths) == 1 and self.columns:
            self._add(self.table_name, NpyFile(self))
        else:
            if lengths:
                self.problems.append(f"no {self.table_name}: the columns have different "
                                     f"lengths {sorted(map(str, lengths))}")
            self.table_name = None
        self._add("attrs.json", json_file(lambda: self.attrs))
        self._add("ctable.json", json_file(self.summary, lambda: self.version))
        for name, column in self.columns.items():
            self._add(name, column)
        self._lock_rootdir(path)

    @property
    def readahead_kb(self):
        """As its largest chunks need (``readahead_for_chunks``)."""
        return readahead_for_chunks(max((c.chunk_bytes for c in self.columns.values()),
                                        default=1 << 20))

    def summary(self):
        """``ctable.json``: the row count at the top level, the rows file, each column."""
        return {"rows": self.rows() if self.columns else 0, "table": self.table_name,
                "columns": [{"name": name, "file": f"{name}.npy", "dtype": str(c.dtype),
                             "shape": list(c.shape)} for name, c in self.columns.items()]}

    @property
    def version(self):
        """Changes whenever a column's does (table.npy's header follows it)."""
        return tuple(c.version for c in self.columns.values())

    def rows(self):
        """The rows every column holds (bcolz may have grown the columns since opening)."""
        return min(c.shape[0] for c in self.columns.values())

    def npy_header(self):
        return npy_header(np.lib.format.dtype_to_descr(self.row_dtype), (self.rows(),))

    def data_bytes(self):
        return self.rows() * self.row_dtype.itemsize

    def reload_if_changed(self):
        """Each column re-reads its meta/ if bcolz changed it; True if any did."""
        with self._lock:
            return any([c.reload_if_changed() for c in self.columns.values()])

    def read_data(self, start, end):
        """Rows touched, gathered column by column into one structured array."""
        row_bytes = self.row_dtype.itemsize
        first, last = start // row_bytes, -(-end // row_bytes)
        rows = np.zeros(last - first, self.row_dtype)
        for name, column in self.columns.items():
            raw = column.read_data(first * column.item_bytes, last * column.item_bytes)
            rows[name] = np.frombuffer(raw, column.dtype).reshape((last - first,)
                                                                   + column.shape[1:])
        skip = start - first * row_bytes
        return rows.tobytes()[skip:skip + end - start]

    def write_data(self, start, data, header_bytes):
        raise refuse(f"{self.label}/table.npy", "write a column's COLUMN.npy instead")

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        lines = [f"{info['container']}: {info['format']}",
                 f"  columns          {len(info['columns'])}"]
        for column in info["columns"]:
            lines.append(f"    {os.path.basename(column['container'])}")
            lines += carray_info_lines(column, "      ")
        lines += [f"  problem: {p}" for p in info["problems"]]
        return lines + [attrs_line(info)]

    def describe(self):
        return {"container": self.label, "format": "bcolz ctable", "attrs": self.attrs,
                "columns": [c.describe() for c in self.columns.values()],
                "problems": self.problems + self._writer_note()}

    def check(self, bar=None):
        problems = [f"{self.label}: {p}" for p in self.problems]
        notes = []
        for column in self.columns.values():
            more, info = column.check(bar)
            problems += more
            notes += info
        return problems, notes

