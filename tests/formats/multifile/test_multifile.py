"""The MultiFile container: casacore-written files read byte-exact, hostile ones refused cleanly."""

import gc
import os
import random
import resource
import shutil
import struct
from array import array

import numpy as np
import pytest

from ctdsfs.errors import BlockError, FormatError, NotAContainer
from ctdsfs.formats import open_container
from ctdsfs.formats.multifile.container import MAX_NESTING
from ctdsfs.formats.multifile.header import Entry, Header, encode_header_v2
from ctdsfs.io.crc import crc32_bzip2

from ...conftest import DATA, make_casacore_table, pattern, run_tomf


def test_a_one_run_entry_keeps_no_range():
    """A file's blocks in one run are held as first block and length (a kept ``range``
    and its end cost about 80 bytes a file) and given back as a ``range``; other lists
    are kept as given."""
    e = Entry("f", 5000, range(70000, 70010))
    assert e.blocks == range(70000, 70010) and len(e.blocks) == 10
    assert not any(isinstance(held, range) for held in gc.get_referents(e))
    e.blocks = array("q", [3, 9])
    assert e.blocks is e.blocks and list(e.blocks) == [3, 9]
    assert Entry("g", 0, range(0)).blocks == range(0)


def read_all(container, name):
    return container.read(name, 0, container.entry_size(name) + 100)


def test_basic_fixture():
    c = open_container(DATA / "mf2_basic.mf")
    assert c.names() == ["empty.bin", "data10000.bin", "hello.txt"]
    assert read_all(c, "empty.bin") == b""
    assert read_all(c, "data10000.bin") == pattern(10000, 7, 3)
    assert read_all(c, "hello.txt") == b"hello"
    assert [c.entry_blocks(n) for n in c.names()] == [0, 3, 1]
    for name in c.names():
        assert read_all(c, name) == (DATA / "inputs" / name).read_bytes()


def test_crc_fixture_reads_and_verifies():
    c = open_container(DATA / "mf2_crc.mf")
    assert c.header.use_crc and len(c.header.crcs) == 7
    assert read_all(c, "f1") == pattern(20000, 13, 5, 251)
    assert read_all(c, "f2") == b"\xab" * 4096


def test_free_list_fixture_hides_deleted_slot_and_truncated_tail():
    c = open_container(DATA / "mf2_free.mf")
    assert c.names() == ["a", "c"]  # slot 1 is a deleted (empty-name) slot
    assert c.header.free_blocks.tolist() == [5, 4, 3]
    assert c.usage().free_blocks == 3
    # Block 2 still holds pre-truncation bytes after offset 5000: never exposed.
    assert read_all(c, "a") == pattern(12288, 3, 1)[:5000]
    assert read_all(c, "c") == pattern(4096, 11, 7)
    assert c.problems == []


def test_nested_fixture_detected_by_content():
    c = open_container(DATA / "mf2_nested.mf")
    assert c.header.entries[1].nested_flag is False  # casacore never sets the flag
    assert c.nested("table.dat") is None
    sub = c.nested("SUB")
    assert sub is not None and sub.names() == ["x", "y"]
    assert read_all(c, "table.dat") == pattern(300, 3, 11)
    assert read_all(sub, "x") == pattern(5000, 17, 1)
    assert read_all(sub, "y") == b"0123456789"


def test_multi_block_header_fixture():
    c = open_container(DATA / "mf2_bighdr.mf")
    assert len(c.names()) == 60
    for k in range(60):
        size = 800 if k in (0, 15, 30, 45, 59) else 700
        assert read_all(c, f"file_{k:03d}") == bytes((k * 17 + j * 3) % 256 for j in range(size))


def test_v1_with_hdrext_casacore_unit_test_input():
    c = open_container(DATA / "casacore_test_v1.mf")
    assert c.header.version == 1 and c.header.has_hdrext
    assert c.names() == ["file0", "file2"]  # file1 was deleted
    file0 = np.frombuffer(read_all(c, "file0"), "<i8")
    file2 = np.frombuffer(read_all(c, "file2"), "<i8")
    assert file0.tolist() == list(range(128)) + list(range(256, 512))
    assert file2.tolist() == list(range(128, 256)) + list(range(640, 768)) + [0, 1]
    assert c.usage().free_blocks == 15


def test_v1_without_hdrext_file_is_a_clear_error(tmp_path):
    shutil.copy(DATA / "casacore_test_v1.mf", tmp_path / "x.mf")
    with pytest.raises(FormatError, match="_hdrext"):
        open_container(tmp_path / "x.mf")


def test_random_reads_across_block_boundaries():
    c = open_container(DATA / "mf2_bighdr.mf")
    rng = random.Random(7)
    expected = {n: read_all(c, n) for n in c.names()}
    for _ in range(2000):
        name = rng.choice(c.names())
        off = rng.randrange(0, 900)
        size = rng.randrange(0, 1200)
        assert c.read(name, off, size) == expected[name][off:off + size]


@pytest.mark.tools
@pytest.mark.parametrize("block_size", [512, 4096, 65536])
def test_python_casacore_tables_match_their_separate_file_twin(tmp_path, block_size):
    packed = make_casacore_table(tmp_path / "mf.tab", block_size=block_size)
    twin = make_casacore_table(tmp_path / "sep.tab", multifile=False)
    c = open_container(packed / "table.mf")
    assert c.header.version == 2 and c.block_size == block_size
    assert any("_TSM" in n for n in c.names())
    assert sorted(c.names()) == sorted(p.name for p in twin.iterdir()
                                       if p.name.startswith("table.f"))
    for name in c.names():
        assert read_all(c, name) == (twin / name).read_bytes(), name


@pytest.mark.tools
def test_tomf_v1_with_hdrext(tmp_path):
    rng = random.Random(5)
    inputs = []
    for i in range(50):
        p = tmp_path / f"storage_manager_file_number_{i:03d}"
        p.write_bytes(rng.randbytes(rng.randrange(0, 3000)))
        inputs.append(p)
    out = run_tomf(inputs, tmp_path / "legacy.mf", 512)
    assert (tmp_path / "legacy.mf_hdrext").exists()
    c = open_container(out)
    assert c.header.version == 1 and c.header.has_hdrext
    assert sorted(c.names()) == sorted(p.name for p in inputs)
    for p in inputs:
        assert read_all(c, p.name) == p.read_bytes()


# ------------------------------------------------------------------ bad input

def build_v2(path, files, block_size=512, use_crc=False, patch=None):
    """A small v2 container laid out like casacore's: header block, then data blocks."""
    entries, data, next_block = [], [], 1
    for name, content in files:
        n = -(-len(content) // block_size)
        entries.append(Entry(name, len(content), np.arange(next_block, next_block + n)))
        data.append(content.ljust(n * block_size, b"\0"))
        next_block += n
    body = b"".join(data)
    crcs = [0] + [crc32_bzip2(body[i:i + block_size]) for i in range(0, len(body), block_size)]
    header = Header(version=2, block_size=block_size, counter=1, nblocks=next_block,
                    header_size=0, entries=entries, free_blocks=np.zeros(0, np.int64),
                    use_crc=use_crc, crcs=np.array(crcs if use_crc else [], np.uint32))
    if patch:
        patch(header)
    raw = encode_header_v2(header)
    assert len(raw) <= block_size
    path.write_bytes(raw.ljust(block_size, b"\0") + body)
    return path


def test_not_a_container(tmp_path):
    for content in (b"", b"short", b"hello world\n" * 100, bytes(4096)):
        p = tmp_path / "f.mf"
        p.write_bytes(content)
        with pytest.raises(NotAContainer, match="not a container ctdsfs knows"):
            open_container(p)


def test_truncated_container_header(tmp_path):
    p = tmp_path / "t.mf"
    p.write_bytes((DATA / "mf2_basic.mf").read_bytes()[:100])
    with pytest.raises(FormatError, match="header"):
        open_container(p)


def test_truncated_container_hides_entries_whose_blocks_are_gone(tmp_path):
    p = tmp_path / "t.mf"
    p.write_bytes((DATA / "mf2_basic.mf").read_bytes()[:3 * 4096])
    c = open_container(p)
    assert c.names() == ["empty.bin"]
    assert c.problems[0].startswith("header claims 5 blocks, the file holds 3")
    assert len(c.problems) == 3 and all("hidden" in x for x in c.problems[1:])


@pytest.mark.parametrize("offset,value,match", [
    (24, struct.pack(">i", 3), "version 3 is not supported"),
    (32, struct.pack(">q", 2 ** 60), "header size"),
    (40, struct.pack(">q", 0), "block size"),
    (40, struct.pack(">q", -4096), "block size"),
    (40, struct.pack(">q", 2 ** 40), "block size"),
    (96, struct.pack(">I", 0xFFFFFFFF), "v2 header"),  # entry count in the Block object
    (68, struct.pack(">I", 0x7FFFFFFF), "v2 header"),  # AipsIO object length
])
def test_absurd_header_values(tmp_path, offset, value, match):
    data = bytearray((DATA / "mf2_basic.mf").read_bytes())
    data[offset:offset + len(value)] = value
    p = tmp_path / "bad.mf"
    p.write_bytes(data)
    with pytest.raises(FormatError, match=match) as raised:
        open_container(p)
    assert str(raised.value).startswith(f"{p}: ")  # every header fault names the file


def test_huge_block_count_claim_is_bounded(tmp_path):
    def patch(h):
        h.nblocks = 2 ** 62
        h.entries[0].blocks = np.array([1, 2 ** 40])
    p = build_v2(tmp_path / "x.mf", [("a", b"x" * 600), ("b", b"y")], patch=patch)
    c = open_container(p)
    assert c.names() == ["b"]
    assert c.problems[0].endswith("header claims 4611686018427387904 blocks, the file holds 4")
    assert "outside the container" in c.problems[1]


@pytest.fixture
def bounded_memory():
    """Address space limited to 1 GiB more than now: a allocation sized by a hostile
    header fails the test with MemoryError instead of exhausting the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (in_use + (1 << 30), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("nblocks", [2 ** 31, 2 ** 62, 2 ** 63 - 1])
def test_absurd_block_count_with_valid_crc_sizes_nothing(tmp_path, nblocks, bounded_memory):
    """A CRC-valid header may still lie: every consumer works from the blocks that exist."""
    from ctdsfs.blockmap import block_map
    from ctdsfs.sources.checking import check_path

    p = build_v2(tmp_path / "x.mf", [("a", b"x" * 600), ("b", b"y")], use_crc=True,
                 patch=lambda h: setattr(h, "nblocks", nblocks))
    c = open_container(p)
    assert c.names() == ["a", "b"] and read_all(c, "a") == b"x" * 600
    assert c.nblocks == 4 and c.usage().total_blocks == 4
    assert f"header claims {nblocks} blocks, the file holds 4" in c.problems[0]
    assert len(block_map(c).roles) == 4
    assert c.describe()["blocks"] == nblocks  # what the header says, shown as it is
    problems, notes = check_path(p)
    assert problems == [f"{p}: header claims {nblocks} blocks, the file holds 4"]
    with pytest.raises(FormatError, match="mount it read-only"):
        open_container(p, writable=True)


def test_statfs_of_absurd_header_counts(tmp_path, mount):
    """df works: a block count of 2**63-1 and a free list longer than the file stay in range."""
    def patch(h):
        h.nblocks = 2 ** 63 - 1
        h.free_blocks = np.array([2, 2, 2])
    p = build_v2(tmp_path / "x.mf", [("a", b"x" * 600)], patch=patch)
    m = mount(p)
    st = os.statvfs(m.mountpoint)
    assert (st.f_blocks, st.f_bfree, st.f_bsize) == (3, 3, 512)
    assert os.listdir(m.mountpoint) == ["a"]


def test_header_and_block_size_claims_size_no_read(tmp_path, bounded_memory):
    data = bytearray((DATA / "mf2_basic.mf").read_bytes())
    data[32:48] = struct.pack(">qq", 2 ** 31 - 64, 2 ** 31)  # header size, block size
    p = tmp_path / "big.mf"
    p.write_bytes(data * 8)  # bigger than one block of 4096, far below 2 GiB
    with pytest.raises(FormatError, match=rf"^{p}: file ends inside the header"):
        open_container(p)


def test_nested_header_fault_names_the_virtual_file(tmp_path):
    data = bytearray((DATA / "mf2_nested.mf").read_bytes())
    data[2 * 4096 + 32:2 * 4096 + 40] = struct.pack(">q", 2 ** 62)  # SUB's header size
    p = tmp_path / "outer.mf"
    p.write_bytes(data)
    c = open_container(p)
    assert c.nested("SUB") is None  # shown as a plain file
    assert c.problems == [f"'SUB' shown as a file: looks nested but {p}/SUB: header size "
                          f"{2 ** 62} is invalid"]


@pytest.mark.parametrize("what,patch", [
    ("free list names block 0, outside the container",
     lambda h: setattr(h, "free_blocks", np.array([0]))),
    ("free list names a block twice or one that a file uses",
     lambda h: setattr(h, "free_blocks", np.array([2]))),
    ("continuation sets names a block twice or one that a file uses",
     lambda h: setattr(h, "cont_sets", (np.array([1]), np.zeros(0, np.int64)))),
    ("continuation sets names block -5, outside the container",
     lambda h: setattr(h, "cont_sets", (np.array([-5]), np.zeros(0, np.int64)))),
    ("continuation sets names block 100, outside the container",  # (a long list: numpy)
     lambda h: setattr(h, "cont_sets", (np.arange(100, 140), np.zeros(0, np.int64)))),
])
def test_reusable_block_lists_are_checked_before_any_write(tmp_path, what, patch):
    """A free list or continuation set that names the header or a file's block would have
    a write overwrite it: such a container is served read-only, never written."""
    p = build_v2(tmp_path / "x.mf", [("a", b"a" * 600)], patch=patch)
    before = p.read_bytes()
    c = open_container(p)
    assert c.names() == ["a"] and c.problems == [what]
    with pytest.raises(FormatError, match="mount it read-only"):
        open_container(p, writable=True)
    assert p.read_bytes() == before


@pytest.mark.parametrize("nblocks", [0, -1, -(2 ** 63)])
def test_non_positive_block_count_is_refused_naming_the_file(tmp_path, nblocks):
    p = build_v2(tmp_path / "x.mf", [("a", b"x" * 600)],
                 patch=lambda h: setattr(h, "nblocks", nblocks))
    with pytest.raises(FormatError, match=rf"^{tmp_path}/x.mf: block count {nblocks} is invalid"):
        open_container(p)


def test_v1_header_size_beyond_hdrext_is_refused_unread(tmp_path):
    data = bytearray((DATA / "casacore_test_v1.mf").read_bytes())
    data[:8] = struct.pack(">q", 2 ** 40)
    p = tmp_path / "v1.mf"
    p.write_bytes(data)
    shutil.copy(DATA / "casacore_test_v1.mf_hdrext", tmp_path / "v1.mf_hdrext")
    with pytest.raises(FormatError, match=r"^\S*v1.mf: \S*v1.mf_hdrext holds 528 bytes, the "
                                          r"header needs 1099511627648 there"):
        open_container(p)


def test_continuation_chain_loop(tmp_path):
    data = bytearray((DATA / "mf2_bighdr.mf").read_bytes())
    data[32:40] = struct.pack(">q", 2930 + 504 * 10)  # header claims 10 more pieces
    data[130 * 512:130 * 512 + 8] = struct.pack(">q", 126)  # last block points to the first
    p = tmp_path / "loop.mf"
    p.write_bytes(data)
    with pytest.raises(FormatError, match="loops"):
        open_container(p)


def test_continuation_chain_past_end(tmp_path):
    data = bytearray((DATA / "mf2_bighdr.mf").read_bytes())
    data[8:16] = struct.pack(">q", 10 ** 6)
    p = tmp_path / "far.mf"
    p.write_bytes(data)
    with pytest.raises(FormatError, match="outside the file"):
        open_container(p)


def test_untrusted_names_are_hidden(tmp_path):
    files = [("good", b"1"), ("..", b"2"), (".", b"3"), ("a/b", b"4"), ("a\0b", b"5"),
             ("", b"6"), ("good", b"7"), ("n" * 256, b"8"), ("caf\udcc3", b"9")]
    c = open_container(build_v2(tmp_path / "names.mf", files, block_size=1024))
    assert c.names() == ["good", "caf\udcc3"]  # undecodable bytes survive as escapes
    assert read_all(c, "good") == b"1"
    problems = " | ".join(c.problems)
    for why in ("reserved name", "'/' or NUL", "duplicate name", "longer than 255"):
        assert why in problems
    assert len(c.problems) == 6  # the empty name is a deleted slot, not a problem


def test_bad_sizes_and_shared_blocks_are_hidden(tmp_path):
    def patch(h):
        h.entries[1].size = 10_000  # more than its one block
        h.entries[2].size = -1
        h.entries[3].blocks = np.array([1])  # block 1 belongs to entry 0
        h.entries[4].blocks = np.array([5, 5])  # the same block twice
    files = [(n, b"z" * 100) for n in "abcde"]
    c = open_container(build_v2(tmp_path / "x.mf", files, patch=patch))
    assert c.names() == ["a"]
    assert len(c.problems) == 4


def test_header_crc_mismatch_refuses_unless_nocrc(tmp_path):
    data = bytearray((DATA / "mf2_crc.mf").read_bytes())
    data[115] ^= 0x01  # the entry name 'f1' becomes 'f0'
    p = tmp_path / "badhdr.mf"
    p.write_bytes(data)
    with pytest.raises(FormatError, match="header CRC mismatch"):
        open_container(p)
    assert open_container(p, verify_crc=False).names() == ["f0", "f2"]


def test_corrupted_block_fails_only_that_block(tmp_path, caplog):
    data = bytearray((DATA / "mf2_crc.mf").read_bytes())
    data[3 * 4096 + 17] ^= 0xFF  # f1's third block
    p = tmp_path / "badblock.mf"
    p.write_bytes(data)
    c = open_container(p)
    good = pattern(20000, 13, 5, 251)
    assert c.read("f1", 0, 8192) == good[:8192]
    assert c.read("f1", 12288, 8000) == good[12288:]
    with pytest.raises(BlockError, match=r"f1: block 2 \(container block 3\) fails its CRC"):
        c.read("f1", 8192 + 5, 1)
    with pytest.raises(BlockError):
        c.read("f1", 0, 20000)
    assert "badblock.mf" not in caplog.text  # the reader logs it (a mount: once, with its path)
    assert read_all(c, "f2") == b"\xab" * 4096
    # With verification off the damaged bytes are returned as they are.
    assert open_container(p, verify_crc=False).read("f1", 8192 + 17, 1) != good[8192 + 17:8192 + 18]


def _self_similar(path, levels, block_size=512):
    """A container whose SUB holds a container whose SUB holds ... ``levels`` deep."""
    total = levels + 1
    blocks = []
    for level in range(total):
        n = total - level  # blocks of this level's container (header + the rest)
        entries = [Entry("SUB", (n - 1) * block_size, np.arange(1, n))] if n > 1 else []
        h = Header(version=2, block_size=block_size, counter=1, nblocks=n, header_size=0,
                   entries=entries, free_blocks=np.zeros(0, np.int64))
        blocks.append(encode_header_v2(h).ljust(block_size, b"\0"))
    path.write_bytes(b"".join(blocks))
    return path


def test_nested_recursion_is_bounded(tmp_path):
    c = open_container(_self_similar(tmp_path / "deep.mf", MAX_NESTING + 8))
    depth = 0
    while (child := c.nested("SUB")) is not None:
        c, depth = child, depth + 1
    assert depth == MAX_NESTING
    assert "nested more than" in c.problems[-1]


def test_nested_that_fails_to_parse_is_shown_as_a_file(tmp_path):
    inner = bytearray((DATA / "mf2_basic.mf").read_bytes())
    inner[96:100] = struct.pack(">I", 0xFFFF)  # corrupt the child's entry count
    c = open_container(build_v2(tmp_path / "p.mf", [("SUB", bytes(inner))], block_size=4096))
    assert c.nested("SUB") is None
    assert read_all(c, "SUB") == bytes(inner)
    assert "looks nested" in c.problems[0]


def test_random_garbage_never_crashes(tmp_path):
    """Flipping random header bytes gives a FormatError or a usable container, nothing else."""
    rng = random.Random(11)
    base = (DATA / "mf2_bighdr.mf").read_bytes()
    for i in range(300):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(0, 3000) if rng.random() < 0.8 else rng.randrange(len(data))
            data[pos] = rng.randrange(256)
        p = tmp_path / "fuzz.mf"
        p.write_bytes(data)
        try:
            c = open_container(p)
        except FormatError:
            continue
        for name in c.names():
            c.read(name, 0, 4096)
            c.nested(name)
        c.close()


@pytest.mark.parametrize("blocks", [[], [7], [1, 2, 3], [4, 3, 2], [1, 3, 4, 5, 9, 10],
                                    [*range(10, 50), 3, *range(60, 100)]])
def test_short_and_long_block_lists_split_into_the_same_runs(blocks, monkeypatch):
    """Block lists (ranges, arrays) are split by a Python loop, very long ones by numpy."""
    from array import array

    from ctdsfs.formats.multifile import header as multifile_header

    expected, start = [], 0
    for i in range(1, len(blocks) + 1):
        if i == len(blocks) or blocks[i] != blocks[i - 1] + 1:
            expected.append((start, i))
            start = i
    for limit in (1, len(blocks) + 1):  # numpy, then the loop
        monkeypatch.setattr(multifile_header, "LONG_BLOCK_LIST", limit)
        assert multifile_header.index_runs(array("q", blocks)) == expected
    if len(expected) <= 1:
        assert multifile_header.index_runs(range(7, 7 + len(blocks))) == expected


def test_run_and_block_by_block_checks_agree():
    """A container's blocks are checked as runs, a damaged one's block by block: on random
    (often hostile) block lists both hide the same entries for the same reasons."""
    from array import array

    from ctdsfs.formats.multifile import container as multifile
    rng = random.Random(7)
    for _ in range(300):
        limit = rng.randrange(1, 40)
        candidates = [(slot, Entry(f"f{slot}", 0, array(
            "q", [rng.randrange(-2, 45) for _ in range(rng.randrange(0, 4))])))
            for slot in range(rng.randrange(0, 8))]
        nonempty = [(slot, e) for slot, e in candidates if len(e.blocks)]
        runs = multifile.entry_block_runs(e for _, e in nonempty)
        by_runs = multifile.MultiFile._bad_blocks(nonempty, runs, limit)
        exact = multifile.MultiFile._bad_blocks_exactly(nonempty, limit) if nonempty else []
        assert by_runs == exact, (candidates, limit)
