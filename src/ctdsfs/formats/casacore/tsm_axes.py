"""The id and coordinate columns of a tiled hypercolumn: values kept in the hypercubes'
value records (in the manager's header ``table.f<N>``), not in tiles.

Facts (casacore tables/Tables/TableDesc.cc, tables/DataMan/TSMIdColumn.cc,
TSMCoordColumn.cc, TSMCube.cc, TiledStMan.cc, Tiled*StMan.cc, casa/Containers/RecordRep.cc):
a hypercolumn (table.dat's private keyword ``Hypercolumn_NAME``) names its data columns,
its coordinate columns (one per axis, "" for an axis without, or none at all) and its id
columns. A hypercube's header entry starts with its value record, a ``Record`` AipsIO
object laid out as a TableRecord (big-endian, as the whole header).

* Id columns (TiledDataStMan only; the others refuse them): scalars of Bool, Int, uInt,
  Float, Double, Complex, DComplex or String. A row's value is the field of the column's
  name in the record of the cube holding the row, given when the cube is added or
  extended (its type the column's: casacore checks it then).
* Coordinate columns: Int, uInt, Float, Double, Complex or DComplex; a vector for each of
  the first axes (a cell's), a scalar for the others (the rows'). A cube's record holds a
  vector per coordinate, as long as the cube along its axis (zeros until values are
  given or put). A vector column's cell is that vector; a scalar's value is its element
  at the row's position on the axis.

casacore refuses to read a row in no cube (TiledDataStMan rows past its cubes;
TiledShapeStMan rows without a shape are in its cube 0, whose record is empty) or whose
cube's record lacks the field. Here a scalar column holding such a row is refused whole
(FormatError), and a vector column's cell there is undefined, as a data column's is.
Records are decoded by :mod:`.tabledat` only when such a column is read.
"""

import numpy as np

from ...errors import FormatError
from . import tabledat
from .aipsio import AipsReader
from .base import (
    NUMERIC_TYPES,
    TP_BOOL,
    TP_COMPLEX,
    TP_DCOMPLEX,
    TP_DOUBLE,
    TP_FLOAT,
    TP_INT,
    TP_STRING,
    TP_UINT,
    read_exact,
)

ID_TYPES = (TP_BOOL, TP_INT, TP_UINT, TP_FLOAT, TP_DOUBLE, TP_COMPLEX, TP_DCOMPLEX, TP_STRING)
COORDINATE_TYPES = (TP_INT, TP_UINT, TP_FLOAT, TP_DOUBLE, TP_COMPLEX, TP_DCOMPLEX)
ARRAY_OF = {element: array for array, element in tabledat.ARRAY_ELEMENT.items()}
MAX_RECORD_BYTES = 8 << 20  # a record is decoded into Python objects: bounded
MAX_RECORDS_KEPT = 1024  # decoded records kept (TiledCellStMan has one cube per row)


def hypercolumn_roles(hyper):
    """{column name: ("id", None) or ("coordinate", axis)} of one ``Hypercolumn_NAME``
    keyword (a dict, see tabledat.record_dict)."""
    roles = {}
    if not isinstance(hyper, dict):
        return roles
    for role in ("coord", "id"):
        names = hyper.get(role)
        names = names.get("values") if isinstance(names, dict) else None
        for axis, name in enumerate(names if isinstance(names, list) else []):
            if isinstance(name, str) and name:
                roles[name] = ("coordinate", axis) if role == "coord" else ("id", None)
    return roles


def decodable(role, data_type, is_array, ndim):
    """Whether casacore can hold such a column in the role: the types and shapes above."""
    if role == "id":
        return not is_array and data_type in ID_TYPES
    return data_type in COORDINATE_TYPES and (not is_array or ndim == 1)


def _as_numpy(field_type, value):
    """A record field's value: an Array of numbers as a NumPy array (its own shape,
    Python order), anything else as decoded."""
    element = tabledat.ARRAY_ELEMENT.get(field_type)
    if element is None or not isinstance(value, tabledat.ArrayValue):
        return value
    if element == TP_BOOL:
        dtype = np.dtype(bool)
    elif element in NUMERIC_TYPES:
        dtype = np.dtype(NUMERIC_TYPES[element][0])
    else:
        return value
    if int(np.prod(value.shape, dtype=np.float64)) != len(value.values):
        raise FormatError(f"an array of shape {value.shape} holds {len(value.values)} values")
    return np.array(value.values, dtype).reshape(value.shape[::-1])


class HypercubeAxisValues:
    """The id and coordinate columns of one tiled manager (a ``TiledReader``)."""

    def __init__(self, reader, table, columns):
        hyper = tabledat.record_dict(table.dat.desc.private_keywords).get(
            "Hypercolumn_" + reader.hypercolumn)
        names = {c.name for c in columns}
        self.roles = {n: r for n, r in hypercolumn_roles(hyper).items() if n in names}
        self.reader = reader
        self._records = {}  # cube number -> {field name: (type, value)} of the roles' fields

    def holds(self, col):
        return col.name in self.roles

    # ------------------------------------------------------------ records

    def _records_of(self, cube_nrs):
        """{cube: {field name: (type, value)} of the roles' fields in its record}: those
        kept, the others decoded (and kept, at most MAX_RECORDS_KEPT), reading the
        header's bytes that hold them in few reads (neighbouring cubes' together)."""
        reader, kept = self.reader, self._records  # (reads may run side by side)
        found = {k: kept[k] for k in cube_nrs if k in kept}
        new, group = {}, []
        for k in sorted(set(cube_nrs) - set(found)):
            start, end = reader.cubes[k].record_span
            if end - start > MAX_RECORD_BYTES:
                raise FormatError(f"{reader.name}: hypercube {k}'s value record of "
                                  f"{end - start} bytes is too large (at most "
                                  f"{MAX_RECORD_BYTES})")
            if group and end - reader.cubes[group[0]].record_span[0] > MAX_RECORD_BYTES:
                new.update(self._decode_group(group))
                group = []
            group.append(k)
        if group:
            new.update(self._decode_group(group))
        if len(kept) + len(new) > MAX_RECORDS_KEPT:
            self._records = new if len(new) <= MAX_RECORDS_KEPT else {}
        else:
            kept.update(new)
        found.update(new)
        return found

    def _decode_group(self, cube_nrs):
        reader, records = self.reader, {}
        first = reader.cubes[cube_nrs[0]].record_span[0]
        data = read_exact(reader.source, reader.name, first,
                          reader.cubes[cube_nrs[-1]].record_span[1] - first,
                          "hypercube value records")
        for k in cube_nrs:
            start, end = reader.cubes[k].record_span
            r = AipsReader(data, start - first, end - first)  # (big-endian: the header)
            try:
                record = tabledat.read_value_record(r)
                records[k] = {
                    f.name: (f.type, _as_numpy(f.type, v))
                    for f, v in zip(record.desc.fields, record.values) if f.name in self.roles}
            except FormatError as exc:
                raise FormatError(f"{reader.name}: hypercube {k}'s value record: {exc}") \
                    from None
        return records

    def _field(self, col, records, cube_nr, rows):
        """(type, value) of ``col``'s field in the record of cube ``cube_nr`` (None: the
        rows are in no cube, or in TiledShapeStMan's cube 0 without the field)."""
        if cube_nr is None:
            return None
        found = records[cube_nr].get(col.name)
        if found is None and not (self.reader.kind == "TiledShapeStMan" and cube_nr == 0):
            raise FormatError(f"{self.reader.name}: the value record of hypercube {cube_nr} "
                              f"(rows {rows}) has no field {col.name}")
        return found

    def _batches(self, start, stop):
        """The reader's (cube, position, rows, "a..b") pieces of ``start..stop`` (casacore's
        cube 0 for TiledShapeStMan rows in no other cube) with their cubes' records, in
        batches of at most MAX_RECORDS_KEPT cubes: (records, pieces)."""
        reader, pieces, cubes, at = self.reader, [], set(), start
        for cube_nr, pos, n in reader._pieces(start, stop):
            if cube_nr is None and reader.kind == "TiledShapeStMan" and reader.cubes:
                cube_nr = 0
            if cube_nr is not None and not 0 <= cube_nr < len(reader.cubes):
                raise FormatError(f"{reader.name}: rows {at}..{at + n} in hypercube "
                                  f"{cube_nr} of {len(reader.cubes)}")
            if cube_nr not in cubes and len(cubes) == MAX_RECORDS_KEPT:
                yield self._records_of(cubes - {None}), pieces
                pieces, cubes = [], set()
            pieces.append((cube_nr, pos, n, f"{at}..{at + n}"))
            cubes.add(cube_nr)
            at += n
        yield self._records_of(cubes - {None}), pieces

    # ------------------------------------------------------------ values

    def read(self, col, start, stop):
        """Rows ``start..stop``: an ndarray, a list of UTF-8 bytes (a String id column), or
        cells (shape, values) / None (a vector coordinate column of several lengths or
        undefined cells), as TiledReader.read gives them."""
        role, axis = self.roles[col.name]
        if role == "coordinate" and col.is_array:
            return self._vectors(col, start, stop)
        parts = []
        for records, pieces in self._batches(start, stop):
            for cube_nr, pos, n, rows in pieces:
                found = self._field(col, records, cube_nr, rows)
                if found is None:
                    raise FormatError(f"{self.reader.name}: rows {rows} are in no hypercube: "
                                      f"casacore cannot read {col.name} there")
                if role == "id":
                    parts.append(self._id_values(col, cube_nr, found, n))
                else:
                    parts.append(self._scalar_coordinates(col, axis, cube_nr, found, pos, n))
        if col.data_type == TP_STRING:
            return [v for part in parts for v in part]
        return np.concatenate(parts) if parts else np.zeros(0, col.dtype)

    def _id_values(self, col, cube_nr, found, n):
        field_type, value = found
        if field_type != col.data_type:
            raise FormatError(f"{self.reader.name}: {col.name} in hypercube {cube_nr}'s "
                              f"record is {tabledat.type_name(field_type)}, the column "
                              f"{tabledat.type_name(col.data_type)}")
        if col.data_type == TP_STRING:
            return [value.encode("utf-8", "surrogateescape")] * n
        return np.full(n, value, col.dtype)

    def _vector(self, col, cube_nr, found):
        field_type, value = found
        if field_type != ARRAY_OF[col.data_type] or not isinstance(value, np.ndarray) or \
                value.ndim != 1:
            raise FormatError(f"{self.reader.name}: {col.name} in hypercube {cube_nr}'s "
                              f"record is not a vector of {tabledat.type_name(col.data_type)}")
        return value

    def _scalar_coordinates(self, col, axis, cube_nr, found, pos, n):
        """The elements at the rows' positions on ``axis`` (the rows walk the axes after a
        cell's, the first fastest; see TiledReader._pieces)."""
        reader, cube = self.reader, self.reader.cubes[cube_nr]
        cell_axes = reader._cell_axes(cube)
        if pos is None or not cell_axes <= axis < cube.ndim:
            raise FormatError(f"{reader.name}: scalar coordinate {col.name} of axis {axis} "
                              f"in hypercube {cube_nr} of rank {cube.ndim} with cells of "
                              f"rank {cell_axes}")
        reader._positions(cube, pos, n)  # the rows lie inside the cube
        vector = self._vector(col, cube_nr, found)
        index = np.arange(pos, pos + n, dtype=np.int64) // int(
            np.prod(cube.shape[cell_axes:axis], dtype=np.int64))
        if axis < cube.ndim - 1:
            index %= cube.shape[axis]
        if n and index.max() >= len(vector):
            raise FormatError(f"{reader.name}: {col.name} holds {len(vector)} values in "
                              f"hypercube {cube_nr} of shape {cube.shape}")
        return vector[index].astype(col.dtype, copy=False)

    def _vectors(self, col, start, stop):
        """Each row's cell: its cube's vector (None where the row is in no cube)."""
        cells, lengths = [], set()
        for records, pieces in self._batches(start, stop):
            for cube_nr, _, n, rows in pieces:
                found = self._field(col, records, cube_nr, rows)
                vector = None if found is None else \
                    self._vector(col, cube_nr, found).astype(col.dtype, copy=False)
                cells.append((vector, n))
                lengths.add(None if vector is None else len(vector))
        if len(lengths) == 1 and None not in lengths:
            return np.concatenate([np.broadcast_to(v, (n, len(v))) for v, n in cells])
        return [None if v is None else ((len(v),), v) for v, n in cells for _ in range(n)]

    def uniform_shape(self, col):
        """The one cell shape of every row, decoded from the records (cheap: no tiles);
        None when it varies or a vector cell is undefined. FormatError: a scalar column
        with a row casacore cannot read."""
        values = self.read(col, 0, self.reader.nrow)
        if isinstance(values, np.ndarray):
            return values.shape[1:]
        return () if col.data_type == TP_STRING and not col.is_array else None
