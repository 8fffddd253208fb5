"""Pure codecs: AipsIO, CRC-32/BZIP2, packed block indexes, MultiFile header round trips."""

import os
import random

import crcmod.predefined
import numpy as np
import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats.casacore.aipsio import AipsReader, AipsWriter
from ctdsfs.formats.multifile.header import (
    assemble_v2,
    encode_header_v1,
    encode_header_v2,
    pack_index,
    read_header,
    unpack_index,
    unpack_indexes,
)
from ctdsfs.io.crc import crc32_bzip2
from ctdsfs.io.store import FileStore

from ...conftest import DATA, run_tomf

V2_FIXTURES = ["mf2_basic.mf", "mf2_crc.mf", "mf2_free.mf", "mf2_nested.mf", "mf2_bighdr.mf",
               "t_mf.tab/table.mf"]


def test_crc_matches_crcmod_reference():
    reference = crcmod.predefined.mkCrcFun("crc-32-bzip2")
    assert crc32_bzip2(b"123456789") == 0xFC891918
    rng = random.Random(1)
    for size in (0, 1, 7, 512, 4096, 65536, 100_003):
        data = rng.randbytes(size)
        assert crc32_bzip2(data) == reference(data)


def test_crc_matches_values_casacore_stored():
    stored = [0x18C542A9, 0x1CF513F5, 0x881CCA79, 0x3972AC5A, 0xA4F21A87, 0x559E5E0C]
    data = (DATA / "mf2_crc.mf").read_bytes()
    assert [crc32_bzip2(data[b * 4096:(b + 1) * 4096]) for b in range(1, 7)] == stored


def test_aipsio_round_trip_nested_objects():
    w = AipsWriter()
    w.start("Outer", 3, outer=True)
    w.string("héllo")
    w.i64(-5)
    w.u64(2 ** 63)
    w.bool(True)
    w.f64(1.5)
    w.block_i64([1, -2, 3])
    w.start("Inner", 1)
    w.i32(-7)
    w.end()
    w.end()
    data = w.getvalue()
    assert data[:4] == b"\xbe\xbe\xbe\xbe"
    assert int.from_bytes(data[4:8], "big") == len(data) - 4  # length excludes the magic
    r = AipsReader(data)
    assert r.start("Outer", outer=True) == 3
    assert (r.string(), r.i64(), r.u64(), r.bool(), r.f64()) == ("héllo", -5, 2 ** 63, True, 1.5)
    assert r.block_i64().tolist() == [1, -2, 3]
    assert r.start("Inner") == 1 and r.i32() == -7
    r.end()
    r.end()
    assert r.pos == len(data)


@pytest.mark.parametrize("mutate", ["length_too_big", "truncated", "wrong_type", "bad_magic"])
def test_aipsio_rejects_damaged_objects(mutate):
    w = AipsWriter()
    w.start("Obj", 1, outer=True)
    w.string("x" * 10)
    w.end()
    data = bytearray(w.getvalue())
    expected_type = "Obj"
    if mutate == "length_too_big":
        data[4:8] = (2 ** 31).to_bytes(4, "big")
    elif mutate == "truncated":
        data = data[:-3]
    elif mutate == "bad_magic":
        data[0] = 0
    else:
        expected_type = "Other"
    with pytest.raises(FormatError):
        r = AipsReader(bytes(data))
        r.start(expected_type, outer=True)
        r.string()
        r.end()


def test_aipsio_string_count_cannot_overrun():
    w = AipsWriter()
    w.u32(0xFFFFFFF0)  # a string claiming 4 GiB
    with pytest.raises(FormatError):
        AipsReader(w.getvalue()).string()


def test_pack_index_matches_casacore_examples():
    assert pack_index([5, 6, 7, 8, 20, 21]).tolist() == [5, -3, 20, -1]
    assert pack_index([1, 2, 3]).tolist() == [1, -2]
    assert pack_index([5, 4, 3]).tolist() == [5, 4, 3]  # the free list is descending
    assert pack_index([]).tolist() == []


def test_unpack_is_inverse_of_pack():
    rng = np.random.default_rng(3)
    for _ in range(200):
        blocks = rng.permutation(500)[:rng.integers(0, 60)]
        blocks = np.concatenate([blocks, np.arange(600, 600 + rng.integers(0, 30))])
        assert list(unpack_index(pack_index(blocks), 10_000)) == blocks.tolist()


def test_unpack_bounds_hostile_indexes():
    with pytest.raises(FormatError):
        unpack_index([-3, 4], 100)  # starts with a run count
    with pytest.raises(FormatError):
        unpack_index([1, -(2 ** 62)], 100)  # would expand to 2**62 blocks
    with pytest.raises(FormatError):
        unpack_index([1, np.iinfo(np.int64).min], 100)
    # The budget is shared: together the indexes may not claim more blocks than exist.
    results = unpack_indexes([[1, -5], [10, -5], [20, -5]], 15)
    assert [r[1] is None for r in results] == [True, True, False]


def test_header_decode_fast_paths_agree_with_unpack_indexes():
    """A v2 header's one-block and one-run indexes are decoded without an array each;
    on random, often hostile, indexes (deleted slots included) the entries carry the
    same blocks and problems as the general unpacking, sharing one block budget."""
    from array import array

    from ctdsfs.formats.multifile.header import _v2_indexed_entries
    rng = random.Random(11)
    for _ in range(300):
        max_blocks = rng.randrange(1, 60)
        packed = [[rng.choice([rng.randrange(-3, 50), -rng.randrange(0, 70), 2 ** 63 - 1])
                   for _ in range(rng.choice([0, 1, 2, 2, 3]))] for _ in range(rng.randrange(1, 9))]
        raw = [("" if rng.random() < 0.1 else f"f{i}", 0, False) for i in range(len(packed))]
        words, starts = array("q"), []
        for p in packed:
            words.append(len(p))
            starts.append(len(words))
            words.extend(p)
        entries = _v2_indexed_entries(raw, words, starts, max_blocks)
        live = [p if name else [] for (name, _, _), p in zip(raw, packed)]
        for e, (blocks, problem) in zip(entries, unpack_indexes(live, max_blocks)):
            assert (list(e.blocks), e.problem) == (list(blocks or []), problem), \
                (packed, max_blocks)


def _logical_v2(path):
    store = FileStore(path)
    try:
        h = read_header(store)
        return h, assemble_v2(store, store.size(), h.block_size, h.header_size, h.cont_first)
    finally:
        store.close()


@pytest.mark.parametrize("name", V2_FIXTURES)
def test_v2_header_encode_reproduces_casacore_bytes(name):
    header, logical = _logical_v2(DATA / name)
    assert encode_header_v2(header) == logical


def test_v2_header_crc_is_recomputed_exactly():
    header, logical = _logical_v2(DATA / "mf2_crc.mf")
    assert header.header_crc == 0x9559D70E
    assert encode_header_v2(header)[28:32] == logical[28:32]


def test_v2_continuation_sets_decoded():
    header, _ = _logical_v2(DATA / "mf2_bighdr.mf")
    assert header.cont_first == 126
    assert [s.tolist() for s in header.cont_sets] == [list(range(126, 131)),
                                                      list(range(121, 126))]
    assert header.cont_used == (5, 5)
    assert header.active_cont_set == 0
    assert header.header_size == 2930


def _logical_v1(path):
    store = FileStore(path)
    try:
        header = read_header(store, str(path) + "_hdrext")
        block0 = store.pread(0, min(header.header_size, header.block_size))
    finally:
        store.close()
    ext = path.with_name(path.name + "_hdrext")
    return header, block0 + (ext.read_bytes() if ext.exists() else b"")


def test_v1_header_encode_reproduces_casacore_unit_test_file():
    header, logical = _logical_v1(DATA / "casacore_test_v1.mf")
    assert header.has_hdrext and header.counter == 5
    assert encode_header_v1(header) == logical[:header.header_size]


@pytest.mark.tools
def test_v1_header_encode_reproduces_tomf_output(tmp_path):
    inputs = []
    for i in range(40):
        p = tmp_path / f"input_file_with_a_long_name_{i:02d}.bin"
        p.write_bytes(os.urandom(i * 37))
        inputs.append(p)
    out = run_tomf(inputs, tmp_path / "v1.mf", 512)
    header, logical = _logical_v1(out)
    assert header.version == 1 and header.has_hdrext
    assert encode_header_v1(header) == logical[:header.header_size]
