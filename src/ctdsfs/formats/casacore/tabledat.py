"""casacore ``table.dat``: a decoder and encoder that reproduce the file byte for byte.

Structure (casacore note 260 and the writers in casacore's tables/Tables):
``Table`` object (version 2: ``uInt`` rows, 3: ``uInt64`` rows), ``uInt``
endianness, ``"PlainTable"``, a ``TableDesc`` object (name, version, comment,
the table keywords and private keywords as ``TableRecord`` objects, then per
column its class name and a ``BaseColumnDesc``), and the ColumnSet written
inline: a negative version (``-2``: ``uInt`` rows; ``-3``: ``Int64`` rows plus
the storage option and block size), the data managers, per column its
original name and data manager, and each data manager's private bytes.

The storage option (0 MultiFile, 1 MultiHDF5, 2 separate files) is found by
parsing, and :meth:`TableDat.with_storage` rewrites it the way casacore itself
would write the table (ColumnSet version 2 when the rows fit in an Int and the
table uses separate files). Keyword values of every type a TableRecord holds
are decoded (scalars, arrays, nested records, subtable references), so
``ctdsfs tableinfo`` can show them; versions this code does not know are refused.
"""

import struct
from dataclasses import dataclass, field

from ...errors import FormatError
from .aipsio import AipsReader, AipsWriter

# casacore's DataType enum (casa/Utilities/DataType.h)
TYPE_NAMES = ["Bool", "Char", "uChar", "Short", "uShort", "Int", "uInt", "float", "double",
              "Complex", "DComplex", "String", "Table",
              "Array<Bool>", "Array<Char>", "Array<uChar>", "Array<Short>", "Array<uShort>",
              "Array<Int>", "Array<uInt>", "Array<float>", "Array<double>", "Array<Complex>",
              "Array<DComplex>", "Array<String>", "Record", "Other", "Quantity",
              "Array<Quantity>", "Int64", "Array<Int64>"]
TP_TABLE, TP_RECORD, TP_INT64, TP_ARRAY_INT64 = 12, 25, 29, 30
# scalar type -> struct format (None: String; Bool is one byte)
SCALAR_FORMATS = {0: ">B", 1: ">b", 2: ">B", 3: ">h", 4: ">H", 5: ">i", 6: ">I", 7: ">f",
                  8: ">d", 9: ">2f", 10: ">2d", 11: None, TP_INT64: ">q"}
ARRAY_ELEMENT = {13: 0, 14: 1, 15: 2, 16: 3, 17: 4, 18: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
                 24: 11, TP_ARRAY_INT64: TP_INT64}
STORAGE_OPTIONS = {0: "MultiFile", 1: "MultiHDF5", 2: "SepFile"}
INT_MAX = 2 ** 31 - 1
MAX_BYTES = 64 << 20  # a table.dat is kilobytes: one of more bytes is refused unread


def type_name(code):
    return TYPE_NAMES[code] if 0 <= code < len(TYPE_NAMES) else f"type {code}"


# ---------------------------------------------------------------- values

def _read_scalar(r, code):
    fmt = SCALAR_FORMATS.get(code, "unknown")
    if fmt == "unknown":
        raise FormatError(f"cannot decode a value of {type_name(code)}")
    if fmt is None:
        return r.string()
    st = struct.Struct(fmt)
    values = st.unpack(r.take(st.size))
    if code == 0:
        return values[0] != 0
    return complex(*values) if len(values) == 2 else values[0]


def _write_scalar(w, code, value):
    fmt = SCALAR_FORMATS[code]
    if fmt is None:
        w.string(value)
    elif code == 0:
        w.u8(1 if value else 0)
    elif code in (9, 10):  # Complex, DComplex
        w.out += struct.pack(fmt, value.real, value.imag)
    else:
        w.out += struct.pack(fmt, value)


@dataclass
class ArrayValue:
    """An ``Array`` AipsIO object: its version, shape and elements (Fortran order)."""

    version: int
    shape: list
    values: list
    object_type: str = "Array"


def _read_array(r, code):
    element = ARRAY_ELEMENT[code]
    version = r.start()
    object_type = r.last_type
    shape = [r.u32() for _ in range(r.u32())]
    count = r.u32()
    if element == 0:  # Bool elements are packed to bits, lowest bit first
        raw = r.take((count + 7) // 8)
        values = [bool(raw[i // 8] >> (i % 8) & 1) for i in range(count)]
    else:
        if count > r.limit - r.pos:
            raise FormatError("array element count exceeds its object")
        values = [_read_scalar(r, element) for _ in range(count)]
    r.end()
    return ArrayValue(version, shape, values, object_type)


def _write_array(w, code, array):
    element = ARRAY_ELEMENT[code]
    w.start(array.object_type, array.version)
    w.u32(len(array.shape))
    for n in array.shape:
        w.u32(n)
    w.u32(len(array.values))
    if element == 0:
        packed = bytearray((len(array.values) + 7) // 8)
        for i, bit in enumerate(array.values):
            packed[i // 8] |= bool(bit) << (i % 8)
        w.out += packed
    else:
        for v in array.values:
            _write_scalar(w, element, v)
    w.end()


@dataclass
class IPosition:
    version: int
    values: list


def _read_iposition(r):
    version = r.start("IPosition")
    if version not in (1, 2):
        raise FormatError(f"IPosition version {version} is not supported")
    n = r.u32()
    values = [r.i32() if version == 1 else r.i64() for _ in range(n)]
    r.end()
    return IPosition(version, values)


def _write_iposition(w, ip):
    w.start("IPosition", ip.version)
    w.u32(len(ip.values))
    for v in ip.values:
        (w.i32 if ip.version == 1 else w.i64)(v)
    w.end()


@dataclass
class FieldDesc:
    name: str
    type: int
    extra: object = None  # IPosition (arrays), RecordDesc (records), String (tables)
    comment: str = ""


@dataclass
class RecordDesc:
    version: int
    fields: list


def _read_record_desc(r):
    version = r.start("RecordDesc")
    if version not in (1, 2):
        raise FormatError(f"RecordDesc version {version} is not supported")
    fields = []
    for _ in range(r.i32()):
        f = FieldDesc(r.string(), r.i32())
        if f.type == TP_RECORD:
            f.extra = _read_record_desc(r)
        elif f.type in ARRAY_ELEMENT:
            f.extra = _read_iposition(r)
        elif f.type == TP_TABLE:
            f.extra = r.string()
        elif f.type not in SCALAR_FORMATS:
            raise FormatError(f"keyword {f.name!r} has unsupported {type_name(f.type)}")
        if version > 1:
            f.comment = r.string()
        fields.append(f)
    r.end()
    return RecordDesc(version, fields)


def _write_record_desc(w, desc):
    w.start("RecordDesc", desc.version)
    w.i32(len(desc.fields))
    for f in desc.fields:
        w.string(f.name)
        w.i32(f.type)
        if f.type == TP_RECORD:
            _write_record_desc(w, f.extra)
        elif f.type in ARRAY_ELEMENT:
            _write_iposition(w, f.extra)
        elif f.type == TP_TABLE:
            w.string(f.extra)
        if desc.version > 1:
            w.string(f.comment)
    w.end()


@dataclass
class TableRecord:
    """A keyword set: its description, record type and one value per field."""

    desc: RecordDesc
    record_type: int
    values: list


def _read_record(r, object_type="TableRecord"):
    version = r.start()
    if r.last_type != object_type or version != 1:
        what = "keyword set" if object_type == "TableRecord" else "record"
        raise FormatError(f"{what} of type {r.last_type!r} version {version} "
                          "is not supported")
    desc = _read_record_desc(r)
    record_type = r.i32()
    values = _read_values(r, desc, object_type)
    r.end()
    return TableRecord(desc, record_type, values)


def read_value_record(r):
    """A casacore ``Record`` object (a data manager's own values, e.g. a hypercube's in a
    tiled manager's header): laid out as a TableRecord is."""
    return _read_record(r, "Record")


def _read_values(r, desc, object_type="TableRecord"):
    values = []
    for f in desc.fields:
        if f.type == TP_RECORD:
            # A nested record with fields stores only its values; an empty one, itself.
            values.append(_read_record(r, object_type) if not f.extra.fields else
                          TableRecord(f.extra, -1, _read_values(r, f.extra, object_type)))
        elif f.type == TP_TABLE:
            values.append(r.string())
        elif f.type in ARRAY_ELEMENT:
            values.append(_read_array(r, f.type))
        else:
            values.append(_read_scalar(r, f.type))
    return values


def _write_record(w, record):
    w.start("TableRecord", 1)
    _write_record_desc(w, record.desc)
    w.i32(record.record_type)
    _write_values(w, record.desc, record.values)
    w.end()


def _write_values(w, desc, values):
    for f, v in zip(desc.fields, values):
        if f.type == TP_RECORD:
            if not f.extra.fields:
                _write_record(w, v)
            else:
                _write_values(w, f.extra, v.values)
        elif f.type == TP_TABLE:
            w.string(v)
        elif f.type in ARRAY_ELEMENT:
            _write_array(w, f.type, v)
        else:
            _write_scalar(w, f.type, v)


# ---------------------------------------------------------------- descriptions

@dataclass
class ColumnDesc:
    class_name: str  # e.g. "ScalarColumnDesc<Int     >"
    name: str
    comment: str
    dm_type: str
    dm_group: str
    data_type: int
    options: int
    ndim: int
    shape: IPosition
    max_length: int
    keywords: TableRecord
    default: object = None  # scalar columns: the default value
    subtable: tuple = None  # SubTableDesc: (desc name, by name, TableDesc or None)

    @property
    def kind(self):
        return self.class_name.split("<")[0].strip()

    @property
    def is_array(self):
        return self.kind == "ArrayColumnDesc"


@dataclass
class TableDesc:
    version: int
    name: str
    desc_version: str
    comment: str
    keywords: TableRecord
    private_keywords: TableRecord
    columns: list


def _read_table_desc(r):
    version = r.start("TableDesc")
    if version != 2:
        raise FormatError(f"TableDesc version {version} is not supported")
    name, desc_version, comment = r.string(), r.string(), r.string()
    keywords, private = _read_record(r), _read_record(r)
    columns = [_read_column_desc(r) for _ in range(r.u32())]
    r.end()
    return TableDesc(version, name, desc_version, comment, keywords, private, columns)


def _read_column_desc(r):
    if r.u32() != 1:
        raise FormatError("ColumnDesc version is not 1")
    class_name = r.string()
    if r.u32() != 1:
        raise FormatError("BaseColumnDesc version is not 1")
    name, comment, dm_type, dm_group = r.string(), r.string(), r.string(), r.string()
    data_type, options, ndim = r.i32(), r.i32(), r.i32()
    kind = class_name.split("<")[0].strip()
    shape = _read_iposition(r) if kind == "ArrayColumnDesc" else None
    col = ColumnDesc(class_name, name, comment, dm_type, dm_group, data_type, options, ndim,
                     shape, r.u32(), _read_record(r))
    if r.u32() != 1:
        raise FormatError(f"column {name!r}: description version is not 1")
    if kind == "ScalarColumnDesc":
        col.default = _read_scalar(r, data_type)
    elif kind == "ArrayColumnDesc":
        col.default = r.bool()  # an unused flag casacore still writes
    elif kind == "SubTableDesc":
        desc_name, by_name = r.string(), r.bool()
        col.subtable = (desc_name, by_name, None if by_name else _read_table_desc(r))
    elif kind != "ScalarRecordColumnDesc":
        raise FormatError(f"column {name!r}: unknown column class {class_name!r}")
    return col


def _write_table_desc(w, d):
    w.start("TableDesc", d.version)
    w.string(d.name)
    w.string(d.desc_version)
    w.string(d.comment)
    _write_record(w, d.keywords)
    _write_record(w, d.private_keywords)
    w.u32(len(d.columns))
    for c in d.columns:
        w.u32(1)
        w.string(c.class_name)
        w.u32(1)
        for s in (c.name, c.comment, c.dm_type, c.dm_group):
            w.string(s)
        w.i32(c.data_type)
        w.i32(c.options)
        w.i32(c.ndim)
        if c.is_array:
            _write_iposition(w, c.shape)
        w.u32(c.max_length)
        _write_record(w, c.keywords)
        w.u32(1)
        if c.kind == "ScalarColumnDesc":
            _write_scalar(w, c.data_type, c.default)
        elif c.is_array:
            w.bool(c.default)
        elif c.kind == "SubTableDesc":
            w.string(c.subtable[0])
            w.bool(c.subtable[1])
            if not c.subtable[1]:
                _write_table_desc(w, c.subtable[2])
    w.end()


# ---------------------------------------------------------------- ColumnSet

@dataclass
class ColumnBinding:
    original_name: str
    seqnr: int
    fixed_shape: IPosition = None  # array columns with a fixed shape
    is_array: bool = False


@dataclass
class ColumnSet:
    version: int  # 2 or 3
    nrow: int
    storage_option: int = 2
    block_size: int = 0
    seq_count: int = 0
    data_managers: list = field(default_factory=list)  # (type name, sequence number)
    columns: list = field(default_factory=list)
    dm_info: list = field(default_factory=list)  # private bytes per data manager


def _read_column_set(r, table_desc):
    version = -r.i32()
    if version not in (2, 3):
        raise FormatError(f"ColumnSet version {version} is not supported")
    cs = ColumnSet(version, r.u32() if version == 2 else r.u64())
    if version == 3:
        cs.storage_option, cs.block_size = r.i32(), r.i32()
        if cs.storage_option not in STORAGE_OPTIONS:
            raise FormatError(f"unknown storage option {cs.storage_option}")
    cs.seq_count = r.u32()
    cs.data_managers = [(r.string(), r.u32()) for _ in range(r.u32())]
    for col in table_desc.columns:
        if r.u32() != 2:
            raise FormatError(f"column {col.name!r}: column data version is not 2")
        binding = ColumnBinding(r.string(), 0, is_array=col.is_array)
        if r.u32() != 1:
            raise FormatError(f"column {col.name!r}: derived column version is not 1")
        binding.seqnr = r.u32()
        if col.is_array and r.bool():
            binding.fixed_shape = _read_iposition(r)
        cs.columns.append(binding)
    cs.dm_info = [bytes(r.take(r.u32())) for _ in cs.data_managers]
    return cs


def _write_column_set(w, cs):
    w.i32(-cs.version)
    if cs.version == 2:
        w.u32(cs.nrow)
    else:
        w.u64(cs.nrow)
        w.i32(cs.storage_option)
        w.i32(cs.block_size)
    w.u32(cs.seq_count)
    w.u32(len(cs.data_managers))
    for dm_type, seqnr in cs.data_managers:
        w.string(dm_type)
        w.u32(seqnr)
    for b in cs.columns:
        w.u32(2)
        w.string(b.original_name)
        w.u32(1)
        w.u32(b.seqnr)
        if b.is_array:
            w.bool(b.fixed_shape is not None)
            if b.fixed_shape is not None:
                _write_iposition(w, b.fixed_shape)
    for info in cs.dm_info:
        w.u32(len(info))
        w.out += info


# ---------------------------------------------------------------- table.dat

@dataclass
class TableDat:
    version: int  # of the outer Table object: 2 (uInt rows) or 3 (uInt64 rows)
    nrow: int
    endian: int  # 0 big, 1 little (as casacore writes it)
    table_type: str
    desc: TableDesc
    column_set: ColumnSet

    @property
    def storage(self):
        return STORAGE_OPTIONS[self.column_set.storage_option]

    def with_storage(self, option, block_size=0):
        """A copy stored as ``option`` ("SepFile", "MultiFile", "MultiHDF5"), laid out
        exactly as casacore writes such a table (ColumnSet version 2 for SepFile tables
        whose rows fit in an Int, else version 3 with the option)."""
        code = {v: k for k, v in STORAGE_OPTIONS.items()}[option]
        cs = self.column_set
        new = ColumnSet(**{**cs.__dict__})
        if code == 2 and cs.nrow <= INT_MAX:
            new.version, new.storage_option, new.block_size = 2, 2, 0
        else:
            new.version, new.storage_option = 3, code
            new.block_size = block_size if code != 2 else cs.block_size
        return TableDat(self.version, self.nrow, self.endian, self.table_type, self.desc, new)

    def encode(self):
        w = AipsWriter()
        w.start("Table", self.version, outer=True)
        (w.u32 if self.version == 2 else w.u64)(self.nrow)
        w.u32(self.endian)
        w.string(self.table_type)
        _write_table_desc(w, self.desc)
        _write_column_set(w, self.column_set)
        w.end()
        return w.getvalue()


def decode(data, label="table.dat"):
    """Decode a table.dat; FormatError names what is wrong or not supported."""
    try:
        r = AipsReader(data)
        version = r.start("Table", outer=True)
        if version not in (2, 3):
            raise FormatError(f"Table version {version} is not supported")
        nrow = r.u32() if version == 2 else r.u64()
        endian = r.u32()
        table_type = r.string()
        if table_type != "PlainTable":
            raise FormatError(f"table type {table_type!r} is not supported")
        desc = _read_table_desc(r)
        column_set = _read_column_set(r, desc)
        r.end()
        if r.pos != len(r.buf):
            raise FormatError(f"{len(r.buf) - r.pos} bytes after the Table object")
    except FormatError as exc:
        raise FormatError(f"{label}: {exc}") from None
    return TableDat(version, nrow, endian, table_type, desc, column_set)


# ---------------------------------------------------------------- description

def plain(value):
    """A decoded keyword value as JSON-ready data."""
    if isinstance(value, complex):
        return [value.real, value.imag]
    if isinstance(value, ArrayValue):
        return {"shape": value.shape, "values": [plain(v) for v in value.values]}
    if isinstance(value, TableRecord):
        return record_dict(value)
    return value


def record_dict(record):
    out = {}
    for f, v in zip(record.desc.fields, record.values):
        out[f.name] = f"Table: {v}" if f.type == TP_TABLE else plain(v)
    return out


def describe(table, files=()):
    """``ctdsfs tableinfo``: the decoded table.dat as JSON-ready data.

    ``files`` are the storage manager files present (to list per data manager).
    """
    cs = table.column_set
    managers = []
    for (dm_type, seqnr), info in zip(cs.data_managers, cs.dm_info):
        prefix = f"table.f{seqnr}"
        managers.append({
            "type": dm_type, "sequence_number": seqnr, "info_bytes": len(info),
            "columns": [c.name for c, b in zip(table.desc.columns, cs.columns) if b.seqnr == seqnr],
            "files": sorted(f for f in files if f == prefix or f.startswith(prefix) and
                            not f[len(prefix):][:1].isdigit()),
        })
    columns = []
    for c, b in zip(table.desc.columns, cs.columns):
        col = {"name": c.name, "kind": c.kind, "data_type": type_name(c.data_type),
               "data_manager": next((dm for dm, seq in cs.data_managers if seq == b.seqnr), None),
               "data_manager_group": c.dm_group, "comment": c.comment,
               "keywords": record_dict(c.keywords)}
        if c.is_array:
            col["ndim"] = c.ndim
            col["shape"] = (b.fixed_shape or c.shape).values if (b.fixed_shape or c.shape) else []
        if c.kind == "ScalarColumnDesc":
            col["default"] = plain(c.default)
        columns.append(col)
    return {"rows": table.nrow, "storage_option": table.storage,
            "block_size": cs.block_size if cs.version == 3 else None,
            "table_version": table.version, "column_set_version": cs.version,
            "endian": "little" if table.endian else "big",
            "description": {"name": table.desc.name, "comment": table.desc.comment},
            "keywords": record_dict(table.desc.keywords),
            "private_keywords": record_dict(table.desc.private_keywords),
            "columns": columns, "data_managers": managers}
