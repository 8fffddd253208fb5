"""One Blosc chunk, as bcolz superchunks and bloscpack files hold it, read without trust.

A Blosc (1.x) chunk starts with a 16-byte header: version, versionlz, flags
(bit 0 byte shuffle, bit 1 stored uncompressed, bit 2 bit shuffle, bits 5-7
the compressor), typesize, then u32 nbytes (decompressed), blocksize and
cbytes (the chunk's whole length). A bloscpack file may follow each chunk
with a checksum of its bytes. Before python-blosc sees a chunk, its header
must promise a size its place allows and a length its file holds, and its
checksum must match.
"""

import hashlib
import os
import struct
import zlib

import blosc

from ..errors import BlockError

BLOSC_HEADER = struct.Struct("<BBBBIII")  # (also Blosc's most overhead: a stored copy)
# python-blosc holds the GIL while it decodes unless told not to (a process-wide switch:
# TileDB's tiles too, see tiledb_blosc): threads decode side by side only without it
blosc.set_releasegil(True)
CODECS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}  # Blosc flags >> 5


def _zlib_digest(func):
    return lambda data: struct.pack("<I", func(data) & 0xFFFFFFFF)


def _hashlib_digest(name):
    return lambda data: hashlib.new(name, data).digest()


# bloscpack's checksum kinds, by the index its header stores: (name, digest bytes, function)
CHECKSUMS = (("None", 0, None), ("adler32", 4, _zlib_digest(zlib.adler32)),
             ("crc32", 4, _zlib_digest(zlib.crc32))) + tuple(
    (name, hashlib.new(name).digest_size, _hashlib_digest(name))
    for name in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512"))


def blosc_header(raw):
    """The fields of a 16-byte Blosc header, flags decoded."""
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = BLOSC_HEADER.unpack(raw)
    return {"version": version, "versionlz": versionlz, "flags": flags,
            "compressor": CODECS.get(flags >> 5, f"unknown ({flags >> 5})"),
            "shuffle": "bit" if flags & 4 else "byte" if flags & 1 else "none",
            "memcpyed": bool(flags & 2), "typesize": typesize, "nbytes": nbytes,
            "blocksize": blocksize, "cbytes": cbytes}


class Chunk:
    """One Blosc chunk in a superchunk file: where it lies and what it must decompress to."""

    def __init__(self, path, number, offset, room, nbytes_range, checksum=0):
        self.path = path
        self.number = number
        self.offset = offset  # of its Blosc header
        self.room = room  # bytes it may take from ``offset`` (its checksum excluded)
        self.nbytes_range = nbytes_range  # (least, most) decompressed bytes its place needs
        self.checksum = checksum  # index in CHECKSUMS; the digest follows the chunk
        self.header = None  # its Blosc header, once read

    def fail(self, why):
        detail = f"{self.path}: chunk {self.number}: {why}"
        return BlockError(detail, detail)

    def read_header(self, fd):
        if self.header is None:
            self.header = self._checked_header(os.pread(fd, BLOSC_HEADER.size, self.offset))
        return self.header

    def _checked_header(self, raw):
        """The Blosc header at the start of ``raw``, if it fits the chunk's place."""
        if self.room < BLOSC_HEADER.size or len(raw) < BLOSC_HEADER.size:
            raise self.fail("truncated Blosc header")
        header = blosc_header(raw[:BLOSC_HEADER.size])
        least, most = self.nbytes_range
        if not least <= header["nbytes"] <= most:
            want = least if least == most else f"{least} to {most}"
            raise self.fail(f"Blosc header says {header['nbytes']} bytes, its place "
                            f"holds {want}")
        if not BLOSC_HEADER.size <= header["cbytes"] <= min(
                self.room, header["nbytes"] + BLOSC_HEADER.size):
            raise self.fail(f"Blosc header says {header['cbytes']} compressed bytes, "
                            f"{self.room} are there for {header['nbytes']} bytes")
        return header

    def _check_digest(self, raw, digest):
        """Checksum of the compressed bytes ``raw`` against ``digest``."""
        _, digest_size, digest_of = CHECKSUMS[self.checksum]
        if digest_size and digest_of(raw) != digest:
            raise self.fail(f"{CHECKSUMS[self.checksum][0]} checksum mismatch")

    def decode_into(self, raw, out):
        """Decode the chunk from ``raw`` (the file's bytes from its offset, as many as were
        read) into the writable uint8 array ``out``; its byte count. The header checked
        is the one Blosc reads (the file may have changed since ``read_header``)."""
        header = self._checked_header(raw)
        cbytes, nbytes = header["cbytes"], header["nbytes"]
        digest_size = CHECKSUMS[self.checksum][1]
        if len(raw) < cbytes + digest_size:
            raise self.fail("truncated")
        self._check_digest(raw[:cbytes], bytes(raw[cbytes:cbytes + digest_size]))
        if nbytes > len(out):
            raise self.fail(f"{nbytes} bytes do not fit the {len(out)} of its place")
        try:
            blosc.decompress_ptr(raw[:cbytes], out.ctypes.data)
        except Exception as exc:  # python-blosc raises RuntimeError, ValueError, ...
            raise self.fail(f"does not decompress ({exc})") from None
        return nbytes

    def decompress(self, fd):
        """The chunk's bytes: header checked first, then the checksum, then python-blosc."""
        header = self.read_header(fd)
        digest_size = CHECKSUMS[self.checksum][1]
        raw = os.pread(fd, header["cbytes"] + digest_size, self.offset)
        if len(raw) != header["cbytes"] + digest_size:
            raise self.fail("truncated")
        raw, digest = raw[:header["cbytes"]], raw[header["cbytes"]:]
        self._check_digest(raw, digest)
        try:
            data = blosc.decompress(raw)
        except Exception as exc:  # python-blosc raises RuntimeError, ValueError, ...
            raise self.fail(f"does not decompress ({exc})") from None
        if len(data) != header["nbytes"]:
            raise self.fail(f"decompressed to {len(data)} bytes, not {header['nbytes']}")
        return data


def file_identity(st):
    """What tells a file's content changed: inode (files are replaced), mtime, size, and
    the device (the same device and inode are the same file)."""
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_dev
