"""sparse/ of arrays with string dimensions, alone or beside others, against
``A.query(order='G')[:]`` of tiledb-py: libtiledb orders string coordinates by bytes
taken as signed chars; several fragments whose strings go beyond ASCII are merged by
libtiledb in an order of its own, which ctdsfs refuses to guess (in one line)."""

import io

import numpy as np
import pytest
import tiledb

from ctdsfs.errors import BlockError
from ctdsfs.formats.tiledb.array import open_file

ASCII_WORDS = ["a", "ab", "b", "ba", "bb", "c", "", "zz", "Z", "a\x00b", "~"]


def load(view, name):
    return np.load(io.BytesIO(bytes(view.read(name, 0, 1 << 30))))


def var_cells(view, name):
    offsets = load(view, f"{name}.offsets.npy")
    data = bytes(view.read(f"{name}.data", 0, 1 << 30))
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def make(uri, layout, tile_order, cell_order, writes):
    """An array with a string dimension for each ``s`` of ``layout`` and an int32 one
    for each ``x``; ``writes``: one list of words per fragment."""
    dims = [tiledb.Dim(f"{c}{k}", domain=(None, None), tile=None, dtype="ascii") if c == "s"
            else tiledb.Dim(f"{c}{k}", domain=(0, 99), tile=7, dtype=np.int32)
            for k, c in enumerate(layout)]
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(*dims), sparse=True, tile_order=tile_order,
        cell_order=cell_order, capacity=5, attrs=[tiledb.Attr("a", dtype=np.int64)]))
    rng = np.random.default_rng(5)
    for t, words in enumerate(writes, 1):
        n = 30
        coords = [np.array([w.encode() for w in rng.choice(words, n)], dtype=object)
                  if c == "s" else rng.integers(0, 20, n).astype(np.int32) for c in layout]
        seen, keep = set(), []
        for i in range(n):
            if tuple(c[i] for c in coords) not in seen:
                seen.add(tuple(c[i] for c in coords))
                keep.append(i)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[tuple(c[keep] for c in coords)] = np.arange(len(keep)) + 100 * t
    return [d.name for d in dims]


def assert_same(uri, names):
    array = open_file(uri)
    assert array.not_shown() == []
    view = array.nested("sparse")
    with tiledb.open(uri) as A:
        ref = A.query(order="G")[:]
    assert np.array_equal(load(view, "a.npy"), ref["a"])
    for name in names:
        got = var_cells(view, name) if name.startswith("s") else load(view, f"{name}.npy")
        assert list(got) == list(ref[name]), name


@pytest.mark.parametrize("layout, tile_order, cell_order", [
    ("sx", "row-major", "row-major"), ("xs", "col-major", "col-major"),
    ("sxs", "row-major", "col-major"), ("sx", "col-major", "row-major")])
def test_string_dimensions_beside_others(tmp_path, layout, tile_order, cell_order):
    uri = str(tmp_path / "s")
    names = make(uri, layout, tile_order, cell_order, [ASCII_WORDS] * 3)
    assert_same(uri, names)


@pytest.mark.parametrize("layout", ["s", "sx"])
def test_signed_char_order(tmp_path, layout):
    """Bytes from 0x80 on sort before 0x00 to 0x7f, as libtiledb's signed chars do."""
    uri = str(tmp_path / "s")
    names = make(uri, layout, "row-major", "row-major",
                 [["a", "\u00e9t\u00e9", "\x7f", "\x80", "b", "a\u00e9", "ab"]])
    assert_same(uri, names)


def test_beyond_ascii_in_several_fragments_is_refused(tmp_path):
    uri = str(tmp_path / "bounds")
    make(uri, "sx", "row-major", "row-major", [["a", "b", "\u00e9"], ["a", "c"]])
    assert any("beyond ASCII" in why for why in open_file(uri).not_shown())
    inner = str(tmp_path / "inner")  # (only an inner coordinate goes beyond ASCII)
    make(inner, "sx", "row-major", "row-major", [["a", "a\u00e9", "z"], ["a", "z"]])
    array = open_file(inner)
    assert array.not_shown() == []
    with pytest.raises(BlockError, match="beyond ASCII"):
        array.nested("sparse").read("a.npy", 0, 100)
