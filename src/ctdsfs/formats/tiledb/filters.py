"""TileDB filter pipelines: parsing, and undoing them on one chunk of a tile.

A pipeline (``format_spec/filter_pipeline.md``) is a maximum chunk size and a
list of filters; a tile is a run of chunks, each with the filters' metadata
and the filtered bytes. Reading runs the filters backwards: every filter takes
its own header from the front of the chunk metadata and hands the rest on
(compressors hand on the metadata they decompress). Codecs come from their
libraries (zlib, zstandard, lz4, bz2); TileDB's own transforms are done here
with NumPy, but for the usual BYTESHUFFLE then ZSTD (or LZ4), undone by python-blosc
in one pass, a whole tile in one call (see ``_blosc_tile`` and ``tiledb_blosc``).
Everything is untrusted: every length is checked against what is there, and every
filter's output is bounded before it is made: by what that filter can have been given
when the chunk was written (``_output_limits``), the chunk's declared size grown by the
filters before it, and for string encodings by the tile's cell count.
"""

import bz2
import hashlib
import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import lz4.block
import numpy as np
import zstandard

from ...errors import FormatError
from ...io.buffers import huge_page_buffer
from ...io.byte_reader import Reader
from . import blosc as tiledb_blosc

# datatype id -> (name, NumPy dtype string); sizes follow from the dtype
DATATYPES = {
    0: ("INT32", "<i4"), 1: ("INT64", "<i8"), 2: ("FLOAT32", "<f4"), 3: ("FLOAT64", "<f8"),
    4: ("CHAR", "|S1"), 5: ("INT8", "|i1"), 6: ("UINT8", "|u1"), 7: ("INT16", "<i2"),
    8: ("UINT16", "<u2"), 9: ("UINT32", "<u4"), 10: ("UINT64", "<u8"),
    11: ("STRING_ASCII", "|S1"), 12: ("STRING_UTF8", "|u1"), 13: ("STRING_UTF16", "<u2"),
    14: ("STRING_UTF32", "<u4"), 15: ("STRING_UCS2", "<u2"), 16: ("STRING_UCS4", "<u4"),
    17: ("ANY", "|u1"), 40: ("BLOB", "|u1"), 41: ("BOOL", "|u1"), 42: ("GEOM_WKB", "|u1"),
    43: ("GEOM_WKT", "|u1"),
}
DATATYPES.update({i: (name, "<i8") for i, name in enumerate(
    ("DATETIME_YEAR", "DATETIME_MONTH", "DATETIME_WEEK", "DATETIME_DAY", "DATETIME_HR",
     "DATETIME_MIN", "DATETIME_SEC", "DATETIME_MS", "DATETIME_US", "DATETIME_NS",
     "DATETIME_PS", "DATETIME_FS", "DATETIME_AS", "TIME_HR", "TIME_MIN", "TIME_SEC",
     "TIME_MS", "TIME_US", "TIME_NS", "TIME_PS", "TIME_FS", "TIME_AS"), start=18)})
STRING_TYPES = {4, 11, 12, 13, 14, 15, 16}
TIME_UNITS = ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as")
TIME_TYPES = set(range(18, 40))
INTEGER_TYPES = {0, 1, 5, 6, 7, 8, 9, 10} | TIME_TYPES

FILTER_NAMES = {0: "NONE", 1: "GZIP", 2: "ZSTD", 3: "LZ4", 4: "RLE", 5: "BZIP2",
                6: "DOUBLE_DELTA", 7: "BIT_WIDTH_REDUCTION", 8: "BITSHUFFLE", 9: "BYTESHUFFLE",
                10: "POSITIVE_DELTA", 12: "CHECKSUM_MD5", 13: "CHECKSUM_SHA256",
                14: "DICTIONARY", 15: "SCALE_FLOAT", 16: "XOR", 18: "WEBP", 19: "DELTA"}
COMPRESSORS = {1, 2, 3, 4, 5, 6, 14, 19}  # options: u8 compressor, i32 level (+ u8 type)
UNDONE = set(FILTER_NAMES) - {18}  # every filter but WEBP (lossy images) is undone here
BITSHUFFLE_BLOCK = 8192  # bytes shuffled at a time (TileDB's bitshuffle target block)
LZ4_MAX_RATIO = 255  # an LZ4 block never expands more than this
DOUBLE_DELTA_BLOCK = 1 << 15  # values undone at a time (their bits unpacked as bytes)
PARALLEL_CHUNKS = 8  # a tile of this many chunks or more is unfiltered by several threads,
# each taking a run of consecutive chunks
# a compressor chunk's metadata with one metadata part and one data part: the part counts,
# then (decompressed, compressed) sizes of each
ONE_PART_EACH = struct.Struct("<IIIIII")
SHUFFLE_METAS = {}  # a BYTESHUFFLE metadata part as compressed -> its parts' sizes
SHUFFLE_METAS_KEPT = 256  # (every chunk of a size has the same one: a few are kept)
HUGE_TILE = 4 << 20  # NumPy asks for huge pages from this size on
_POOL = None
_POOL_LOCK = threading.Lock()
_THREAD = threading.local()


def _forget_pool():
    """(A forked child, such as a mount's worker process, has none of the pool's threads.)"""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


class ChecksumMismatch(FormatError):
    """A checksum filter's digest does not match the bytes it guards."""


class StringOffsets(list):
    """The cell offsets RLE or DICTIONARY strings keep in a var tile (an array a chunk), at
    most ``cells`` in all: the tile's cell count bounds what each chunk may declare."""

    def __init__(self, cells):
        super().__init__()
        self.cells = cells

    def room(self):
        return self.cells - sum(map(len, self))


def dtype_of(datatype, what="TileDB"):
    """The NumPy dtype of a TileDB datatype id (``what`` names the place for the error)."""
    try:
        return np.dtype(DATATYPES[datatype][1])
    except KeyError:
        raise FormatError(f"{what}: unknown datatype {datatype}") from None


def user_dtype(datatype, cell_val_num):
    """(NumPy dtype, cell shape) of a fixed-size field as tiledb-py gives it: datetimes
    and times with their unit, BOOL as bool, two floats a cell as one complex, a fixed
    string of n characters as ``|Sn``; other cells of n values as n values of the type."""
    dtype = dtype_of(datatype)
    if datatype in TIME_TYPES:  # DATETIME_YEAR .. DATETIME_AS, then TIME_HR .. TIME_AS
        unit = TIME_UNITS[datatype - 18] if datatype < 31 else TIME_UNITS[datatype - 27]
        dtype = np.dtype(f"<{'M' if datatype < 31 else 'm'}8[{unit}]")
    elif datatype == 41:
        dtype = np.dtype("?")
    elif datatype in (2, 3) and cell_val_num == 2:
        return np.dtype("<c8" if datatype == 2 else "<c16"), ()
    elif datatype in (4, 11) and cell_val_num > 1:
        return np.dtype(f"S{cell_val_num}"), ()
    return dtype, () if cell_val_num == 1 else (cell_val_num,)


def datatype_name(datatype):
    return DATATYPES.get(datatype, (f"unknown({datatype})",))[0]


def parse_pipeline(reader):
    """A filter pipeline: {"max_chunk_size", "filters": [{"type", "name", options...}]}."""
    max_chunk, count = reader.unpack("I"), reader.count("I", 5)
    filters = []
    for _ in range(count):
        ftype, size = reader.unpack("B"), reader.unpack("I")
        options = Reader(reader.take(size), reader.what)
        f = {"type": ftype, "name": FILTER_NAMES.get(ftype, f"unknown({ftype})")}
        try:
            if ftype in COMPRESSORS:
                f["compressor"], f["level"] = options.unpack("Bi")
                if ftype in (6, 19) and options.left():
                    f["reinterpret_type"] = options.unpack("B")
            elif ftype in (7, 10):
                f["max_window_size"] = options.unpack("I")
            elif ftype == 15:
                f["scale"], f["offset"], f["byte_width"] = options.unpack("ddQ")
            elif ftype == 18 and options.left() >= 1:
                f["options"] = bytes(options.take(options.left())).hex()
        except FormatError:
            f["problem"] = "options truncated"
        filters.append(f)
    return {"max_chunk_size": max_chunk, "filters": filters}


def pipeline_problem(pipeline):
    """Why ctdsfs cannot undo ``pipeline``, or None."""
    for f in pipeline["filters"]:
        if f["type"] not in UNDONE:
            return f"filter {f['name']} cannot be undone by ctdsfs"
        if "problem" in f:
            return f"filter {f['name']}: {f['problem']}"
        if f["type"] == 15 and f["byte_width"] not in (1, 2, 4, 8):
            return f"SCALE_FLOAT byte width {f['byte_width']} is not 1, 2, 4 or 8"
    return None


def _stage_types(pipeline, datatype):
    """The datatype each filter receives when the tile's is ``datatype``."""
    types = []
    for f in pipeline["filters"]:
        types.append(datatype)
        if f["type"] in (6, 19) and f.get("reinterpret_type", 17) != 17:
            datatype = f["reinterpret_type"]
        elif f["type"] == 15:
            datatype = {1: 5, 2: 7, 4: 0, 8: 1}[f["byte_width"]]
    return types


def unfilter_tile(data, pipeline, datatype, cell_size, expected, what, string_offsets=None,
                  parallel=True, room=0):
    """The unfiltered bytes of one tile (``data``: its on-disk bytes, chunk count first,
    after ``room`` bytes of a writable buffer that may be written: the tile is then
    decoded in place where Blosc can, see ``tiledb_blosc.decode_blocks``).

    ``expected`` bounds the result (the tile's size as the schema and metadata
    declare it); a tile that claims more, or whose chunks do not add up, is a
    FormatError, and a checksum that fails a ChecksumMismatch. For var-sized
    strings under RLE or DICTIONARY (whose offsets live in the data tile, not in
    the offsets file) ``string_offsets``, a StringOffsets, receives the cell offsets.
    A large tile's chunks are unfiltered by several threads unless not ``parallel``.
    """
    problem = pipeline_problem(pipeline)  # (every pipeline: attributes', offsets', validity's)
    if problem:
        raise FormatError(f"{what}: {problem}")
    try:
        return _unfilter_tile(data, pipeline, datatype, cell_size, expected, what,
                              string_offsets, parallel, room)
    except MemoryError:
        raise FormatError(f"{what}: the tile needs more memory than there is") from None


def _unfilter_tile(data, pipeline, datatype, cell_size, expected, what, string_offsets,
                   parallel, room):
    reader = Reader(memoryview(data)[room:], what)
    count = reader.count("Q", 12)
    chunks, places, total = [], [], 0
    for _ in range(count):
        original, filtered, meta_len = reader.unpack("III")
        total += original
        if total > expected:
            raise FormatError(f"{what}: chunks declare more than the tile's {expected} bytes")
        meta = bytes(reader.take(meta_len))
        places.append(reader.pos)  # (where the chunk's filtered bytes start in the tile)
        chunks.append((original, meta, reader.take(filtered)))
    if reader.left():
        raise FormatError(f"{what}: {reader.left()} bytes after the last chunk")
    stages = list(reversed(list(zip(pipeline["filters"], _stage_types(pipeline, datatype)))))
    starts = np.cumsum([0] + [original for original, _, _ in chunks]).tolist()
    # BYTESHUFFLE undone last (the usual pipeline's first filter) writes each chunk's
    # values straight into the tile (no second copy to put the chunks together)
    out = _tile_buffer(total) if string_offsets is None and stages and \
        stages[-1][0]["type"] == 9 else None
    # ... and where ZSTD or LZ4 comes just before it, python-blosc undoes the two at once:
    # the whole tile in one call where those are the only filters
    fused = out is not None and len(stages) > 1 and \
        stages[-2][0]["type"] in tiledb_blosc.BLOSC_CODECS
    if fused:
        address, width = out.ctypes.data, dtype_of(stages[-1][1], what).itemsize
        if len(stages) == 2 and _blosc_tile(stages[0][0], width, chunks, address, what,
                                            data, places, room):
            return memoryview(out)

    string_cells = None if string_offsets is None else string_offsets.cells

    def unfilter(index):
        original, meta, body = chunks[index]
        limits = _output_limits(stages, cell_size, original, string_cells, what)
        for step, ((f, dtype), limit) in enumerate(zip(stages, limits)):
            if fused and step == len(stages) - 2 and _uncompress_unshuffle(
                    f, dtype, width, meta, body, address + starts[index], original, what):
                return None
            if out is not None and step == len(stages) - 1:
                into = out[starts[index]:starts[index] + original]
                return _byte_unshuffle_chunk(dtype, meta, body, into, what)
            if string_offsets is not None and f["type"] in (4, 14):
                meta, body = _strings_reverse(f, meta, body, limit, string_offsets, what)
            else:
                meta, body = _reverse(f, dtype, cell_size, meta, body, limit, what)
        if len(body) != original:
            raise FormatError(f"{what}: chunk {index} unfilters to {len(body)} bytes, "
                              f"not the {original} it declares")
        return body

    def unfilter_run(run):
        return [unfilter(index) for index in run]

    if parallel and string_offsets is None and len(chunks) >= PARALLEL_CHUNKS and stages:
        workers = os.cpu_count() or 2
        step = -(-len(chunks) // workers)
        runs = [range(i, min(i + step, len(chunks))) for i in range(0, len(chunks), step)]
        bodies = [body for run in _pool().map(unfilter_run, runs) for body in run]
    else:
        bodies = unfilter_run(range(len(chunks)))
    return memoryview(out) if out is not None else b"".join(bodies)


def _output_limits(stages, cell_size, original, string_cells, what):
    """The most bytes each of ``stages`` (the last filter first) may give for a chunk of
    ``original`` bytes: what its filter was given when the chunk was written, which is the
    chunk grown by every filter applied before it (a compressor's framing, RLE's run
    lengths, SCALE_FLOAT's wider integers, a string encoding's ids or runs)."""
    limits, size = [], original
    for f, datatype in reversed(stages):  # (in the order the writer applied them)
        limits.append(size)
        ftype = f["type"]
        if ftype in (1, 2, 3, 5):  # (gzip, zstd, lz4 and bzip2 grow bytes by less)
            size += size // 64 + 1024
        elif ftype in (4, 14) and string_cells is not None:  # (ids or runs, every cell)
            size += 16 * string_cells + 64
        elif ftype == 4:  # (a run of one value: the value and a 2-byte length)
            size = (size // cell_size + 1) * (cell_size + 2)
        elif ftype == 15:
            size = (size // dtype_of(datatype, what).itemsize + 1) * f["byte_width"]
        else:  # (a delta's header; the others give as many bytes as they take)
            size += 64
    return limits[::-1]


def _tile_buffer(size):
    """An unset buffer of ``size`` bytes for a tile, a large one starting on a huge page:
    NumPy asks for huge pages for it, but a buffer across a huge page's border gets small
    ones there, each a page fault (a quarter of an 8 MiB tile's, on average)."""
    return np.empty(size, np.uint8) if size < HUGE_TILE else huge_page_buffer(size)


def _blosc_tile(f, width, chunks, address, what, data, places, room):
    """ZSTD or LZ4 (``f``) then BYTESHUFFLE of values ``width`` bytes wide undone on every
    chunk of a tile by one python-blosc call, the tile written at ``address``: each
    chunk's data part is a block of one Blosc chunk (see ``tiledb_blosc``), read from
    ``data`` where the chunks' filtered bytes start at ``places`` (after ``room``).
    False (nothing done) where a chunk is not the plain case: other than one metadata
    part (the shuffle's, of one part as long as the chunk) and one data part, or chunks
    Blosc cannot take as its blocks."""
    sizes, streams, packed = [], [], []
    for (original, meta, body), place in zip(chunks, places):
        if len(meta) != ONE_PART_EACH.size:
            return False
        metas, datas, meta_size, meta_packed, data_size, data_packed = \
            ONE_PART_EACH.unpack(meta)
        if (metas, datas, meta_size, data_size) != (1, 1, 8, original) or \
                meta_packed + data_packed != len(body):
            return False
        if _shuffle_parts(f, bytes(body[:meta_packed]), what) != (1, original):
            return False
        sizes.append(original)
        streams.append(place + meta_packed)
        packed.append(data_packed)
    return tiledb_blosc.decode_blocks(f["type"], f["name"], width, sizes, data, streams,
                                      packed, address, what, room)


def _shuffle_parts(f, packed, what):
    """(part count, first part's size) of a BYTESHUFFLE metadata part compressed by ``f``
    (8 bytes decompressed): every chunk of a size has the same, so it is decompressed once."""
    parts = SHUFFLE_METAS.get(packed)
    if parts is None:
        parts = struct.unpack("<II", _decompress(f["type"], f, 6, 0, packed, 8, what))
        if len(SHUFFLE_METAS) >= SHUFFLE_METAS_KEPT:
            SHUFFLE_METAS.clear()
        SHUFFLE_METAS[packed] = parts
    return parts


def _uncompress_unshuffle(f, datatype, width, meta, body, address, size, what):
    """ZSTD or LZ4 (``f``, given ``datatype``), then BYTESHUFFLE of values ``width`` bytes
    wide, undone by python-blosc in one call, the chunk's ``size`` bytes written at
    ``address`` (its place in the tile): its codec decodes the part into a scratch block
    its unshuffle (SIMD) then writes out, half the CPU of doing the two here. The part is
    handed to Blosc as a chunk of one block (see ``tiledb_blosc``). False (nothing done)
    where the chunk is not that plain case: more than one part, or a part Blosc cannot
    take as a block (as long as its output)."""
    metas, datas = _compressed_parts(f, meta, body, size, what)
    if len(datas) != 1 or datas[0][0] != size:
        return False
    shuffle_meta = Reader(b"".join(_decompress(f["type"], f, datatype, 0, part, n, what)
                                   for n, part in metas), what)
    if shuffle_meta.count("I", 4) != 1 or shuffle_meta.unpack("I") != size:
        return False
    part = datas[0][1]
    if f["type"] == 2:
        _zstd_declares(part, size, what)
    return tiledb_blosc.decode_blocks(f["type"], f["name"], width, [size], part, [0],
                                      [len(part)], address, what)


def _byte_unshuffle_chunk(datatype, meta, body, into, what):
    """BYTESHUFFLE undone on a chunk's parts, written into ``into`` (its place in the tile)."""
    md = Reader(meta, what)
    sizes = [md.unpack("I") for _ in range(md.count("I", 4))]
    if sum(sizes) != len(into):
        raise FormatError(f"{what}: BYTESHUFFLE parts of {sum(sizes)} bytes, not the "
                          f"{len(into)} the chunk declares")
    src, pos, width = Reader(body, what), 0, dtype_of(datatype, what).itemsize
    for n in sizes:
        _byte_unshuffle(src.take(n), width, into[pos:pos + n])
        pos += n
    return into


def _byte_unshuffle(part, width, into):
    """Undo BYTESHUFFLE on one part into ``into`` (as long as the part): a byte plane at a
    time, twice as fast as copying the planes transposed; bytes past whole values stay."""
    n = len(part) // width
    planes = np.frombuffer(part, np.uint8, n * width).reshape(width, n)
    values = into[:n * width].reshape(n, width)
    for k in range(width):
        values[:, k] = planes[k]
    into[n * width:] = np.frombuffer(part, np.uint8)[n * width:]


def _pool():
    """Threads that unfilter the chunks of a large tile side by side (the codecs and
    NumPy release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 2,
                                       thread_name_prefix="tiledb-chunks")
        return _POOL


def _reverse(f, datatype, cell_size, meta, body, limit, what):
    """Undo one filter on (chunk metadata, chunk data): the metadata left and the data."""
    md = Reader(meta, what)
    ftype = f["type"]
    name = f["name"]
    if ftype in (1, 2, 3, 4, 5, 6, 19):
        metas, datas = _compressed_parts(f, meta, body, limit, what)
        return tuple(b"".join(_decompress(ftype, f, datatype, cell_size, part, size, what)
                              for size, part in parts) for parts in (metas, datas))
    if ftype in (12, 13):
        algorithm, width = (hashlib.md5, 16) if ftype == 12 else (hashlib.sha256, 32)
        parts_meta, parts_data = md.count("I", 8 + width), md.count("I", 8 + width)
        sums = [(md.unpack("Q"), bytes(md.take(width))) for _ in range(parts_meta + parts_data)]
        rest = bytes(md.take(md.left()))
        for (n, digest), source in zip(sums, [rest] * parts_meta + [body] * parts_data):
            if n > len(source) or algorithm(source[:n]).digest() != digest:
                raise ChecksumMismatch(f"{what}: {name} checksum mismatch")
        return rest, body
    if ftype in (8, 9, 16, 15):
        parts = md.count("I", 4)
        sizes = [md.unpack("I") for _ in range(parts)]
        if ftype == 15:  # (stored integers of byte_width back to values of the datatype)
            made = sum(n // f["byte_width"] for n in sizes) * dtype_of(datatype, what).itemsize
        else:
            made = sum(sizes)
        if made > limit:
            raise FormatError(f"{what}: {name} parts give {made} bytes, more than the "
                              f"{limit} the chunk can hold")
        src = Reader(body, what)
        out = [_unshuffle(ftype, f, datatype, bytes(src.take(n)), what) for n in sizes]
        return bytes(md.take(md.left())), b"".join(out)
    if ftype in (7, 10):
        return _unwindow(ftype, datatype, md, body, limit, what)
    if ftype == 0:
        return meta, body
    raise FormatError(f"{what}: filter {name} cannot be undone")


def _compressed_parts(f, meta, body, limit, what):
    """A compressor's chunk: ([(size, part)] of the metadata, the same of the data)."""
    md = Reader(meta, what)
    parts_meta, parts_data = md.count("I", 8), md.count("I", 8)
    sizes = struct.unpack_from(f"<{2 * (parts_meta + parts_data)}I", md.take(
        8 * (parts_meta + parts_data)))  # (original, compressed) of each part
    if sum(sizes[::2]) > limit + len(meta) + (1 << 16):
        raise FormatError(f"{what}: {f['name']} parts declare more than the chunk holds")
    src = Reader(body, what)
    parts = [(sizes[k], src.take(sizes[k + 1])) for k in range(0, len(sizes), 2)]
    return parts[:parts_meta], parts[parts_meta:]


def _strings_reverse(f, meta, body, limit, offsets_out, what):
    """RLE or DICTIONARY on var-sized strings: runs (or ids) back to the strings, and the
    cell offsets, which the writer kept here instead of in the offsets tile (appended to
    ``offsets_out``, a StringOffsets). The strings' size and cell count are checked
    against ``limit`` and the tile's cells left before anything is decoded."""
    md = Reader(meta, what)
    md.unpack("II")  # metadata and data part counts (one data part)
    size, compressed, offsets_bytes = md.unpack("III")
    cells, room = offsets_bytes // 8, offsets_out.room()
    if size > limit or cells > room:
        raise FormatError(f"{what}: {f['name']} strings declare {size} bytes in {cells} "
                          f"cells, more than the chunk's {limit} bytes or the tile's "
                          f"{room} cells left")
    src = Reader(Reader(body, what).take(compressed), what)
    if f["type"] == 4:
        run_width, length_width = md.unpack("BB")
        runs, words = _string_runs(src, run_width, length_width, cells, what)
    else:
        runs, words = _dictionary_cells(md, src, cells, what)
    lengths = np.fromiter(map(len, words), np.int64, len(words))
    if int(runs.sum()) != cells or int((lengths * runs).sum()) != size:
        raise FormatError(f"{what}: {f['name']} strings do not fill the tile")
    starts = np.repeat(lengths, runs)
    offsets_out.append(np.concatenate(([0], np.cumsum(starts)[:-1])).astype("<u8")
                       if cells else np.zeros(0, "<u8"))
    return bytes(md.take(md.left())), b"".join(
        word * n for word, n in zip(words, runs.tolist()))


def _be(reader, width):
    """A big-endian unsigned integer of ``width`` bytes (1, 2, 4 or 8)."""
    return int.from_bytes(reader.take(_width(width, reader.what)), "big")


def _width(width, what):
    """``width``, if a big-endian integer of the string encodings can be that wide."""
    if width not in (1, 2, 4, 8):
        raise FormatError(f"{what}: integer width {width} is not 1, 2, 4 or 8")
    return width


def _string_runs(src, run_width, length_width, cells, what):
    """(run lengths, strings) of RLE strings, never more runs than cells nor a run longer."""
    runs, words = [], []
    while src.left():
        if len(runs) >= cells:
            raise FormatError(f"{what}: more RLE runs than cells")
        run = _be(src, run_width)
        if run > cells:
            raise FormatError(f"{what}: an RLE run longer than the tile")
        runs.append(run)
        words.append(bytes(src.take(_be(src, length_width))))
    return np.array(runs, np.int64), words


def _dictionary_cells(md, src, cells, what):
    """(ones, the string of every cell) of DICTIONARY strings: the dictionary from the
    metadata, then an id a cell, never more words or ids than cells."""
    id_width, length_width = md.unpack("BB")
    words = Reader(md.take(md.unpack("I")), what)
    dictionary = []
    while words.left():
        if len(dictionary) > cells:
            raise FormatError(f"{what}: dictionary longer than the tile")
        dictionary.append(bytes(words.take(_be(words, length_width))))
    width = _width(id_width, what)
    if src.left() % width or src.left() // width > cells:
        raise FormatError(f"{what}: {src.left()} bytes of dictionary ids for {cells} cells")
    ids = np.frombuffer(src.take(src.left()), f">u{width}")
    if len(ids) and int(ids.max()) >= len(dictionary):
        raise FormatError(f"{what}: dictionary id {int(ids.max())} is not in the dictionary")
    return np.ones(len(ids), np.int64), [dictionary[i] for i in ids.tolist()]


def _decompress(ftype, f, datatype, cell_size, data, size, what):
    """One compressed part back to its ``size`` bytes (never more)."""
    try:
        if ftype == 1:  # (one byte more than declared shows a part that inflates further;
            # max_length 0 would mean no limit at all)
            out = zlib.decompressobj().decompress(data, size + 1)
        elif ftype == 2:
            out = _unzstd(data, size, what)
        elif ftype == 3:
            if size > LZ4_MAX_RATIO * len(data) + 16:  # (the block would be allocated first)
                raise FormatError(f"{what}: LZ4 part of {len(data)} bytes cannot give {size}")
            out = lz4.block.decompress(data, uncompressed_size=size) if size else b""
        elif ftype == 5:
            out = bz2.BZ2Decompressor().decompress(data, size + 1)  # (as GZIP)
        elif ftype == 4:
            out = _un_rle(data, cell_size, size, what)
        else:
            kind = f.get("reinterpret_type", 17)
            out = _undelta(ftype, dtype_of(datatype if kind == 17 else kind, what), data, size,
                           what)
    except (zlib.error, zstandard.ZstdError, lz4.block.LZ4BlockError, OSError, EOFError,
            ValueError, MemoryError) as exc:
        raise FormatError(f"{what}: {f['name']} does not decompress: {exc}") from None
    if len(out) != size:
        raise FormatError(f"{what}: {f['name']} gave {len(out)} bytes, not {size}")
    return out


def _unzstd(data, size, what):
    """A zstd frame back to ``size`` bytes. python-zstandard sizes its output by the
    content size a frame declares, whatever ``max_output_size`` says: a frame that
    declares another size than the part's is refused before anything is allocated."""
    if not size:
        return b""
    _zstd_declares(data, size, what)
    return _zstd().decompress(data, max_output_size=size)


def _zstd_declares(data, size, what):
    """Refuse a zstd frame that declares another content size than ``size``."""
    declared = zstandard.frame_content_size(data)
    if declared not in (-1, size):
        raise FormatError(f"{what}: ZSTD frame declares {declared} bytes, not {size}")


def _zstd():
    """This thread's zstd decompressor (making one per chunk costs as much as decoding)."""
    try:
        return _THREAD.zstd
    except AttributeError:
        _THREAD.zstd = zstandard.ZstdDecompressor()
        return _THREAD.zstd


def _un_rle(data, value_size, size, what):
    """Runs of (value, big-endian u16 length) back to the values."""
    run = value_size + 2
    if not value_size or len(data) % run:
        raise FormatError(f"{what}: RLE data is not whole runs")
    runs = np.frombuffer(data, np.uint8).reshape(-1, run)
    lengths = runs[:, value_size].astype(np.int64) * 256 + runs[:, value_size + 1]
    if int(lengths.sum()) * value_size != size:
        raise FormatError(f"{what}: RLE runs do not add up to {size} bytes")
    return np.repeat(runs[:, :value_size], lengths, axis=0).tobytes()


def _undelta(ftype, dtype, data, size, what):
    """DELTA and DOUBLE_DELTA back to values of ``dtype`` (wrapping arithmetic)."""
    src = Reader(data, what)
    if ftype == 6:
        bits = src.unpack("B")
    count = src.unpack("Q")
    if count * dtype.itemsize != size:
        raise FormatError(f"{what}: delta count {count} does not fill {size} bytes")
    if ftype == 19:
        values = np.frombuffer(src.take(size), dtype).astype(np.int64)
        return np.cumsum(values, dtype=np.int64).astype(dtype).tobytes()
    if bits >= dtype.itemsize * 8 - 1:
        return bytes(src.take(size))
    first = np.frombuffer(src.take(min(count, 2) * dtype.itemsize), dtype).astype(np.int64)
    if count <= 2:
        return first.astype(dtype).tobytes()
    width = bits + 1  # a sign bit, then the magnitude
    if (count - 2) * width > 64 * (src.left() // 8):
        raise FormatError(f"{what}: DOUBLE_DELTA bit stream is short")
    stream = np.frombuffer(src.take(src.left() // 8 * 8), "<u8").astype(">u8").view(np.uint8)
    weights = (np.uint64(1) << np.arange(bits - 1, -1, -1, dtype=np.uint64))
    delta, value = first[1] - first[0], first[1]
    out = [first.astype(dtype).tobytes()]
    for k in range(0, count - 2, DOUBLE_DELTA_BLOCK):  # (bits as bytes take 8x their data)
        n = min(DOUBLE_DELTA_BLOCK, count - 2 - k)
        start, stop = k * width, (k + n) * width
        bits_of = np.unpackbits(stream[start // 64 * 8:-(-stop // 64) * 8])
        block = bits_of[start % 64:start % 64 + n * width].reshape(n, width)
        magnitude = (block[:, 1:].astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        dd = np.where(block[:, 0] == 1, -magnitude.astype(np.int64), magnitude.astype(np.int64))
        deltas = delta + np.cumsum(dd, dtype=np.int64)
        values = value + np.cumsum(deltas, dtype=np.int64)
        delta, value = deltas[-1], values[-1]
        out.append(values.astype(dtype).tobytes())
    return b"".join(out)


def _unshuffle(ftype, f, datatype, part, what):
    """BITSHUFFLE, BYTESHUFFLE, XOR and SCALE_FLOAT on one part."""
    dtype = dtype_of(datatype, what)
    width = dtype.itemsize
    if ftype == 9:
        out = np.empty(len(part), np.uint8)
        _byte_unshuffle(part, width, out)
        return out.tobytes()
    if ftype == 8:
        if len(part) % width or len(part) % 8:
            return part
        return b"".join(_bitunshuffle(part[i:i + BITSHUFFLE_BLOCK], width)
                        for i in range(0, len(part), BITSHUFFLE_BLOCK))
    if ftype == 16:
        if len(part) % width:
            raise FormatError(f"{what}: XOR part is not whole values")
        ints = np.frombuffer(part, f"<u{width}" if width > 1 else "u1")
        return np.bitwise_xor.accumulate(ints).tobytes() if len(ints) else b""
    stored = np.frombuffer(part, {1: "i1", 2: "<i2", 4: "<i4", 8: "<i8"}[f["byte_width"]],
                           len(part) // f["byte_width"])
    return (stored.astype(dtype).astype(np.float64) * f["scale"] + f["offset"]) \
        .astype(dtype).tobytes()


def _bitunshuffle(block, width):
    """Undo bitshuffle on ``block`` (bytes); elements past a multiple of 8 are copied."""
    count = len(block) // width
    shuffled = count - count % 8
    if not shuffled:
        return block
    bits = np.unpackbits(np.frombuffer(block, np.uint8, shuffled * width),
                         bitorder="little").reshape(width * 8, shuffled)
    out = np.packbits(bits.T.reshape(shuffled, width, 8), axis=-1, bitorder="little")
    return out.tobytes() + block[shuffled * width:]


def _unwindow(ftype, datatype, md, body, limit, what):
    """BIT_WIDTH_REDUCTION and POSITIVE_DELTA: windows of values relative to an offset,
    giving no more than ``limit`` bytes."""
    dtype = dtype_of(datatype, what)
    if datatype not in INTEGER_TYPES or (ftype == 7 and dtype.itemsize == 1):
        return bytes(md.data[md.pos:]), body  # these types pass through unchanged
    total = md.unpack("I") if ftype == 7 else None
    windows = md.count("I", dtype.itemsize + 4)
    src = Reader(body, what)
    out, made = [], 0
    for _ in range(windows):
        base = np.frombuffer(md.take(dtype.itemsize), dtype)[0]
        bits = md.unpack("B") if ftype == 7 else dtype.itemsize * 8
        nbytes = md.unpack("I")
        made += nbytes
        if made > limit:
            raise FormatError(f"{what}: {FILTER_NAMES[ftype]} windows give more than the "
                              f"{limit} bytes the chunk can hold")
        if nbytes % dtype.itemsize or (ftype == 7 and bits >= dtype.itemsize * 8):
            out.append(bytes(src.take(nbytes)))
            continue
        count = nbytes // dtype.itemsize
        if ftype == 7:
            if bits not in (8, 16, 32):
                raise FormatError(f"{what}: bit width {bits} is not 8, 16 or 32")
            stored = np.frombuffer(src.take(count * bits // 8), f"<u{bits // 8}")
            values = stored.astype(dtype) + base
        else:
            values = np.cumsum(np.frombuffer(src.take(nbytes), dtype), dtype=dtype) + base
        out.append(values.astype(dtype).tobytes())
    data = b"".join(out)
    if total is not None and len(data) != total:
        raise FormatError(f"{what}: BIT_WIDTH_REDUCTION gave {len(data)} bytes, not {total}")
    return bytes(md.take(md.left())), data
