"""The ``.pycauset`` container: codec, and a container of four derived files.

Layout (spec in shared/seeds, typed metadata in FORMAT-NOTES; all little-endian):
a 16-byte preamble (``PYCAUSET``, u32 version 1, u8 endian 1, u16 header bytes
4096, u8 0), slots A and B (128 bytes at 16 and 144: seven u64 fields, a zlib
CRC-32 of those 56 bytes, 68 zero bytes), the payload at a 4096-aligned offset,
and append-only metadata blocks (``PCMB`` framing of 32 bytes + payload, at a
16-aligned offset). The valid slot with the highest generation is active
(ties go to B, as pycauset decides).

Shown as a directory:

* ``payload``: the raw payload bytes; in-place writes go to the file, its size is fixed;
* ``payload.npy``: for dense layouts with a NumPy element type, an ``.npy`` header
  followed by the payload bytes (nothing copied), so ``numpy.load(mmap_mode="r")``
  works; writes past the header land in the payload;
* ``metadata.json``: the active metadata as JSON (mapping below); writing a new
  document commits it the crash-consistent way (append block, fsync, write the
  inactive slot with generation + 1, fsync); invalid documents change nothing;
* ``header.json``: read-only, the preamble, both slots and the metadata framing.

JSON mapping of the typed values, lossless both ways: bool, string, array and
map as themselves; integers as JSON integers (negative ones are i64, the
others u64, which is pycauset's own rule); f64 as JSON numbers with a
fraction or exponent. Values JSON cannot say are tagged one-key objects:
``{"$bytes": "<base64>"}``, ``{"$i64": n}`` (a non-negative i64),
``{"$f64": "nan"|"inf"|"-inf"}``, and ``{"$map": {...}}`` for a map whose only
key starts with ``$``.
"""

import base64
import json
import logging
import math
import struct
import threading
import zlib
from dataclasses import dataclass

from ..container import Container, Usage
from ..errors import CtdsfsError, Escaped, FormatError, NotPermitted, ReadOnlyError
from ..io.byte_reader import Reader
from ..io.npy import npy_header
from ..io.store import open_store

log = logging.getLogger(__name__)

MAGIC = b"PYCAUSET"
PREAMBLE = struct.Struct("<8sIBHB")
SLOT_FIELDS = struct.Struct("<7Q")
SLOT_SIZE = 128
SLOT_OFFSETS = {"A": 16, "B": 16 + SLOT_SIZE}
HEADER_BYTES = 4096
BLOCK_MAGIC = b"PCMB"
BLOCK_HEAD = struct.Struct("<4sIIIQII")  # 32 bytes of metadata block framing
MAX_METADATA = 256 << 20  # refuse to read a larger metadata block (hostile length)
MAX_DEPTH = 256  # nesting of typed arrays/maps

NUMPY_TYPES = {
    "FLOAT64": "<f8", "FLOAT32": "<f4", "FLOAT16": "<f2",
    "INT8": "|i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "UINT8": "|u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "COMPLEX_FLOAT64": "<c16", "COMPLEX_FLOAT32": "<c8",
}

# What pycauset.load (pycauset/_internal/persistence.py) accepts: the matrix types it
# knows, and for those whose class the data type picks, the data types it knows.
_FLOATS = {"FLOAT16", "FLOAT32", "FLOAT64", "COMPLEX_FLOAT16", "COMPLEX_FLOAT32",
           "COMPLEX_FLOAT64"}
_INTEGERS = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}
LOADABLE_DATA_TYPES = {"DENSE_FLOAT": _FLOATS | {"BIT"}, "INTEGER": _INTEGERS,
                       "VECTOR": _FLOATS | _INTEGERS | {"BIT"}}
SQUARE_MATRIX_TYPES = {"CAUSAL", "TRIANGULAR_FLOAT", "TRIANGULAR_INTEGER", "DIAGONAL",
                       "SYMMETRIC", "ANTISYMMETRIC"}
LOADABLE_MATRIX_TYPES = set(LOADABLE_DATA_TYPES) | SQUARE_MATRIX_TYPES | {"IDENTITY",
                                                                         "UNIT_VECTOR"}


# ---------------------------------------------------------------- typed metadata

def decode_typed(payload):
    """The top-level typed map, as ``(tag, value)`` trees that keep i64 vs u64 apart."""
    cur = Reader(payload, "metadata payload", truncated="{what} is truncated")
    value = _decode_value(cur, 0)
    if cur.left():
        raise FormatError("trailing bytes after the metadata map")
    if value[0] != "map":
        raise FormatError("top-level metadata is not a map")
    return value


def _decode_value(cur, depth):
    if depth > MAX_DEPTH:
        raise FormatError("metadata nested too deeply")
    tag = cur.unpack("B")
    if tag == 0x01:
        return ("bool", cur.unpack("B") != 0)
    if tag == 0x02:
        return ("i64", cur.unpack("q"))
    if tag == 0x03:
        return ("u64", cur.unpack("Q"))
    if tag == 0x04:
        return ("f64", cur.unpack("d"))
    if tag in (0x05, 0x06):
        raw = bytes(cur.take(cur.unpack("I")))
        if tag == 0x06:
            return ("bytes", raw)
        try:
            return ("str", raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise FormatError("metadata string is not UTF-8") from None
    if tag == 0x07:
        count = cur.unpack("I")
        if count > cur.left():  # every value takes at least one byte
            raise FormatError("metadata array count exceeds the payload")
        return ("array", [_decode_value(cur, depth + 1) for _ in range(count)])
    if tag == 0x08:
        count = cur.unpack("I")
        if count > cur.left():
            raise FormatError("metadata map count exceeds the payload")
        items = []
        for _ in range(count):
            key = bytes(cur.take(cur.unpack("H")))
            try:
                items.append((key.decode("utf-8"), _decode_value(cur, depth + 1)))
            except UnicodeDecodeError:
                raise FormatError("metadata key is not UTF-8") from None
        return ("map", items)
    raise FormatError(f"unknown metadata tag 0x{tag:02x}")


def encode_typed(value):
    """Bytes of a ``(tag, value)`` tree (map keys sorted, as pycauset writes them)."""
    out = bytearray()
    _encode_value(value, out)
    return bytes(out)


def _encode_value(value, out):
    tag, v = value
    if tag == "bool":
        out += b"\x01" + (b"\x01" if v else b"\x00")
    elif tag == "i64":
        out += b"\x02" + struct.pack("<q", v)
    elif tag == "u64":
        out += b"\x03" + struct.pack("<Q", v)
    elif tag == "f64":
        out += b"\x04" + struct.pack("<d", v)
    elif tag in ("str", "bytes"):
        raw = v.encode("utf-8") if tag == "str" else bytes(v)
        out += (b"\x05" if tag == "str" else b"\x06") + struct.pack("<I", len(raw)) + raw
    elif tag == "array":
        out += b"\x07" + struct.pack("<I", len(v))
        for item in v:
            _encode_value(item, out)
    else:
        out += b"\x08" + struct.pack("<I", len(v))
        for key, item in sorted(v, key=lambda kv: kv[0]):
            raw = key.encode("utf-8")
            out += struct.pack("<H", len(raw)) + raw
            _encode_value(item, out)


def native(value):
    """A ``(tag, value)`` tree as pycauset's own reader returns it: ints, floats, str,
    bytes, lists and dicts (what its loader, and :func:`load_problem`, look at)."""
    tag, v = value
    if tag == "array":
        return [native(item) for item in v]
    if tag == "map":
        return {key: native(item) for key, item in v}
    return v


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape(meta):
    """``(rows, cols)`` of a :func:`native` dict if both are non-negative integers, else None."""
    rows, cols = meta.get("rows"), meta.get("cols")
    if _is_int(rows) and _is_int(cols) and rows >= 0 and cols >= 0:
        return rows, cols
    return None


def _fills(shape, descr, payload_length):
    """Whether ``rows * cols`` elements of NumPy type ``descr`` are exactly the payload."""
    return shape[0] * shape[1] * int(descr[2:]) == payload_length


def load_problem(meta, payload_length):
    """Why ``pycauset.load`` would refuse (or misread the payload with) the identity
    keys of ``meta`` (a :func:`native` dict), or None.

    Mirrors the loader: a matrix type it knows (block matrices are not judged
    here), a data type it knows for that matrix type, integer ``rows`` and
    ``cols`` (the loader also takes strings of digits; ctdsfs does not),
    square shapes where it demands them, an integer ``seed``, a non-empty
    ``payload_uuid`` and a numeric view ``scalar``. A dense payload of a NumPy
    element type must also be exactly ``rows * cols`` elements long.
    """
    kind, data_type = meta.get("matrix_type"), meta.get("data_type")
    if not isinstance(kind, str) or kind not in LOADABLE_MATRIX_TYPES:
        return f"matrix_type {kind!r} is not one pycauset loads (ctdsfs checks " \
               f"{', '.join(sorted(LOADABLE_MATRIX_TYPES))})"
    if kind in LOADABLE_DATA_TYPES and data_type not in LOADABLE_DATA_TYPES[kind]:
        return f"data_type {data_type!r} is not one pycauset loads for {kind}"
    shape = _shape(meta)
    if shape is None:
        return "rows and cols must be non-negative integers"
    rows, cols = shape
    if kind in SQUARE_MATRIX_TYPES and rows != cols:
        return f"{kind} needs rows == cols (got {rows} and {cols})"
    if not _is_int(meta.get("seed", 0)):
        return "seed must be an integer"
    uuid = meta.get("payload_uuid")
    if not isinstance(uuid, str) or not uuid:
        return "payload_uuid must be a non-empty string"
    view = meta.get("view", {})
    scalar = view.get("scalar", 1.0) if isinstance(view, dict) else 1.0
    if isinstance(scalar, dict):
        scalar = [scalar.get("real"), scalar.get("imag")]
    if not all(map(_is_number, scalar if isinstance(scalar, list) else [scalar])):
        return "view scalar must be a number or {real, imag} numbers"
    descr = NUMPY_TYPES.get(data_type)
    if kind in LOADABLE_DATA_TYPES and descr and not _fills(shape, descr, payload_length):
        return (f"{rows} x {cols} {data_type} elements do not fill the payload of "
                f"{payload_length} bytes")
    return None


def to_json(value):
    """A ``(tag, value)`` tree as JSON-ready Python values (the documented mapping)."""
    tag, v = value
    if tag in ("bool", "str", "u64"):
        return v
    if tag == "i64":
        return v if v < 0 else {"$i64": v}
    if tag == "f64":
        if math.isfinite(v):
            return v
        return {"$f64": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if tag == "bytes":
        return {"$bytes": base64.b64encode(v).decode("ascii")}
    if tag == "array":
        return [to_json(item) for item in v]
    obj = {key: to_json(item) for key, item in v}
    if len(obj) == 1 and next(iter(obj)).startswith("$"):
        return {"$map": obj}
    return obj


def from_json(obj, depth=0):
    """The inverse of :func:`to_json`; raises ValueError for what cannot be encoded."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(obj, bool):
        return ("bool", obj)
    if isinstance(obj, int):
        if -(1 << 63) <= obj < 0:
            return ("i64", obj)
        if 0 <= obj < (1 << 64):
            return ("u64", obj)
        raise ValueError(f"integer {obj} does not fit in 64 bits")
    if isinstance(obj, float):
        return ("f64", obj)
    if isinstance(obj, str):
        obj.encode("utf-8")  # lone surrogates cannot be stored
        return ("str", obj)
    if isinstance(obj, list):
        return ("array", [from_json(item, depth + 1) for item in obj])
    if isinstance(obj, dict):
        if len(obj) == 1:
            (key, inner), = obj.items()
            if key == "$bytes" and isinstance(inner, str):
                return ("bytes", base64.b64decode(inner, validate=True))
            if key == "$i64" and isinstance(inner, int) and not isinstance(inner, bool):
                if not -(1 << 63) <= inner < (1 << 63):
                    raise ValueError(f"$i64 {inner} out of range")
                return ("i64", inner)
            if key == "$f64" and inner in ("nan", "inf", "-inf"):
                return ("f64", float(inner))
            if key == "$map" and isinstance(inner, dict):
                return ("map", [(k, from_json(v, depth + 1)) for k, v in inner.items()])
            if key.startswith("$"):
                raise ValueError(f"unknown tag {key!r} (wrap such a map in {{\"$map\": ...}})")
        for key in obj:
            if len(key.encode("utf-8")) > 0xFFFF:
                raise ValueError("map key longer than 65535 bytes")
        return ("map", [(k, from_json(v, depth + 1)) for k, v in obj.items()])
    raise ValueError(f"{type(obj).__name__} values cannot be stored (null?)")


# ---------------------------------------------------------------- header

@dataclass
class Slot:
    name: str
    generation: int
    payload_offset: int
    payload_length: int
    metadata_offset: int
    metadata_length: int
    hot_offset: int
    hot_length: int
    crc_stored: int
    crc_ok: bool
    problem: str = None  # why the slot is not valid, or None

    def pack(self):
        head = SLOT_FIELDS.pack(self.generation, self.payload_offset, self.payload_length,
                                self.metadata_offset, self.metadata_length,
                                self.hot_offset, self.hot_length)
        return head + struct.pack("<I", zlib.crc32(head)) + bytes(68)


def parse_slot(name, raw, file_size):
    fields = SLOT_FIELDS.unpack(raw[:56])
    stored = struct.unpack("<I", raw[56:60])[0]
    slot = Slot(name, *fields, crc_stored=stored, crc_ok=zlib.crc32(raw[:56]) == stored)
    if not slot.crc_ok:
        slot.problem = "slot CRC mismatch"
    elif slot.payload_offset % 4096:
        slot.problem = "payload offset not aligned to 4096"
    elif slot.metadata_offset % 16:
        slot.problem = "metadata offset not aligned to 16"
    elif slot.payload_offset + slot.payload_length > file_size:
        slot.problem = "payload range past the end of the file"
    elif slot.metadata_offset + slot.metadata_length > file_size:
        slot.problem = "metadata range past the end of the file"
    return slot


def read_preamble(data, label):
    if len(data) < HEADER_BYTES:
        raise FormatError(f"{label}: truncated header ({len(data)} of {HEADER_BYTES} bytes)")
    magic, version, endian, header_bytes, reserved = PREAMBLE.unpack(data[:16])
    if magic != MAGIC:
        raise FormatError(f"{label}: magic mismatch (not a .pycauset file)")
    if version != 1:
        raise FormatError(f"{label}: unsupported format version {version}")
    if endian != 1:
        raise FormatError(f"{label}: unsupported endian marker {endian}")
    if header_bytes != HEADER_BYTES:
        raise FormatError(f"{label}: unsupported header size {header_bytes}")
    if reserved != 0:
        raise FormatError(f"{label}: reserved preamble byte is not zero")
    return {"magic": magic.decode(), "format_version": version, "endian": endian,
            "header_bytes": header_bytes}


def read_metadata_block(store, slot, label):
    """Framing and typed metadata of the block a slot points at."""
    if slot.metadata_length < BLOCK_HEAD.size:
        raise FormatError(f"{label}: metadata block framing too short ({slot.metadata_length})")
    if slot.metadata_length > MAX_METADATA:
        raise FormatError(f"{label}: metadata block of {slot.metadata_length} bytes is too large")
    block = store.pread(slot.metadata_offset, slot.metadata_length)
    if len(block) != slot.metadata_length:
        raise FormatError(f"{label}: metadata block truncated")
    magic, version, encoding, reserved0, length, crc, reserved1 = BLOCK_HEAD.unpack(block[:32])
    framing = {"offset": slot.metadata_offset, "length": slot.metadata_length,
               "magic": magic.decode("latin-1"), "block_version": version,
               "encoding_version": encoding, "payload_length": length,
               "payload_crc32": crc}
    if magic != BLOCK_MAGIC:
        raise FormatError(f"{label}: metadata block magic mismatch")
    if version != 1 or encoding != 1:
        raise FormatError(f"{label}: unsupported metadata block/encoding version "
                          f"{version}/{encoding}")
    if reserved0 or reserved1:
        raise FormatError(f"{label}: metadata block reserved fields are not zero")
    if BLOCK_HEAD.size + length != slot.metadata_length:
        raise FormatError(f"{label}: metadata block length mismatch")
    payload = block[32:]
    if zlib.crc32(payload) != crc:
        raise FormatError(f"{label}: metadata block CRC mismatch")
    try:
        return framing, decode_typed(payload)
    except FormatError as exc:
        raise FormatError(f"{label}: metadata does not decode: {exc}") from None


def metadata_block(payload):
    """The 32-byte framing plus payload of a new metadata block."""
    return BLOCK_HEAD.pack(BLOCK_MAGIC, 1, 1, 0, len(payload), zlib.crc32(payload), 0) + payload


# ---------------------------------------------------------------- the container

class Pycauset(Container):
    """A .pycauset file shown as payload, payload.npy, metadata.json and header.json."""

    format_name = "pycauset"
    block_size = 4096
    checks_reads = False
    kernel_write_cache = False  # writes are checked (fixed sizes, JSON) as they come

    def __init__(self, store):
        self.store = store
        self.label = store.label
        self.writable = store.writable
        self.failure = None
        self.problems = []
        self._lock = threading.RLock()
        self._load()
        self._staged = None  # a metadata.json being written: bytearray, applied on commit

    def _load(self):
        size = self.store.size()
        head = self.store.pread(0, HEADER_BYTES)
        self.preamble = read_preamble(head, self.label)
        self.slots = {n: parse_slot(n, head[o:o + SLOT_SIZE], size) for n, o in SLOT_OFFSETS.items()}
        valid = [s for s in self.slots.values() if s.problem is None]
        if not valid:
            reasons = "; ".join(f"slot {s.name}: {s.problem}" for s in self.slots.values())
            raise FormatError(f"{self.label}: no valid header slot ({reasons})")
        self.active = max(valid, key=lambda s: (s.generation, s.name))
        self.framing, self.metadata = read_metadata_block(self.store, self.active, self.label)
        self._metadata_json = (json.dumps(to_json(self.metadata), indent=2, sort_keys=True,
                                          allow_nan=False) + "\n").encode()
        self._npy = self._npy_header()
        self._header_json = (json.dumps(self._describe_header(), indent=2) + "\n").encode()

    def _npy_header(self):
        """The .npy header for a dense payload with a NumPy element type, else None.

        Every value is checked for its type first: metadata is untrusted, and a
        ``view`` or ``payload_layout`` that is not a map simply means no .npy.
        """
        meta = native(self.metadata)
        layout, view = meta.get("payload_layout"), meta.get("view", {})
        data_type, shape = meta.get("data_type"), _shape(meta)
        descr = NUMPY_TYPES.get(data_type) if isinstance(data_type, str) else None
        if not isinstance(layout, dict) or layout.get("kind") != "raw_dense" or descr is None:
            return None
        if shape is None or not _fills(shape, descr, self.active.payload_length):
            return None
        rows, cols = shape
        if meta.get("matrix_type") == "VECTOR":
            return npy_header(descr, (rows,), False)
        if isinstance(view, dict) and view.get("is_transposed"):
            return npy_header(descr, (cols, rows), True)  # stored rows: the logical columns
        return npy_header(descr, (rows, cols), False)

    def _describe_header(self):
        def slot(s):
            return {"offset": SLOT_OFFSETS[s.name], "generation": s.generation,
                    "payload_offset": s.payload_offset, "payload_length": s.payload_length,
                    "metadata_offset": s.metadata_offset, "metadata_length": s.metadata_length,
                    "hot_offset": s.hot_offset, "hot_length": s.hot_length,
                    "slot_crc32": s.crc_stored, "crc_ok": s.crc_ok,
                    "valid": s.problem is None, "problem": s.problem}
        return {"preamble": self.preamble, "active_slot": self.active.name,
                "slots": {n: slot(s) for n, s in self.slots.items()},
                "metadata_block": self.framing, "file_size": self.store.size()}

    # -- Container interface

    def names(self):
        names = ["payload"] + (["payload.npy"] if self._npy else [])
        return names + ["metadata.json", "header.json"]

    def _content(self, name):
        """(bytes held in memory, or None for payload-backed) and the size."""
        if name == "payload":
            return None, self.active.payload_length
        if name == "payload.npy" and self._npy:
            return None, len(self._npy) + self.active.payload_length
        if name == "metadata.json":
            data = self._staged if self._staged is not None else self._metadata_json
            return data, len(data)
        if name == "header.json":
            return self._header_json, len(self._header_json)
        raise FileNotFoundError(name)

    def entry_size(self, name):
        with self._lock:
            return self._content(name)[1]

    def entry_blocks(self, name):
        return -(-self.entry_size(name) // self.block_size)

    def nested(self, name):
        self._content(name)
        return None

    def usage(self):
        size = self.store.size()
        return Usage(self.block_size, -(-size // self.block_size), 0)

    def read(self, name, offset, size):
        with self._lock:
            data, total = self._content(name)
            end = min(offset + size, total)
            if offset >= end:
                return b""
            if data is not None:
                return bytes(data[offset:end])
            prefix = b""
            if name == "payload.npy":
                header = self._npy
                prefix = header[offset:end]
                offset, end = max(0, offset - len(header)), end - len(header)
                if end <= 0:
                    return prefix
            return prefix + self.store.pread(self.active.payload_offset + offset, end - offset)

    # -- writing

    def _check_writable(self):
        if not self.writable:
            raise ReadOnlyError(self.failure or f"{self.label} is read-only")

    def write(self, name, offset, data):
        with self._lock:
            self._check_writable()
            if name == "metadata.json":
                if self._staged is None:
                    self._staged = bytearray(self._metadata_json)
                if offset > len(self._staged):
                    self._staged.extend(bytes(offset - len(self._staged)))
                self._staged[offset:offset + len(data)] = data
                return len(data)
            if name == "header.json":
                raise NotPermitted("header.json is read-only")
            base, limit = 0, self.active.payload_length
            if name == "payload.npy":
                header = self._npy
                if offset < len(header):
                    head_part = bytes(data[:len(header) - offset])
                    if head_part != header[offset:offset + len(head_part)]:
                        raise NotPermitted("the .npy header cannot be changed "
                                          "(shape and dtype live in metadata.json)")
                base = len(header)
            elif name != "payload":
                raise FileNotFoundError(name)
            start = offset - base
            skip = max(0, -start)
            if start + len(data) > limit:
                raise NotPermitted(f"{name}: the payload has a fixed size of {limit} bytes")
            self.store.pwrite(self.active.payload_offset + start + skip, data[skip:])
            return len(data)

    def truncate(self, name, size):
        with self._lock:
            self._check_writable()
            if name == "metadata.json":
                if self._staged is None:
                    self._staged = bytearray(self._metadata_json)
                del self._staged[size:]
                self._staged.extend(bytes(size - len(self._staged)))
                return
            if size != self.entry_size(name):
                raise NotPermitted(f"{name}: size is fixed ({self.entry_size(name)} bytes)")

    def create(self, name, *args):
        """The four files are all there is: nothing can be added, removed or renamed."""
        raise NotPermitted("a .pycauset container has a fixed set of files")

    make_nested = remove = rename = create

    @property
    def dirty(self):
        return self._staged is not None

    def commit(self):
        """Commit a written metadata.json: append the block, then flip the slot."""
        with self._lock:
            if self._staged is None or not self.writable:
                return False
            staged, self._staged = bytes(self._staged), None
            if staged == self._metadata_json:
                return False
            refused = f"{self.label}/metadata.json not stored"
            try:
                value = from_json(json.loads(staged.decode("utf-8")))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSON nested deep
                raise CtdsfsError(f"{refused}: {exc}") from None
            if value[0] != "map":
                raise CtdsfsError(f"{refused}: the document must be an object")
            problem = load_problem(native(value), self.active.payload_length)
            if problem and problem != load_problem(native(self.metadata),
                                                   self.active.payload_length):
                raise CtdsfsError(f"{refused}: pycauset could not load it: {problem}")
            self.commit_metadata(value)
            return True

    def commit_metadata(self, value):
        """The spec's update rule: append, flush, write the inactive slot (gen + 1), flush."""
        payload = encode_typed(value)
        end = self.store.size()
        offset = (end + 15) & ~15
        block = metadata_block(payload)
        try:
            self.store.pwrite(end, bytes(offset - end) + block)
            self.store.fsync()
            active = self.active
            inactive = "B" if active.name == "A" else "A"
            slot = Slot(inactive, active.generation + 1, active.payload_offset,
                        active.payload_length, offset, len(block), active.hot_offset,
                        active.hot_length, 0, True)
            self.store.pwrite(SLOT_OFFSETS[inactive], slot.pack())
            self.store.fsync()
        except OSError as exc:
            self.writable = False
            self.failure = f"{self.label}: metadata commit failed ({exc}); now read-only"
            log.error("%s", self.failure)
            raise
        self._load()

    def reload_if_changed(self):
        """Re-read the header if another process committed (a slot now has a higher generation)."""
        with self._lock:
            if self._staged is not None:
                return False
            replaced = self.store.replaced()  # a remote object with a new ETag
            head = self.store.pread(0, HEADER_BYTES)
            if not replaced and head[16:16 + 2 * SLOT_SIZE] == b"".join(
                    self.slots[n].pack() if self.slots[n].crc_ok else head[o:o + SLOT_SIZE]
                    for n, o in SLOT_OFFSETS.items()):
                return False
            self._load()
            return True

    def describe(self):
        info = self._describe_header()
        info.update({"container": self.label, "format": "pycauset",
                     "metadata": to_json(self.metadata), "files": [
                         {"name": n, "size": self.entry_size(n)} for n in self.names()]})
        return info

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        lines = [f"{info['container']}: .pycauset version "
                 f"{info['preamble']['format_version']}, "
                 f"{info['file_size']} bytes, active slot {info['active_slot']}"]
        for name, slot in info["slots"].items():
            state = "valid" if slot["valid"] else f"INVALID: {slot['problem']}"
            lines.append(f"  slot {name}  generation {slot['generation']}, payload "
                         f"{slot['payload_length']} bytes at {slot['payload_offset']}, metadata "
                         f"{slot['metadata_length']} bytes at {slot['metadata_offset']} ({state})")
        block = info["metadata_block"]
        lines.append(f"  metadata block  {block['magic']} v{block['block_version']}, encoding "
                     f"v{block['encoding_version']}, payload {block['payload_length']} bytes, "
                     f"crc32 0x{block['payload_crc32']:08x}")
        lines.append("  metadata")
        lines += [Escaped("    " + line) for line in json.dumps(info["metadata"], indent=2,
                                                              sort_keys=True).splitlines()]
        lines.append("  files")
        lines += [f"    {f['size']:>10}  {f['name']}" for f in info["files"]]  # fixed names
        return lines

    def close(self):
        """Commit a metadata.json still pending (if it is valid), release the file."""
        with self._lock:
            try:
                self.commit()
            except CtdsfsError as exc:
                log.error("%s", exc)
            finally:
                self.store.close()


def open_file(path, *, verify_crc=True, writable=False):
    """The .pycauset file at ``path`` (its CRCs are always checked: they guard the header)."""
    store = open_store(path, writable=writable, lock=writable)
    try:
        return Pycauset(store)
    except BaseException:
        store.close()
        raise


def open_from_store(store, *, verify_crc=True):
    """The .pycauset file in a read-only ``store`` (a remote object)."""
    return Pycauset(store)
