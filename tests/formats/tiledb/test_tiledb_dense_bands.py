"""dense/ served from the fragments' decoded tiles (no merge) where bands of tiles are the
domain's cells in order: the same bytes as the merged view and as tiledb-py's ``A[:]``,
for one fragment, several, partial bands (merged then), fill values, nullable and
var-sized attributes, 2-D row- and column-major arrays, and arrays too large to merge;
and tiles decoded ahead of sequential readers only."""

import io

import numpy as np
import tiledb

from ctdsfs.formats import open_container
from ctdsfs.formats.tiledb import dense as tiledb_dense


def load(container, name):
    return np.load(io.BytesIO(container.read(name, 0, container.entry_size(name))))


def make(uri, dims, cell_order="row-major", tile_order="row-major"):
    """A dense array: a nullable float64 attribute with a fill value (BYTESHUFFLE+ZSTD),
    an int32 one and a var-sized string one."""
    shuffle = tiledb.FilterList([tiledb.ByteShuffleFilter(), tiledb.ZstdFilter(level=1)])
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(*[tiledb.Dim(n, domain=d, tile=t, dtype=np.int64)
                               for n, d, t in dims]),
        cell_order=cell_order, tile_order=tile_order, attrs=[
            tiledb.Attr("a", dtype=np.float64, nullable=True, fill=-7.5, filters=shuffle),
            tiledb.Attr("k", dtype=np.int32, fill=-3),
            tiledb.Attr("s", dtype=str, var=True)]))


def write(uri, t, region):
    """Write ``region`` (slices) at timestamp ``t`` with values that name the write."""
    with tiledb.open(uri) as A:
        shape = tuple(s.stop - s.start for s in region)
    n = int(np.prod(shape))
    values = np.arange(n, dtype=np.float64).reshape(shape) + 1000 * t
    with tiledb.open(uri, "w", timestamp=t) as A:
        A[tuple(region)] = {
            "a": np.ma.masked_array(values, values.astype(np.int64) % 5 == 0),
            "k": values.astype(np.int32),
            "s": np.array([f"s{t}.{i}" for i in range(n)], dtype=object).reshape(shape)}


def check(uri, direct):
    """Every file of dense/ equals A[:] and the merged view's bytes; ``direct``: whether
    a and k come from the tiles."""
    array = open_container(uri)
    dense = array.nested("dense")
    assert (array._dense_bands(0) is not None) == direct
    assert (array._dense_bands(1) is not None) == direct
    with tiledb.open(uri) as A:
        ref = A[:]
    a, valid = load(dense, "a.npy"), load(dense, "a.validity.npy").astype(bool)
    assert np.array_equal(valid, ~np.ma.getmaskarray(ref["a"]))
    assert np.array_equal(a[valid], np.ma.getdata(ref["a"])[valid])
    assert np.array_equal(load(dense, "k.npy"), ref["k"])
    offsets = load(dense, "s.offsets.npy")
    data = dense.read("s.data", 0, dense.entry_size("s.data"))
    cells = [bytes(data[offsets[i]:offsets[i + 1]]).rstrip(b"\0").decode()
             for i in range(len(offsets) - 1)]
    assert cells == [c.rstrip("\0") for c in ref["s"].ravel().tolist()]
    for index, name in ((0, "a.npy"), (0, "a.validity.npy"), (1, "k.npy")):
        merged = array._merged(index)["validity" if "validity" in name else "values"]
        raw = bytes(dense.read(name, 0, dense.entry_size(name)))
        assert raw.endswith(merged) and len(raw) - len(merged) in (128, 64), name
    return a


def test_one_fragment_over_the_domain(tmp_path):
    uri = str(tmp_path / "one")
    make(uri, [("i", (0, 1049), 100)])  # the last band is part of a tile
    write(uri, 1, [slice(0, 1050)])
    assert len(check(uri, True)) == 1050


def test_later_fragments_over_whole_bands_and_fill_where_nothing_was_written(tmp_path):
    uri = str(tmp_path / "bands")
    make(uri, [("i", (10, 1009), 100)])
    write(uri, 1, [slice(10, 310)])
    write(uri, 2, [slice(510, 1010)])
    write(uri, 3, [slice(110, 210)])  # over the first fragment's second band
    a = check(uri, True)
    assert (a[300:500] == -7.5).all()  # the fill value where no fragment reaches
    k = load(open_container(uri).nested("dense"), "k.npy")
    assert k[100:200].tolist() == list(range(3000, 3100))  # band 1: the newest fragment
    assert k[0:100].tolist() == list(range(1000, 1100)) and (k[300:500] == -3).all()


def test_a_fragment_over_part_of_a_band_is_merged(tmp_path):
    uri = str(tmp_path / "partial")
    make(uri, [("i", (0, 999), 100)])
    write(uri, 1, [slice(0, 1000)])
    write(uri, 2, [slice(150, 420)])
    check(uri, False)


def test_two_dimensions_one_tile_across(tmp_path):
    uri = str(tmp_path / "rows")
    make(uri, [("r", (0, 25), 4), ("c", (0, 6), 7)])
    write(uri, 1, [slice(0, 26), slice(0, 7)])
    write(uri, 2, [slice(8, 16), slice(0, 7)])
    check(uri, True)
    cols = str(tmp_path / "cols")
    make(cols, [("r", (0, 5), 6), ("c", (0, 30), 8)], "col-major", "col-major")
    write(cols, 1, [slice(0, 6), slice(0, 31)])
    check(cols, True)
    tiled = str(tmp_path / "tiled")  # tiles across both dimensions: merged
    make(tiled, [("r", (0, 9), 5), ("c", (0, 9), 5)])
    write(tiled, 1, [slice(0, 10), slice(0, 10)])
    check(tiled, False)


def test_an_array_too_large_to_merge_is_shown_from_its_tiles(tmp_path, monkeypatch):
    uri = str(tmp_path / "large")
    make(uri, [("i", (0, 1999), 500)])
    write(uri, 1, [slice(0, 2000)])
    partial = str(tmp_path / "large_partial")
    make(partial, [("i", (0, 1999), 500)])
    write(partial, 1, [slice(0, 2000)])
    write(partial, 2, [slice(100, 200)])
    monkeypatch.setattr(tiledb_dense, "MAX_DENSE_BYTES", 4000)
    dense = open_container(uri).nested("dense")
    assert sorted(dense.names()) == ["a.npy", "a.validity.npy", "k.npy"]
    with tiledb.open(uri) as A:
        assert np.array_equal(load(dense, "k.npy"), A[:]["k"])
    array = open_container(partial)
    assert array.nested("dense").names() == []
    assert any("more than ctdsfs merges in memory" in p for p in array.problems)


def test_tiles_decoded_ahead_only_for_a_reader_going_in_order(tmp_path):
    """A read of tile 5 with tile 4 never read is a random read: nothing is decoded
    ahead for it (a random slice used to cost four tiles' decoding); a reader of
    tile 0 has the next tiles decoded ahead."""
    from ctdsfs.formats.tiledb.fragment import TILES

    uri = str(tmp_path / "ahead")
    make(uri, [("i", (0, 999), 100)])
    write(uri, 1, [slice(0, 1000)])
    folder = open_container(uri).nested("fragments")
    frag = folder.nested(folder.names()[0])
    frag.names()
    frag.cell_counts()

    def pending(i):
        key = (frag.path, 0, "data", i)
        return key in TILES._loading or TILES.get(key, frag.identity) is not None

    frag._tile(0, "data", 5)
    assert not any(pending(i) for i in range(6, 10))
    frag._tile(0, "data", 0)
    assert all(pending(i) for i in (1, 2, 3))


def test_mounted_dense_view_from_tiles(tmp_path, mount):
    """Through a mount: np.load and mapped slices of dense/ served from several fragments'
    tiles and fill bands equal A[:]."""
    uri = str(tmp_path / "mounted")
    make(uri, [("i", (0, 99999), 8192)])
    write(uri, 1, [slice(0, 40960)])
    write(uri, 2, [slice(8192, 16384)])
    write(uri, 3, [slice(57344, 100000)])
    assert open_container(uri)._dense_bands(1) is not None
    m = mount(uri)
    with tiledb.open(uri) as A:
        ref = A[:]
    assert np.array_equal(np.load(m.mountpoint / "dense" / "k.npy"), ref["k"])
    mapped = np.load(m.mountpoint / "dense" / "k.npy", mmap_mode="r")
    for start in (99000, 45000, 8000, 0):
        assert np.array_equal(mapped[start:start + 1000], ref["k"][start:start + 1000])
    assert (ref["k"][40960:57344] == -3).all()  # (a fill band in between)


def test_reads_of_decoded_tiles_are_answered_at_once(tmp_path):
    """A read whose tiles are decoded says so (the mount then answers it without a
    thread's hop), in a fragment's file and in dense/; one that needs a tile not
    decoded, or before the file's layout is worked out, does not."""
    for folder in ("dense", "fragments"):  # (an array each: they would share its tiles)
        uri = str(tmp_path / folder)
        make(uri, [("i", (0, 999), 100)])
        write(uri, 1, [slice(0, 1000)])
        view = open_container(uri).nested(folder)
        if "a.npy" not in view.names():
            view = view.nested(view.names()[0])
            view.names()
        assert not view.cached("a.npy", 0, 64)  # (no layout yet)
        size = view.entry_size("a.npy")
        header = size - 8000
        assert view.cached("a.npy", 0, header)  # (the header alone)
        assert not view.cached("a.npy", header, 800)
        view.read("a.npy", header, 800)  # tile 0
        assert view.cached("a.npy", header + 8, 500)
        assert not view.cached("a.npy", size - 800, 800)  # (tile 9: not decoded)
        assert not view.cached("a.npy", header + 700, 8000)  # (every tile)
        assert not view.cached("s.data", 0, 1) and not view.cached("no such file", 0, 1)
