"""casacore table columns decoded to NumPy without casacore.

``open_table(source)`` parses ``table.dat`` (through :mod:`.tabledat`) into
:class:`ColumnInfo` records, and ``CasacoreTable.read_column(name, start, stop)``
decodes rows ``start..stop`` of one column through its storage manager's module,
reading only the buckets or tiles that hold those rows. Results:

* fixed-shape numeric/Bool columns: an ``ndarray`` of shape ``(nrow, *cell_shape)`` and
  the dtype python-casacore's ``getcol`` gives (scalar columns 1-D);
* String scalar columns: :class:`StringColumn` (``uint64`` offsets, ``nrow + 1``, into
  UTF-8 bytes);
* variable-shape array columns (and fixed-shape ones with undefined cells):
  :class:`VarShapeColumn` (per-row shape and defined flag, element offsets, flat values);
  ``cell(i)`` gives back what ``getvarcol`` gives for row ``i``.

A column bound to a data manager not decoded here (a virtual column engine,
Adios2StMan, ...) is listed with its manager; reading it raises :class:`NotDecoded`.
"""

import math
from dataclasses import dataclass

import numpy as np

from ...errors import FormatError
from . import altmans as casacore_altmans
from . import ism as casacore_ism
from . import sisco as casacore_sisco
from . import ssm as casacore_ssm
from . import stmanaipsio as casacore_stmanaipsio
from . import tabledat
from . import tsm as casacore_tsm
from .base import NUMERIC_TYPES, TP_BOOL, TP_STRING, EndianAipsReader, process_memory
from .dysco import DyscoReader
from .tsm_axes import decodable, hypercolumn_roles

OPTION_DIRECT = 1


def _more_than_memory(col, rows):
    """Whether ``rows`` cells of ``col`` (one shape) take more than the machine's memory or
    the process's address-space limit. Some managers read rows past their file as zeros
    (StokesIStMan, Dysco, AntennaPairStMan's pattern), so only this bounds what a row count
    from table.dat makes: a larger read is refused before anything is made."""
    if col.dtype is None or col.cell_shape is None:
        return False
    return rows * math.prod(col.cell_shape) * col.dtype.itemsize > process_memory()


class NotDecoded(FormatError):
    """The column's data manager is not one this module decodes."""


class TableFiles:
    """A table's source as the storage managers' decoders read it: a file that cannot be
    reached (missing, a link refused, unreadable) is a one-line FormatError naming it, so
    it costs the columns stored in it, not the whole table. Anything else (writes, what a
    source says of itself) is the source's own."""

    def __init__(self, source):
        self.source = source
        if getattr(source, "read_into", None) is None:
            self.read_into = None

    def __getattr__(self, name):
        return getattr(self.source, name)

    def _reach(self, func, name, *args):
        try:
            return func(name, *args)
        except (OSError, KeyError) as exc:
            why = getattr(exc, "strerror", None) or "no such file"
            raise FormatError(f"{name}: {why}") from None

    def entry_size(self, name):
        return self._reach(self.source.entry_size, name)

    def read(self, name, offset, size):
        return self._reach(self.source.read, name, offset, size)

    def read_into(self, name, offset, buffer):
        return self._reach(self.source.read_into, name, offset, buffer)


@dataclass
class ColumnInfo:
    name: str
    data_type: int  # casacore DataType code
    is_array: bool
    ndim: int  # -1 or 0: any
    cell_shape: tuple  # Python (getcol) order; None when the shape varies per row
    direct: bool  # array stored inside the buckets/tiles themselves
    max_length: int  # fixed-length Strings
    manager: str  # data manager type name
    seqnr: int  # its sequence number: its files are table.f<seqnr>...
    keywords: dict
    decoded: bool
    in_cube_records: bool = False  # a tiled hypercolumn's id or coordinate column

    @property
    def type_name(self):
        return tabledat.type_name(self.data_type)

    def checked_shape(self):
        """``cell_shape``, refused (FormatError) when table.dat gives it a negative axis."""
        if self.cell_shape is not None and any(n < 0 for n in self.cell_shape):
            raise FormatError(f"column {self.name}: table.dat gives its cells the shape "
                              f"{list(self.cell_shape)}")
        return self.cell_shape

    @property
    def dtype(self):
        """The NumPy dtype of the values (None for Strings)."""
        if self.data_type == TP_BOOL:
            return np.dtype(bool)
        if self.data_type in NUMERIC_TYPES:
            return np.dtype(NUMERIC_TYPES[self.data_type][0])
        return None


@dataclass
class StringColumn:
    offsets: np.ndarray  # uint64, one more than the strings
    data: bytes  # the UTF-8 strings, back to back

    @classmethod
    def from_bytes(cls, items):
        offsets = np.zeros(len(items) + 1, np.uint64)
        np.cumsum([len(s) for s in items], out=offsets[1:])
        return cls(offsets, b"".join(items))

    def tolist(self):
        o = self.offsets.tolist()
        return [self.data[o[i]:o[i + 1]].decode("utf-8", "surrogateescape")
                for i in range(len(o) - 1)]


@dataclass
class VarShapeColumn:
    defined: np.ndarray  # bool per row
    shapes: list  # per row: a tuple (Python order), None when undefined
    offsets: np.ndarray  # uint64 (nrow + 1): each row's first element in ``values``
    values: object  # flat ndarray, or a StringColumn of all elements

    @classmethod
    def from_cells(cls, cells, dtype):
        defined = np.array([c is not None for c in cells], bool)
        shapes = [None if c is None else tuple(c[0]) for c in cells]
        counts = [0 if c is None else int(np.prod(c[0], dtype=np.int64)) for c in cells]
        offsets = np.zeros(len(cells) + 1, np.uint64)
        np.cumsum(counts, out=offsets[1:])
        parts = [c[1] for c in cells if c is not None]
        if dtype is None:
            values = StringColumn.from_bytes([s for p in parts for s in p])
        else:
            values = (np.concatenate([np.asarray(p, dtype) for p in parts]) if parts
                      else np.zeros(0, dtype))
        return cls(defined, shapes, offsets, values)

    def cell(self, row):
        """Row ``row`` as ``getvarcol`` gives it; None if undefined."""
        if not self.defined[row]:
            return None
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        if isinstance(self.values, StringColumn):
            items = StringColumn(self.values.offsets[a:b + 1] - self.values.offsets[a],
                                 self.values.data[int(self.values.offsets[a]):
                                                  int(self.values.offsets[b])]).tolist()
            return np.array(items, dtype=object).reshape(self.shapes[row])
        return self.values[a:b].reshape(self.shapes[row])

    def uniform(self):
        """An ndarray ``(nrow, *shape)`` when every cell is defined with one shape, else None."""
        if isinstance(self.values, StringColumn) or not self.defined.all():
            return None
        if len(set(self.shapes)) > 1:
            return None
        shape = self.shapes[0] if self.shapes else ()
        return self.values.reshape((len(self.shapes),) + tuple(shape))


def _hypercube_axis_columns(table):
    """{name: "id" or "coordinate"} of the hypercolumns' id and coordinate columns: a tiled
    manager keeps their values in its cubes' records (see casacore_tsm_axes)."""
    roles = {}
    for key, hyper in tabledat.record_dict(table.desc.private_keywords).items():
        if key.startswith("Hypercolumn_"):
            roles.update((n, role) for n, (role, _) in hypercolumn_roles(hyper).items())
    return roles


def _column_infos(table):
    managers = {seq: name for name, seq in table.column_set.data_managers}
    axis_columns = _hypercube_axis_columns(table)
    infos = []
    for desc, binding in zip(table.desc.columns, table.column_set.columns):
        manager = managers.get(binding.seqnr, "?")
        role = axis_columns.get(desc.name) if manager.startswith("Tiled") else None
        shape = None  # an id or coordinate column's: its hypercubes' (a row may be in none)
        if not desc.is_array and not role:
            shape = ()
        elif not role:
            fixed = binding.fixed_shape or (desc.shape if desc.shape and desc.shape.values
                                            and desc.options & 4 else None)
            if fixed is not None:
                shape = tuple(int(n) for n in fixed.values[::-1])
        infos.append(ColumnInfo(
            name=desc.name, data_type=desc.data_type, is_array=desc.is_array, ndim=desc.ndim,
            cell_shape=shape, direct=bool(desc.options & OPTION_DIRECT),
            max_length=desc.max_length, manager=manager, seqnr=binding.seqnr,
            keywords=tabledat.record_dict(desc.keywords),
            decoded=desc.kind in ("ScalarColumnDesc", "ArrayColumnDesc") and
            (desc.data_type in NUMERIC_TYPES or desc.data_type in (TP_BOOL, TP_STRING))
            and manager in _decoders() and
            (not role or decodable(role, desc.data_type, desc.is_array, desc.ndim)),
            in_cube_records=bool(role)))
    return infos


LOCK_INFO_AT = 260  # after casacore's request list of 65 Ints: the sync info's length


def _synced_rows(source, label, nrow):
    """The row count: casacore keeps the latest in ``table.lock``'s sync info (rows added
    without a change of the description leave table.dat's count behind)."""
    try:
        size = source.entry_size("table.lock")
    except (FileNotFoundError, KeyError, FormatError):
        return nrow
    if size < LOCK_INFO_AT + 4:
        return nrow
    head = source.read("table.lock", LOCK_INFO_AT, min(size - LOCK_INFO_AT, 4096))
    length = int.from_bytes(bytes(head[:4]), "big")
    if length == 0:
        return nrow
    try:
        r = EndianAipsReader(bytes(head[4:4 + length]), True)
        version = r.start("sync", outer=True)
        return r.u32() if version == 1 else r.u64()
    except FormatError as exc:
        raise FormatError(f"{label}/table.lock: {exc}") from None


def _decoders():
    # (imported with this module: a mount imports them before its first request)
    return {"StandardStMan": casacore_ssm.SSMReader,
            "StManAipsIO": casacore_stmanaipsio.StManAipsIOReader,
            "IncrementalStMan": casacore_ism.ISMReader,
            "TiledColumnStMan": casacore_tsm.TiledReader,
            "TiledShapeStMan": casacore_tsm.TiledReader,
            "TiledCellStMan": casacore_tsm.TiledReader,
            "TiledDataStMan": casacore_tsm.TiledReader, "DyscoStMan": DyscoReader,
            **casacore_altmans.DECODERS, **casacore_sisco.DECODERS}


class CasacoreTable:
    """One casacore table read through ``source`` (see :mod:`.casacore_base`)."""

    def __init__(self, source, label="table"):
        self.source, self.label = TableFiles(source), label
        size = self.source.entry_size("table.dat")
        if size > tabledat.MAX_BYTES:
            raise FormatError(f"{label}/table.dat: {size} bytes is too large for a table.dat")
        self.dat = tabledat.decode(self.source.read("table.dat", 0, size),
                                   f"{label}/table.dat")
        self.nrow = _synced_rows(self.source, label, int(self.dat.nrow))
        self.big_endian = self.dat.endian == 0
        self.columns = {c.name: c for c in _column_infos(self.dat)}
        self.keywords = tabledat.record_dict(self.dat.desc.keywords)
        self._readers = {}

    def describe(self):
        """JSON-ready: table keywords and, per column, type, shape, manager, keywords."""
        return {"rows": self.nrow, "keywords": self.keywords, "columns": {
            c.name: {"type": c.type_name, "array": c.is_array,
                     "shape": list(c.cell_shape) if c.cell_shape is not None else
                     None if c.is_array else [],
                     "ndim": c.ndim, "data_manager": c.manager, "decoded": c.decoded,
                     "keywords": c.keywords} for c in self.columns.values()}}

    def _reader(self, seqnr):
        if seqnr not in self._readers:
            cs = self.dat.column_set
            index = [seq for _, seq in cs.data_managers].index(seqnr)
            manager = cs.data_managers[index][0]
            bound = [c for c in self.columns.values() if c.seqnr == seqnr]
            self._readers[seqnr] = _decoders()[manager](
                self.source, self, seqnr, bound, cs.dm_info[index])
        return self._readers[seqnr]

    def uniform_shape(self, name):
        """(known, shape): whether the manager can tell without decoding that every cell of
        the column is defined with one shape, and that shape (None: not one shape)."""
        col = self.columns[name]
        try:
            reader = self._reader(col.seqnr)
            if not hasattr(reader, "uniform_shape"):
                return False, None
            shape = reader.uniform_shape(col)
        except FormatError as exc:
            raise FormatError(f"{self.label}: column {name}: {exc}") from None
        return (False, None) if shape is NotImplemented else (True, shape)

    def manager_files(self, name):
        """The files that hold the cells of column ``name`` (its manager's data files)."""
        col = self.columns[name]
        reader = self._reader(col.seqnr)
        names = list(getattr(reader, "files", {}).values()) or [reader.name]
        return names + ([reader.arrays_name] if col.manager == "StandardStMan" and
                        col.is_array and not col.direct else [])

    def forget_cached(self):
        """Drop bytes the managers' readers keep (the table's files were written)."""
        for reader in self._readers.values():
            if hasattr(reader, "forget_cached"):
                reader.forget_cached()

    def cell_places(self, name, start, stop):
        """Where rows ``start..stop`` of column ``name`` lie in its manager's files: the
        manager's own geometry (``places`` of the SSM and tiled readers), for writes."""
        col = self.columns[name]
        reader = self._reader(col.seqnr)
        if not hasattr(reader, "places"):
            raise NotDecoded(f"{self.label}: column {name} is bound to {col.manager}, "
                             "whose cells are not written")
        try:
            return reader.places(col, start, stop)
        except FormatError as exc:
            raise FormatError(f"{self.label}: column {name}: {exc}") from None

    def warm_decoders(self):
        """Decode a row of each column whose decoder runs compiled kernels (its ``warm``),
        so that numba's start-up and the loading of the kernels are paid now: a mount's
        daemon does it before it forks its workers, which then share them, instead of
        each paying it at its first read."""
        decoders = _decoders()
        for col in self.columns.values():
            if col.decoded and hasattr(decoders.get(col.manager), "warm"):
                try:
                    self._reader(col.seqnr).warm(col)
                except FormatError as exc:
                    raise FormatError(f"{self.label}: column {col.name}: {exc}") from None

    def decoded_already(self, name, start, stop):
        """Whether the manager holds rows ``start..stop`` of column ``name`` decoded (a read
        of them is a slice: the mount answers it without a worker thread's hop); never
        decodes, and False for a manager that keeps no decoded rows."""
        col = self.columns[name]
        reader = self._readers.get(col.seqnr)
        return col.decoded and hasattr(reader, "decoded_already") and \
            reader.decoded_already(col, start, stop)

    def read_column(self, name, start=0, stop=None):
        """Rows ``start..stop`` of column ``name`` (see the module docstring for the forms)."""
        col = self.columns[name]
        stop = self.nrow if stop is None else min(stop, self.nrow)
        start = max(0, min(start, stop))
        if not col.decoded:
            raise NotDecoded(f"{self.label}: column {name} ({col.type_name}) is bound to "
                             f"{col.manager}, which is not decoded")
        try:
            col.checked_shape()
        except FormatError as exc:
            raise FormatError(f"{self.label}: {exc}") from None
        if _more_than_memory(col, stop - start):
            raise FormatError(f"{self.label}: rows {start}..{stop} of column {name} (cells "
                              f"of shape {list(col.cell_shape)}) are more than this process "
                              "can hold")
        try:
            result = self._reader(col.seqnr).read(col, start, stop)
            _check_cells(col, result, start)
        except FormatError as exc:
            raise FormatError(f"{self.label}: column {name}: {exc}") from None
        if isinstance(result, np.ndarray):
            return result
        if col.data_type == TP_STRING and not col.is_array:
            return StringColumn.from_bytes(result)
        var = VarShapeColumn.from_cells(result, col.dtype)
        if col.dtype is not None:  # one shape in every cell of the range: an ndarray
            fixed = var.uniform()
            if fixed is not None:
                return fixed
        return var


def _check_cells(col, result, start):
    """Refuse cells whose header cannot be true (FormatError): a defined array cell has
    at least one axis, as many as its column's (when the column fixes them), and as many
    values as its shape holds. A cell is then defined, or undefined, in every file the
    view shows."""
    if not col.is_array:
        return
    if isinstance(result, np.ndarray):
        if len(result):
            _check_shape(col, result.shape[1:], start)
        return
    for row, cell in enumerate(result, start):
        if cell is not None:
            shape, values = cell
            _check_shape(col, shape, row)
            if len(values) != math.prod(shape):
                raise FormatError(f"row {row}: a cell of shape {list(shape)} holds "
                                  f"{len(values)} values")


def _check_shape(col, shape, row):
    if not shape or (col.ndim > 0 and len(shape) != col.ndim):
        axes = col.ndim if col.ndim > 0 else "any number of"
        raise FormatError(f"row {row}: a cell of shape {list(shape)} in a column of {axes} "
                          "axes")


def open_table(source, label="table"):
    return CasacoreTable(source, label)
