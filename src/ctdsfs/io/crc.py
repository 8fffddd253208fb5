"""CRC-32/BZIP2, the checksum of casacore's MultiFile (headers and blocks).

Computed by fastcrc (Rust, table-driven), far faster than crcmod
(docs/benchmarks.md); the tests check it against crcmod's ``crc-32-bzip2``. fastcrc is loaded by the first CRC asked
for: a mount of containers without CRCs never maps it.
"""


def crc32_bzip2(data, crc=None):  # noqa: F811 (rebound to fastcrc's function below)
    """CRC-32/BZIP2 of any bytes-like ``data``, continuing from ``crc`` if given
    (replaced by fastcrc's own function on the first call)."""
    global crc32_bzip2
    from fastcrc import crc32

    crc32_bzip2 = crc32.bzip2
    return crc32_bzip2(data, crc)
