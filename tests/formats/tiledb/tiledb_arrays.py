"""TileDB arrays written by the real library (tiledb-py) for the TileDB tests, and the
reference reads (tiledb opened at one fragment's timestamps) they are checked against."""

import numpy as np
import tiledb

RNG_SEED = 12


def _filters(*filters, chunk=None):
    return tiledb.FilterList(list(filters), chunksize=chunk)


# attribute name -> (dtype, filter list); every filter tiledb-py offers, alone and stacked
FILTERED_ATTRIBUTES = {
    "plain": (np.int64, _filters()),
    "gzip": (np.float64, _filters(tiledb.GzipFilter(level=6))),
    "zstd": (np.float64, _filters(tiledb.ZstdFilter(level=3))),
    "lz4": (np.int32, _filters(tiledb.LZ4Filter())),
    "bzip2": (np.int16, _filters(tiledb.Bzip2Filter())),
    "rle": (np.int32, _filters(tiledb.RleFilter())),
    "double_delta": (np.int64, _filters(tiledb.DoubleDeltaFilter())),
    "double_delta_u8": (np.uint8, _filters(tiledb.DoubleDeltaFilter())),
    "delta": (np.int32, _filters(tiledb.DeltaFilter())),
    "bit_width": (np.int64, _filters(tiledb.BitWidthReductionFilter(window=64))),
    "positive_delta": (np.uint32, _filters(tiledb.PositiveDeltaFilter(window=100))),
    "bitshuffle": (np.float32, _filters(tiledb.BitShuffleFilter())),
    "byteshuffle": (np.float64, _filters(tiledb.ByteShuffleFilter())),
    "scale_float": (np.float64, _filters(tiledb.FloatScaleFilter(0.5, 3.0, 4))),
    "xor": (np.float64, _filters(tiledb.XORFilter())),
    "md5": (np.int32, _filters(tiledb.ChecksumMD5Filter())),
    "sha256": (np.float64, _filters(tiledb.ChecksumSHA256Filter())),
    "stacked": (np.int64, _filters(tiledb.DoubleDeltaFilter(), tiledb.BitShuffleFilter(),
                                   tiledb.ZstdFilter(), tiledb.ChecksumSHA256Filter(),
                                   chunk=256)),
    "scale_stack": (np.float32, _filters(tiledb.FloatScaleFilter(0.25, -1.0, 2),
                                         tiledb.BitWidthReductionFilter(),
                                         tiledb.ByteShuffleFilter(), tiledb.LZ4Filter(),
                                         tiledb.ChecksumMD5Filter())),
    "bitw_gzip": (np.uint64, _filters(tiledb.BitWidthReductionFilter(), tiledb.XORFilter(),
                                      tiledb.GzipFilter(), chunk=300)),
    "pair": (np.complex64, _filters(tiledb.ZstdFilter())),
}


def attribute_values(name, dtype, n, rng):
    """Values that give each filter something to do (runs, slow trends, noise)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":  # stored as two float32 values a cell
        return (rng.random(n) + 1j * rng.random(n)).astype(dtype)
    if dtype.kind == "f":
        base = np.cumsum(rng.normal(size=n)) if "scale" not in name else rng.random(n) * 100
        return base.astype(dtype)
    if name == "rle":
        return np.repeat(rng.integers(0, 5, n // 7 + 1), 7)[:n].astype(dtype)
    info = np.iinfo(dtype)
    trend = np.cumsum(rng.integers(0, 40, n))
    return (trend % min(info.max, 1 << 40)).astype(dtype)


def write_filtered_sparse(uri, n=3000, capacity=500):
    """A sparse array with one attribute per filter, two fragments; returns the data written."""
    rng = np.random.default_rng(RNG_SEED)
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 1 << 20), tile=1024, dtype=np.int64,
                                   filters=_filters(tiledb.DoubleDeltaFilter(),
                                                    tiledb.ZstdFilter())))
    attrs = [tiledb.Attr(name, dtype=dt, filters=fl) for name, (dt, fl) in
             FILTERED_ATTRIBUTES.items()]
    attrs += [tiledb.Attr("text", dtype=str, var=True, filters=_filters(tiledb.ZstdFilter())),
              tiledb.Attr("maybe", dtype=np.int32, nullable=True,
                          filters=_filters(tiledb.Bzip2Filter()))]
    schema = tiledb.ArraySchema(domain=dom, sparse=True, attrs=attrs, capacity=capacity)
    tiledb.Array.create(uri, schema)
    for timestamp, start in ((10, 0), (20, n // 2)):
        x = np.sort(rng.choice(1 << 20, n, replace=False)).astype(np.int64)
        data = {name: attribute_values(name, dt, n, rng)
                for name, (dt, _) in FILTERED_ATTRIBUTES.items()}
        data["text"] = np.array([f"t{i}" * (i % 5) for i in range(start, start + n)],
                                dtype=object)
        data["maybe"] = np.arange(n, dtype=np.int32)
        with tiledb.open(uri, "w", timestamp=timestamp) as A:
            A[x] = data


def write_dense(uri, tile_order="row-major", cell_order="row-major"):
    """A dense 2-D array: tile-aligned and misaligned, overlapping fragments."""
    dom = tiledb.Domain(tiledb.Dim("r", domain=(1, 12), tile=4, dtype=np.int32),
                        tiledb.Dim("c", domain=(0, 8), tile=3, dtype=np.int32))
    schema = tiledb.ArraySchema(
        domain=dom, sparse=False, tile_order=tile_order, cell_order=cell_order,
        attrs=[tiledb.Attr("v", dtype=np.float64, filters=_filters(tiledb.ZstdFilter())),
               tiledb.Attr("k", dtype=np.int16, fill=-7,
                           filters=_filters(tiledb.DoubleDeltaFilter(), tiledb.LZ4Filter())),
               tiledb.Attr("s", dtype=str, var=True),
               tiledb.Attr("m", dtype=np.uint8, nullable=True)])
    tiledb.Array.create(uri, schema)
    writes = [(1, (slice(1, 9), slice(0, 6))),  # tile aligned: 2 x 2 tiles
              (2, (slice(3, 7), slice(2, 9))),  # misaligned, overlapping the first
              (3, (slice(9, 13), slice(6, 9)))]  # one tile, at the end
    for t, (rows, cols) in writes:
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        n = shape[0] * shape[1]
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[rows, cols] = {
                "v": (np.arange(n, dtype=np.float64) + 100 * t).reshape(shape),
                "k": (np.arange(n, dtype=np.int16) * t).reshape(shape),
                "s": np.array([f"{t}:{i}" for i in range(n)], dtype=object).reshape(shape),
                "m": np.ma.masked_array(np.arange(n, dtype=np.uint8).reshape(shape),
                                        mask=(np.arange(n) % 3 == 0).reshape(shape))}
    with tiledb.open(uri, "w", timestamp=4) as A:
        A.meta["title"] = "dense test"
        A.meta["numbers"] = (1, 2, 3)


def fragment_read(uri, fragment_name, domain):
    """What libtiledb reads of one fragment: opened at its timestamp range, over ``domain``."""
    t1, t2 = (int(p) for p in fragment_name.split("_")[2:4])
    with tiledb.open(uri, timestamp=(t1, t2)) as A:
        return A.multi_index[tuple(slice(lo, hi) for lo, hi in domain)]


def write_var_strings(uri):
    """Var-sized UTF-8 and ASCII strings under RLE and DICTIONARY (whose writer keeps the
    cell offsets in the data tile), alone and stacked, several tiles."""
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 999), tile=100, dtype=np.int64))
    pipelines = {"rle": [tiledb.RleFilter()],
                 "dict": [tiledb.DictionaryFilter(), tiledb.ZstdFilter()],
                 "rle_sum": [tiledb.RleFilter(), tiledb.ChecksumMD5Filter()]}
    attrs = [tiledb.Attr(f"{name}_{kind}", dtype=dtype, var=True, filters=_filters(*fl))
             for name, fl in pipelines.items() for kind, dtype in (("utf8", str),
                                                                   ("ascii", "ascii"))]
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True, attrs=attrs,
                                                capacity=64))
    n = 300
    words = np.array([["alpha", "beta", "", "gämma"][i // 5 % 4] for i in range(n)], dtype=object)
    ascii_words = np.array([w.encode("ascii", "replace") for w in words], dtype=object)
    with tiledb.open(uri, "w") as A:
        A[np.arange(n)] = {a.name: ascii_words if a.name.endswith("ascii") else words
                           for a in attrs}
