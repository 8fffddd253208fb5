"""A standalone bloscpack file (or one bcolz superchunk) shown read-only: ``data`` (the
chunks decoded, in order), ``header.json`` and ``chunks/N``.

The file has a 32-byte header (version, options, checksum kind, typesize, chunk
size, last chunk size, chunk count, spare offsets), an optional metadata
section, optional chunk offsets, then Blosc chunks each followed by its checksum.
"""

import ast
import bisect
import contextlib
import itertools
import json
import math
import os
import struct
import zlib

import numpy as np

from ...errors import BlockError, FormatError
from ...io.blosc_chunk import BLOSC_HEADER, CHECKSUMS, Chunk
from ...io.decoded_cache import DecodedCache
from ...io.lazy_files import json_file
from ...io.npy import npy_header
from ...io.store import open_regular
from .view import (
    CHUNK_BYTES_MAX,
    JSON_BYTES_MAX,
    MAGIC,
    SUPERCHUNK_HEADER,
    ChunkDir,
    NpyFile,
    View,
    attrs_line,
    is_int,
)

BLOSCPACK_HEADER = struct.Struct("<4sBBBBiiqq")
METADATA_HEADER = struct.Struct("<8sBBBBIII8s")
META_CODECS = ("None", "zlib")
DTYPE_TEXT_MAX = 1 << 16  # the dtype text of an array's metadata (a record's descr)


class BloscpackFile(View):
    """A standalone .blp file: data, header.json, chunks/N (read-only)."""

    format_name = "bloscpack"
    version = 0  # (the file is open, never reloaded)

    def __init__(self, path):
        super().__init__(path)
        self.path = path
        self.cache = DecodedCache()
        self.fd = open_regular(path)
        try:
            self._load()
        except BaseException:
            os.close(self.fd)
            raise
        # where each chunk's bytes start in ``data`` (and where the last one ends)
        self._starts = [0, *itertools.accumulate(c.nbytes_range[1] for c in self._chunks)]
        self._add("data", NpyFile(self))
        layout = self._ndarray_layout()
        if layout:
            self._add("data.npy", NpyFile(_NdarrayView(self, *layout)))
        self._add("header.json", json_file(self.header_json))
        self._add("chunks", ChunkDir(self))

    def _load(self):
        size = self.file_size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, BLOSCPACK_HEADER.size, 0)
        if len(head) < SUPERCHUNK_HEADER.size or not head.startswith(MAGIC):
            raise FormatError(f"{self.path}: not a bloscpack file (no blpk header)")
        _, version, count = SUPERCHUNK_HEADER.unpack(head[:SUPERCHUNK_HEADER.size])
        self.metadata = None
        if version == 1 and count == 1:  # one bcolz superchunk: its Blosc header says the size
            self.header = {"format": "bcolz superchunk", "format_version": 1, "nchunks": 1}
            chunk = Chunk(self.path, 0, SUPERCHUNK_HEADER.size, size - SUPERCHUNK_HEADER.size,
                          (0, CHUNK_BYTES_MAX))
            self._chunks = [chunk]
            chunk.nbytes_range = (self._header(0)["nbytes"],) * 2
            return
        if len(head) < BLOSCPACK_HEADER.size:
            raise FormatError(f"{self.path}: truncated bloscpack header")
        (_, version, options, checksum, typesize, chunk_size, last_chunk, nchunks,
         spare) = BLOSCPACK_HEADER.unpack(head)
        self.header = {"format": "bloscpack", "format_version": version,
                       "offsets": bool(options & 1), "metadata": bool(options & 2),
                       "checksum": CHECKSUMS[checksum][0] if checksum < len(CHECKSUMS)
                       else checksum, "typesize": typesize, "chunk_size": chunk_size,
                       "last_chunk": last_chunk, "nchunks": nchunks, "max_app_chunks": spare}
        why = None
        if version != 3:
            why = f"format version {version} (ctdsfs reads version 3)"
        elif options & ~3 or checksum >= len(CHECKSUMS):
            why = f"unknown options 0x{options:02x} or checksum kind {checksum}"
        elif nchunks < 0 or spare < 0 or nchunks * BLOSC_HEADER.size + (
                8 * (nchunks + spare) if options & 1 else 0) > size:
            why = f"{nchunks} chunks (offsets for {spare} more) cannot fit in {size} bytes"
        elif nchunks and not (0 < chunk_size <= CHUNK_BYTES_MAX
                              and 0 < last_chunk <= chunk_size):
            why = f"chunk size {chunk_size}, last chunk {last_chunk} (at most " \
                  f"{CHUNK_BYTES_MAX} bytes each)"
        if why:
            raise FormatError(f"{self.path}: {why}")
        position = BLOSCPACK_HEADER.size
        if options & 2:
            position = self._load_metadata(position)
        digest_size = CHECKSUMS[checksum][1]
        offsets = None
        if options & 1:
            table = os.pread(self.fd, 8 * (nchunks + spare), position)
            if len(table) != 8 * (nchunks + spare):
                raise FormatError(f"{self.path}: chunk offsets truncated")
            offsets = struct.unpack(f"<{nchunks}q", table[:8 * nchunks])
            position += len(table)
        self.header["chunk_offsets"] = list(offsets) if offsets else None
        self._chunks = []
        for number in range(nchunks):
            place = offsets[number] if offsets else position
            if not position <= place <= size:
                raise FormatError(f"{self.path}: chunk {number} offset {place} is outside "
                                  f"{position} .. {size}")
            want = last_chunk if number == nchunks - 1 else chunk_size
            chunk = Chunk(self.path, number, place, size - place - digest_size,
                          (want, want), checksum)
            self._chunks.append(chunk)
            if offsets is None:  # chunks follow one another: their headers say where
                position = place + self._header(number)["cbytes"] + digest_size
            else:
                position = place + BLOSC_HEADER.size

    def _load_metadata(self, position):
        raw = os.pread(self.fd, METADATA_HEADER.size, position)
        if len(raw) != METADATA_HEADER.size:
            raise FormatError(f"{self.path}: metadata header truncated")
        (fmt, options, checksum, codec, level, meta_size, max_meta_size, comp_size,
         user_codec) = METADATA_HEADER.unpack(raw)
        if checksum >= len(CHECKSUMS) or codec >= len(META_CODECS) or options \
                or comp_size > max_meta_size:
            raise FormatError(f"{self.path}: metadata header is not valid")
        digest_size = CHECKSUMS[checksum][1]
        stored = os.pread(self.fd, min(comp_size, JSON_BYTES_MAX), position + 32)
        end = position + 32 + max_meta_size + digest_size
        if end > self.file_size:
            raise FormatError(f"{self.path}: metadata section runs past the end of the file")
        self.metadata = {"magic_format": fmt.rstrip(b"\0").decode("latin-1"),
                         "checksum": CHECKSUMS[checksum][0], "codec": META_CODECS[codec],
                         "level": level, "meta_size": meta_size,
                         "max_meta_size": max_meta_size, "meta_comp_size": comp_size,
                         "user_codec": user_codec.rstrip(b"\0").decode("latin-1")}
        problem = None
        if comp_size > JSON_BYTES_MAX or meta_size > JSON_BYTES_MAX:
            problem = f"over {JSON_BYTES_MAX} bytes: not read"
        elif digest_size and CHECKSUMS[checksum][2](stored) != os.pread(
                self.fd, digest_size, position + 32 + max_meta_size):
            problem = f"{CHECKSUMS[checksum][0]} checksum mismatch"
        else:
            try:
                text = zlib.decompressobj().decompress(stored, max(1, meta_size)) \
                    if codec else stored  # (max_length 0 would mean no limit)
                self.metadata["value"] = json.loads(text.decode("utf-8"))
            except (zlib.error, ValueError, RecursionError) as exc:
                problem = f"does not decode: {exc}"
        if problem:
            self.metadata["problem"] = problem
            self.problems.append(f"metadata {problem}")
        return end

    def _ndarray_layout(self):
        """(dtype, shape, fortran order) of the array ``pack_ndarray_to_file`` stored: its
        metadata says ``container: numpy``, the dtype (a repr of ``dtype.str`` or of a
        record's descr; before bloscpack 0.7.2 the string itself), shape and order. None
        (and a problem said) for anything else, or if the items do not fill ``data``."""
        value = (self.metadata or {}).get("value")
        if not isinstance(value, dict) or value.get("container") != "numpy":
            return None
        text, shape, order = value.get("dtype"), value.get("shape"), value.get("order")
        dtype = None
        if isinstance(text, str) and len(text) <= DTYPE_TEXT_MAX:
            with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError,
                                     RecursionError):
                literal = ast.literal_eval(text)
                dtype = np.dtype(literal if isinstance(literal, (str, list)) else text)
            if dtype is None:
                with contextlib.suppress(TypeError, ValueError, SyntaxError):
                    dtype = np.dtype(text)
        why = None
        if dtype is None or dtype.hasobject or dtype.itemsize == 0:
            why = f"dtype {text!r} is not one ctdsfs shows"
        elif not (isinstance(shape, list) and all(is_int(n) for n in shape)
                  and order in ("C", "F")):
            why = f"shape {shape!r} or order {order!r} is not valid"
        elif dtype.itemsize * math.prod(shape) != self.data_bytes():
            why = f"{math.prod(shape)} items of {dtype.itemsize} bytes are not the " \
                  f"{self.data_bytes()} bytes of the chunks"
        if why:
            self.problems.append(f"no data.npy: metadata {why}")
            return None
        return dtype, tuple(shape), order == "F"

    def _header(self, number):
        try:
            return self._chunks[number].read_header(self.fd)
        except BlockError as exc:
            raise FormatError(str(exc)) from None

    def chunk_count(self):
        return len(self._chunks)

    def npy_header(self):
        return b""  # (``data`` is the bytes alone)

    def chunk_size(self, number):
        return self._chunks[number].nbytes_range[1]

    def chunk_data(self, number):
        return self.cache.get_or_load(number, None,  # (the file is open, never replaced)
                                      lambda: self._chunks[number].decompress(self.fd))

    def data_bytes(self):
        return self._starts[-1]

    def read_data(self, start, end):
        """The chunks that hold ``start`` .. ``end``, found by bisection, not a walk."""
        parts = []
        number = bisect.bisect_right(self._starts, start) - 1
        while start < end and number < len(self._chunks):
            first = self._starts[number]
            parts.append(self.chunk_data(number)[start - first:end - first])
            start, number = self._starts[number + 1], number + 1
        return b"".join(parts)

    def header_json(self):
        chunks = []
        for chunk in self._chunks:
            try:
                chunks.append({"offset": chunk.offset, **chunk.read_header(self.fd)})
            except BlockError as exc:
                chunks.append({"offset": chunk.offset, "problem": str(exc)})
        return {"header": self.header, "metadata": self.metadata, "file_size": self.file_size,
                "chunks": chunks}

    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        header = info["header"]
        lines = [f"{info['container']}: {info['format']}",
                 "  header           " + ", ".join(
                     f"{k} {v}" for k, v in header.items() if k != "chunk_offsets"),
                 f"  file size        {info['file_size']}"]
        lines += [f"    chunk {i}  " + (c.get("problem") or
                                        f"{c['nbytes']} bytes from {c['cbytes']} at "
                                        f"{c['offset']}, {c['compressor']}, shuffle "
                                        f"{c['shuffle']}")
                  for i, c in enumerate(info["chunks"])]
        lines += [f"  problem: {p}" for p in info["problems"]]
        if "attrs" in info:
            return lines + [attrs_line(info)]
        return lines + ["  metadata         " + json.dumps(info["metadata"])]

    def describe(self):
        return {"container": self.label, "format": "bloscpack", **self.header_json(),
                "problems": list(self.problems)}

    def check(self, bar=None):
        problems = [f"{self.label}: {p}" for p in self.problems]
        for chunk in self._chunks:
            try:
                data = chunk.decompress(self.fd)
            except BlockError as exc:
                problems.append(str(exc))
                continue
            if bar is not None:
                bar.update(len(data))
        return problems, [f"{self.label}: {len(self._chunks)} chunks"]

    def close(self):
        super().close()
        os.close(self.fd)


class _NdarrayView:
    """``data.npy``: the bytes of ``data`` behind a .npy header of the array's metadata."""

    version = 0

    def __init__(self, source, dtype, shape, fortran):
        self.source, self.label = source, f"{source.label}/data.npy"
        self._header = npy_header(np.lib.format.dtype_to_descr(dtype), shape, fortran)

    def npy_header(self):
        return self._header

    def data_bytes(self):
        return self.source.data_bytes()

    def read_data(self, start, end):
        return self.source.read_data(start, end)
