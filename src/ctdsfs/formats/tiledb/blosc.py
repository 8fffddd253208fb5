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
import numpy as np

from ...errors import FormatError
from ...io.blosc_chunk import BLOSC_HEADER

# a TileDB compressor Blosc also decodes -> its number in a Blosc header's flags (bits 5-7)
BLOSC_CODECS = {2: 4, 3: 1}  # ZSTD, LZ4 (a raw LZ4 block, as TileDB writes it)
BLOSC_SHUFFLE_NO_SPLIT = 0x11  # byte shuffle (bit 0), one stream a block (bit 4)
BLOSC_VERSION = 2, 1  # Blosc's format version, and its codec format version
MAX_BLOSC_BYTES = (1 << 31) - 1  # Blosc's sizes are signed 32-bit
ROOM = BLOSC_HEADER.size + 4 * 16384  # kept before a tile's bytes: the header and starts of
# a tile of up to 16384 chunks (a tile of 8 MiB in 512-byte chunks) decoded in place


def head(codec, width, nbytes, blocksize, cbytes):
    """The 16-byte header of a byte-shuffled Blosc chunk of unsplit blocks."""
    return BLOSC_HEADER.pack(*BLOSC_VERSION, BLOSC_SHUFFLE_NO_SPLIT | BLOSC_CODECS[codec] << 5,
                           width, nbytes, blocksize, cbytes)


def decode(chunk, address, codec_name, what):
    """Have Blosc write the chunk's nbytes at ``address`` (memory the caller holds that
    long); a stream that does not decode to its block is a FormatError."""
    try:
        blosc.decompress_ptr(chunk, address)
    except blosc.blosc_extension.error as exc:
        raise FormatError(f"{what}: {codec_name} does not decompress: {exc}") from None


def decode_blocks(codec, codec_name, width, sizes, source, places, packed, address, what,
                  room=0):
    """The blocks of ``sizes`` bytes (each as long as the first but the last, which may be
    shorter), compressed in ``source`` (``places[k]`` bytes after its first ``room``,
    ``packed[k]`` bytes long), written one after another at ``address`` in one call
    (Blosc's own threads share the blocks). Where ``source`` is writable, its ``room``
    holds Blosc's header and starts and the 4 bytes before each stream are no other
    stream's, each stream's size is written there and Blosc reads ``source`` in place;
    else the streams are copied after a header. False, nothing done, where Blosc could
    not take them (a stream as long as its block, sizes past 32 bits)."""
    count = len(sizes)
    if not count or any(n != sizes[0] for n in sizes[:-1]) or not 0 < sizes[-1] <= sizes[0] \
            or any(n == p for n, p in zip(sizes, packed)):
        return False
    source, table = memoryview(source), BLOSC_HEADER.size + 4 * count
    in_place = not source.readonly and table <= room and places[0] >= 4 and all(
        places[k] - 4 >= places[k - 1] + packed[k - 1] for k in range(1, count))
    first = room - table  # (in place: where the chunk starts in ``source``)
    starts = [room + p - 4 - first for p in places] if in_place else \
        np.cumsum([table] + [4 + n for n in packed[:-1]]).tolist()
    cbytes = starts[-1] + 4 + packed[-1]
    if max(sum(sizes), cbytes) > MAX_BLOSC_BYTES:
        return False
    table_bytes = head(codec, width, sum(sizes), sizes[0], cbytes) + \
        struct.pack(f"<{count}i", *starts)
    if in_place:
        chunk = source[first:first + cbytes]
        chunk[:table] = table_bytes
        for start, n in zip(starts, packed):
            chunk[start:start + 4] = n.to_bytes(4, "little")
    else:
        pieces = [table_bytes]
        for place, n in zip(places, packed):
            pieces += (n.to_bytes(4, "little"), source[room + place:room + place + n])
        chunk = b"".join(pieces)
    decode(chunk, address, codec_name, what)
    return True
