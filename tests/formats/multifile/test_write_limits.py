"""Writing MultiFiles at the edges: huge sizes, holes, space given back, a full disk.

The full-disk tests put the container on a small tmpfs of its own (root only).
"""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from ctdsfs.errors import ContainerFull, TooLarge
from ctdsfs.formats import create_container, open_container

from .test_write import check_crcs, snapshot


def state(c, name):
    """What a refused change must leave exactly as it was."""
    e = c._entry(name)
    return (e.size, list(e.blocks), list(c._free), list(c._pending_free), c._nblocks,
            c.dirty, c.store.size(), c.usage())


@pytest.mark.parametrize("use_crc", [False, True])
def test_sizes_past_the_disk_or_the_format_change_nothing(tmp_path, use_crc):
    c = create_container(tmp_path / "big.mf", block_size=4096, use_crc=use_crc)
    c.create("f")
    c.write("f", 0, b"x" * 5000)
    c.commit()
    before = state(c, "f")
    for size in (999999999999999, (1 << 62) + 3):  # more than the disk, more than ext4
        with pytest.raises(ContainerFull, match=r"big\.mf: f: no space left"):
            c.truncate("f", size)
        with pytest.raises(ContainerFull):
            c.write("f", size, b"!")
        assert state(c, "f") == before
    for offset in ((1 << 63) - 1, 1 << 64):  # past Int64, or blocks that cannot be numbered
        with pytest.raises(TooLarge, match=r"big\.mf: f: "):
            c.write("f", offset, b"!")
        with pytest.raises(TooLarge):
            c.truncate("f", offset)
        assert state(c, "f") == before
    assert c.writable
    c.write("f", 5000, b"y")  # and the container carries on
    c.close()
    assert snapshot(open_container(tmp_path / "big.mf")) == {"f": b"x" * 5000 + b"y"}


def test_holes_cost_no_memory_and_read_as_zeros(tmp_path):
    """A hole of 1.5 GiB: appended blocks are not written (the file is grown with zeros),
    so neither memory nor writes grow with it; CRCs are those of zero blocks."""
    path = tmp_path / "hole.mf"
    code = f"""
import resource, sys
sys.path[:0] = {sys.path!r}
from ctdsfs.formats import create_container
c = create_container({str(path)!r}, block_size=65536, use_crc=True)
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # less than the hole
c.create("f")
c.write("f", 3 << 29, b"end")
c.create("g")
c.truncate("g", (1 << 29) + 5)
c.close()
print(open("/proc/self/io").read().split("wchar:")[1].split()[0])
"""
    written = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout)
    assert written < 1 << 20  # headers only: the 2 GiB of zeros were not written either
    c = open_container(path)
    assert c.entry_size("f") == (3 << 29) + 3 and c.entry_size("g") == (1 << 29) + 5
    assert c.read("f", (3 << 29) - 5, 100) == bytes(5) + b"end"
    assert c.read("g", 12345678, 1000) == bytes(1000)
    assert c.read("f", 1 << 29, 8 << 20) == bytes(8 << 20)  # CRC-checked reads
    c.close()


def test_zeros_in_reused_blocks_are_written(tmp_path):
    """A hole over blocks taken from the free list must be zeroed for real."""
    c = create_container(tmp_path / "z.mf", block_size=512, use_crc=True)
    c.create("old")
    c.write("old", 0, b"\xff" * 512 * 40)
    c.commit()
    c.remove("old")
    c.create("keep")
    c.write("keep", 0, b"k")  # keeps the file from shrinking to nothing
    c.commit()  # old's blocks are free in both states now
    c.create("f")
    c.truncate("f", 512 * 30)
    assert len(c._free) < 40 - 30 + 1
    c.close()
    assert snapshot(open_container(tmp_path / "z.mf"))["f"] == bytes(512 * 30)
    check_crcs(tmp_path / "z.mf")


def header_blocks(c):
    return -(-c.header.header_size // c.block_size)


@pytest.mark.parametrize("use_crc", [False, True])
@pytest.mark.parametrize("header_first", [True, False])
def test_space_is_given_back_after_an_unlink(tmp_path, use_crc, header_first):
    """Continuation blocks no longer sit at the end: the file shrinks to what is in use.

    Without ``header_first`` the first continuation set is born behind the big
    file, and the commit of the unlink finds no block free in both states."""
    path = tmp_path / "shrink.mf"
    c = create_container(path, block_size=4096, use_crc=use_crc)
    names = [f"a_long_file_name_to_make_the_header_large_{i:04d}" for i in range(150)]
    for name in names:  # a header of several blocks, with or without CRCs
        c.create(name)
        c.write(name, 0, name.encode())
    if header_first:
        c.commit()
    c.create("big")
    c.write("big", 256 << 20, b"!")
    c.commit()
    assert header_blocks(c) > 1 and os.path.getsize(path) > 256 << 20
    c.remove("big")
    c.commit()
    c.commit()  # (if the first could not lay the header out low, it left this one to do)
    assert not c.dirty
    in_use = 1 + len(names) + header_blocks(c)
    assert os.path.getsize(path) <= (in_use + 2) * 4096
    c.close()
    validate_multifile(path)
    r = open_container(path)
    assert snapshot(r) == {n: n.encode() for n in names}
    r.close()


def validate_multifile(path):
    """Blocks used once, free list and continuation sets disjoint and inside, CRCs right."""
    c = open_container(path)
    assert c.problems == []
    used = [b for n in c.names() for b in list(c._entry(n).blocks)]
    everything = used + c.header.free_blocks.tolist() + [
        b for s in c.header.cont_sets for b in np.asarray(s).tolist()]
    assert len(everything) == len(set(everything))
    assert all(0 < b < c.header.nblocks for b in everything)
    assert c.header.nblocks * c.block_size == os.path.getsize(path)
    use_crc = c.header.use_crc
    c.close()
    if use_crc:
        check_crcs(path)


@pytest.mark.tools
def test_casacore_reads_a_table_container_after_shrinking(tmp_path):
    from ...conftest import make_casacore_table
    from ...test_mount_rw import dump_table

    table = make_casacore_table(tmp_path / "t.tab", block_size=4096, rows=100)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".casarc").write_text("\n")
    expected = dump_table(table, home)
    c = open_container(table / "table.mf", writable=True)
    size = os.path.getsize(table / "table.mf")
    c.create("scratch")
    c.write("scratch", 64 << 20, b"!")
    c.commit()
    c.remove("scratch")
    c.commit()
    c.close()
    assert os.path.getsize(table / "table.mf") <= size
    validate_multifile(table / "table.mf")
    assert dump_table(table, home) == expected


# ---------------------------------------------------------------- a full disk

def fill(path):
    """Fill the disk holding ``path`` with a file of zeros."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, bytes(size))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def write_until_refused(container, name, chunk, tries, match):
    """Append ``chunk`` to ``name`` until the disk refuses (ContainerFull matching ``match``);
    the refused write must change nothing. Returns the bytes written."""
    written = 0
    with pytest.raises(ContainerFull, match=match):
        for _ in range(tries):
            before = state(container, name)
            container.write(name, written, chunk)
            written += len(chunk)
    assert state(container, name) == before  # the refused write changed nothing
    return written


@pytest.mark.parametrize("version", ["mf2", "mf1"])
def test_full_disk_gives_enospc_and_rm_makes_room(small_disk, version):
    path = small_disk / "full.mf"
    c = create_container(path, format=version, block_size=4096, use_crc=version == "mf2")
    c.create("kept")
    c.write("kept", 0, b"k" * 100000)
    c.commit()
    c.create("filler")
    chunk = os.urandom(1 << 20)
    # 16 MiB cannot fit on 8 MiB
    written = write_until_refused(c, "filler", chunk, 16, r"full\.mf: filler: no space left")
    assert c.writable
    assert c.read("filler", 0, written) == chunk * (written >> 20)
    with pytest.raises(ContainerFull):
        c.truncate("filler", written + (8 << 20))
    c.commit()  # what did fit is committed (the header needs no new blocks)
    c.remove("filler")
    c.commit()
    assert os.path.getsize(path) < 200000  # space given back to the disk
    c.create("after")
    c.write("after", 0, chunk * 4)
    c.close()
    r = open_container(path)
    assert snapshot(r) == {"kept": b"k" * 100000, "after": chunk * 4}
    r.close()


def test_commit_on_a_full_disk_keeps_the_committed_state(small_disk):
    """A header that needs new continuation blocks on a full disk: ENOSPC, nothing lost,
    still writable; once there is room the commit goes through."""
    path = small_disk / "hdr.mf"
    c = create_container(path, block_size=512)
    c.create("kept")
    c.write("kept", 0, b"k" * 1000)
    c.commit()
    ballast = small_disk / "ballast"
    fill(ballast)
    for i in range(60):  # header entries only: no data blocks needed
        c.create(f"a_name_that_makes_the_header_grow_{i:03d}")
    with pytest.raises(ContainerFull, match=r"hdr\.mf: \(header\): no space left"):
        c.commit()
    assert c.writable and c.dirty
    assert snapshot(open_container(path)) == {"kept": b"k" * 1000}
    os.unlink(ballast)
    assert c.commit()
    c.close()
    r = open_container(path)
    assert len(r.names()) == 61
    r.close()


def test_full_disk_inside_a_nested_container(small_disk):
    """The parent checks room for the child's writes first: the child is never half-changed."""
    path = small_disk / "nested.mf"
    c = create_container(path, block_size=4096)
    sub = c.make_nested("SUB")
    sub.create("kept")
    sub.write("kept", 0, b"k" * 50000)
    c.commit()
    sub.create("filler")
    chunk = os.urandom(1 << 18)
    write_until_refused(sub, "filler", chunk, 64, r"nested\.mf: SUB: no space left")
    assert c.writable and sub.writable
    c.commit()
    sub.remove("filler")
    c.commit()
    assert os.path.getsize(path) < 200000
    sub.create("after")
    sub.write("after", 0, chunk * 4)
    c.close()
    r = open_container(path)
    assert snapshot(r) == {"SUB/": b"", "SUB/kept": b"k" * 50000, "SUB/after": chunk * 4}
    r.close()
