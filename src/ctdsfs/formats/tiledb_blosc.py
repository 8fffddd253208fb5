"""TileDB's BYTESHUFFLE then ZSTD (or LZ4) undone by python-blosc, its compressed parts
handed to Blosc as the blocks of a Blosc (1.x) chunk.

Blosc's byte shuffle is TileDB's (byte planes of the values, bytes past whole values
left in place), and its ZSTD and LZ4 blocks are what TileDB writes (a zstd frame, a raw
LZ4 block). A Blosc chunk is a 16-byte header (version, codec version, flags, typesize,
u32 nbytes, blocksize, cbytes), then one i32 start per block (``bstarts``), each block
an i32 compressed size followed by its compressed stream, one stream a block where the
flags say not to split (bit 4). Every block is ``blocksize`` bytes but the last, which
holds what is left. Blosc decodes each stream into a scratch block and unshuffles it
into the output (SIMD), checks every start and size against cbytes and every block's
output against its size, and writes exactly nbytes or fails; it takes a stream as long
as its block for a stored copy, so such a stream is never handed to it.
"""

import struct

import blosc

from ..errors import FormatError

# a TileDB compressor Blosc also decodes -> its number in a Blosc header's flags (bits 5-7)
BLOSC_CODECS = {2: 4, 3: 1}  # ZSTD, LZ4 (a raw LZ4 block, as TileDB writes it)
BLOSC_HEAD = struct.Struct("<BBBBIII")
BLOSC_SHUFFLE_NO_SPLIT = 0x11  # byte shuffle (bit 0), one stream a block (bit 4)
BLOSC_VERSION = 2, 1  # Blosc's format version, and its codec format version
MAX_BLOSC_BYTES = (1 << 31) - 1  # Blosc's sizes are signed 32-bit
# python-blosc holds the GIL while it decodes unless told not to (a process-wide switch,
# so bcolz chunks too): threads decode side by side only without it
blosc.set_releasegil(True)


def head(codec, width, nbytes, blocksize, cbytes):
    """The 16-byte header of a byte-shuffled Blosc chunk of unsplit blocks."""
    return BLOSC_HEAD.pack(*BLOSC_VERSION, BLOSC_SHUFFLE_NO_SPLIT | BLOSC_CODECS[codec] << 5,
                           width, nbytes, blocksize, cbytes)


def decode(chunk, address, codec_name, what):
    """Have Blosc write the chunk's nbytes at ``address`` (memory the caller holds that
    long); a stream that does not decode to its block is a FormatError."""
    try:
        blosc.decompress_ptr(chunk, address)
    except blosc.blosc_extension.error as exc:
        raise FormatError(f"{what}: {codec_name} does not decompress: {exc}") from None


def decode_streams(codec, codec_name, width, blocksize, sizes, streams, address, what):
    """The blocks of ``sizes`` bytes (each ``blocksize`` but the last, which may be less),
    from ``streams``: for each, its compressed size as 4 little-endian bytes and the
    compressed bytes, written one after another at ``address``, in one call (Blosc's
    own threads share the blocks). False, nothing done, where Blosc could not take
    them (a stream as long as its block, sizes past 32 bits)."""
    count = len(sizes)
    nbytes = sum(sizes)
    if not count or any(n != blocksize for n in sizes[:-1]) or not 0 < sizes[-1] <= blocksize:
        return False
    starts, place = [], BLOSC_HEAD.size + 4 * count
    for n, (prefix, stream) in zip(sizes, streams):
        if len(stream) == n:
            return False
        starts.append(place)
        place += len(prefix) + len(stream)
    if max(nbytes, place) > MAX_BLOSC_BYTES:
        return False
    pieces = [head(codec, width, nbytes, blocksize, place),
              struct.pack(f"<{count}i", *starts)]
    for prefix, stream in streams:
        pieces += (prefix, stream)
    decode(b"".join(pieces), address, codec_name, what)
    return True
