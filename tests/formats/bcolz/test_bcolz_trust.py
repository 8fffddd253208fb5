"""bcolz rootdirs under hostile conditions and heavy use (issue 24): writes that will not
be honoured change nothing, large attributes open, no link inside a rootdir is followed,
no planted temporary is written through, and sequential readers get chunks decoded ahead."""

import json
import os
import shutil
import struct

import bcolz
import numpy as np
import pytest

from ctdsfs.errors import BlockError, CtdsfsError, FormatError, NotPermitted
from ctdsfs.formats import open_container

from .test_bcolz import npy, whole

ROOTDIRS = {  # name -> how bcolz writes it (small: each test gets fresh copies)
    "trimmed": lambda path: _trimmed(path),
    "float64_bitshuffle": lambda path: bcolz.carray(
        np.arange(5000.0) / 3, rootdir=str(path), mode="w",
        cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=2)).flush(),
    "tiny_chunklen": lambda path: bcolz.carray(np.arange(37, dtype=np.int16), rootdir=str(path),
                                               mode="w", chunklen=1).flush(),
    "table": lambda path: bcolz.ctable([np.arange(300), np.arange(300) / 7.0],
                                       names=["c0", "price"], rootdir=str(path), mode="w",
                                       chunklen=64).flush(),
}


def _trimmed(path):
    """27 int32 items, chunklen 8 (a trim leaves a superchunk past the end)."""
    carray = bcolz.carray(np.arange(40, dtype=np.int32), rootdir=str(path), mode="w",
                          chunklen=8)
    carray.trim(13)
    carray.flush()


@pytest.fixture
def damaged(tmp_path):
    """A fresh rootdir bcolz wrote, to damage."""
    def make(name):
        ROOTDIRS[name](tmp_path / name)
        return tmp_path / name
    return make


def test_attrs_of_several_megabytes_open_as_bcolz_reads_them(tmp_path):
    """Issue 24 item 3: zipline stores first_row/last_row for 40,000 sids in a ctable's
    attrs (several MB); ctdsfs showed the rootdir raw. An absurd size is still refused."""
    path = tmp_path / "daily"
    table = bcolz.ctable([np.arange(100.0), np.arange(100)], names=["close", "sid"],
                         rootdir=str(path), mode="w")
    table.attrs["first_row"] = {str(sid): sid * 37 for sid in range(40000)}
    table.attrs["last_row"] = {str(sid): sid * 37 + 36 for sid in range(40000)}
    table.flush()
    assert (path / "__attrs__").stat().st_size > 1 << 20
    c = open_container(path)
    assert json.loads(whole(c, "attrs.json")) == dict(bcolz.open(str(path)).attrs)
    assert np.array_equal(npy(c, "close.npy"), np.arange(100.0))
    c.close()
    os.truncate(path / "__attrs__", (64 << 20) + 1)  # (sparse: nothing is written)
    with pytest.raises(FormatError, match="more than the") as info:
        open_container(path)
    assert "\n" not in str(info.value) and "__attrs__" in str(info.value)


@pytest.mark.parametrize("folder", ["data", "meta", "price/data", "price/meta", "price"])
def test_a_linked_folder_inside_a_rootdir_is_never_followed(damaged, tmp_path, folder):
    """Issue 24 item 11: a folder of a rootdir (or a column) replaced by a link to a copy
    outside is never followed: refused in one line naming the rootdir (a column: hidden,
    said among the problems). Swapped in after opening, a read fails (EIO) instead, also
    of a chunk decoded before (a cached chunk's file is checked by one lstat of the path,
    which may follow the link: the copy outside is another file)."""
    name = "table" if folder.startswith("price") else "trimmed"
    root = damaged(name)
    outside = tmp_path / "outside"
    shutil.copytree(root / folder, outside)
    view = open_container(root)
    carray = view.nested("price") if name == "table" else view
    carray.nested("chunks").read("0", 0, 1)
    shutil.rmtree(root / folder)
    os.symlink(outside, root / folder)
    if name == "table":
        other = open_container(root)
        assert "price.npy" not in other.names() and "price" not in other.names()
        assert any("'price' hidden" in p for p in other.problems)
        other.close()
    else:
        with pytest.raises(CtdsfsError) as info:
            open_container(root).close()
        assert "\n" not in str(info.value) and str(root) in str(info.value)
    if folder != "meta" and folder != "price/meta":  # the open view reads no outside byte
        with pytest.raises(BlockError):
            carray.nested("chunks").read("0", 0, 1)
    view.close()


@pytest.mark.parametrize("planted", ["data/.__3.blp.ctdsfs-new", "meta/.sizes.ctdsfs-new"])
@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_planted_temporaries_are_never_written(damaged, tmp_path, planted, kind):
    """Issue 24 item 12: a hard link or a symbolic link planted at a temporary's name
    never receives the commit's bytes (the temporary is made afresh with O_EXCL)."""
    root = damaged("trimmed")  # 27 int32 items, chunklen 8: appending touches data/__3.blp
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (os.link if kind == "hardlink" else os.symlink)(outside, root / planted)
    c = open_container(root, writable=True)
    size = c.entry_size("array.npy")
    c.write("array.npy", size, struct.pack("<i", 27))
    c.write("array.npy", size - 4, struct.pack("<i", -26))
    c.close()
    assert outside.read_bytes() == b"precious"
    assert list(bcolz.open(str(root))[:]) == list(range(26)) + [-26, 27]


def test_a_write_ending_inside_an_item_commits_nothing(damaged, mount):
    """Issue 24 item 7: a 12-byte O_APPEND write to a float64 array.npy stored one item and
    then failed at close. Now the write itself is refused and nothing is held (through a
    mount: test_bcolz_appends); a write of a page or more may end inside an item, and
    the next write completes it."""
    root = damaged("float64_bitshuffle")
    length = len(bcolz.open(str(root)))
    c = open_container(root, writable=True)
    size = c.entry_size("array.npy")
    with pytest.raises(NotPermitted, match="ends inside an item"):
        c.write("array.npy", size, bytes(12))
    assert c.entry_size("array.npy") == size and not c.dirty and c.commit() is False
    c.close()
    assert len(bcolz.open(str(root))) == length
    top = mount(root, options=["rw"]).mountpoint
    items = np.arange(600.0) + 0.5
    with open(top / "array.npy", "ab") as f:  # whole items in odd pieces are all stored
        f.write(items.tobytes()[:4101])
        f.flush()
        f.write(items.tobytes()[4101:])
    assert np.array_equal(bcolz.open(str(root))[length:], items)


def test_a_sequential_reader_has_the_next_chunks_decoded_ahead(damaged):
    """Chunks after the one a sequential reader is in are decoded in other threads while
    it reads; a reader that jumps about has nothing decoded ahead, even where a read
    spans two chunks (as a page fault of a mapped file asks 1 MiB around it)."""
    import time

    from ctdsfs.formats.bcolz.carray import CHUNKS_AHEAD

    root = damaged("tiny_chunklen")  # 37 int16 items, one per chunk
    c = open_container(root)
    header = c.entry_size("array.npy") - 37 * 2
    c.read("array.npy", header, 2)
    c.read("array.npy", header + 2, 2)  # chunk 1 after chunk 0: in order
    key = lambda n: (str(root), n)  # noqa: E731
    deadline = time.monotonic() + 10
    ahead = range(2, 2 + CHUNKS_AHEAD)
    while not all(c.cache.get(key(n), _identity(root, n)) for n in ahead):
        assert time.monotonic() < deadline, f"chunks {ahead} were not decoded ahead"
        time.sleep(0.01)
    assert c.cache.get(key(ahead[-1] + 1), _identity(root, ahead[-1] + 1)) is None
    c.read("array.npy", header + 20 * 2, 2)  # a jump: nothing ahead of it
    c.read("array.npy", header + 30 * 2, 4)  # another, across chunks 30 and 31
    time.sleep(0.2)
    assert c.cache.get(key(21), _identity(root, 21)) is None
    assert c.cache.get(key(32), _identity(root, 32)) is None


@pytest.mark.parametrize("starts", [(0, 20), (0, 12, 24)])
def test_readers_in_parallel_each_have_their_next_chunks_decoded_ahead(damaged, starts):
    """Readers of one file going through their own parts in turn (their reads reach the
    same carray one after another) are each a sequential reader, not jumps."""
    import time

    from ctdsfs.formats.bcolz.carray import CHUNKS_AHEAD

    root = damaged("tiny_chunklen")  # 37 int16 items, one per chunk
    c = open_container(root)
    header = c.entry_size("array.npy") - 37 * 2
    for step in range(2):
        for start in starts:
            c.read("array.npy", header + (start + step) * 2, 2)
    wanted = [n for start in starts for n in range(start + 2, start + 2 + CHUNKS_AHEAD)]
    deadline = time.monotonic() + 10
    while not all(c.cache.get((str(root), n), _identity(root, n)) for n in wanted):
        assert time.monotonic() < deadline, f"chunks {wanted} were not all decoded ahead"
        time.sleep(0.01)


def _identity(root, number):
    from ctdsfs.io.blosc_chunk import file_identity
    return file_identity(os.lstat(root / "data" / f"__{number}.blp"))
