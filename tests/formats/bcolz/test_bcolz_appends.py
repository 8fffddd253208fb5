"""Appends to a bcolz carray's array.npy through a read-write mount: bcolz stores whole
items, so a write that would leave part of one fails in its own call and changes
nothing, while the pieces the kernel cuts a long write into (at page boundaries of the
file offset, inside an item) and copy tools' blocks are taken."""

import errno
import os
import subprocess

import bcolz  # the ground truth writer and reader (PyPI bcolz-zipline)
import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")


def write_carray(path, values, chunklen):
    bcolz.carray(values, rootdir=str(path), mode="w", chunklen=chunklen).flush()
    return path


def append(path, data):
    """One write(2) with O_APPEND; its result, or the errno it failed with."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        return os.write(fd, data)
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)  # (nothing is pending: closing succeeds)


def test_short_append_ending_inside_an_item_fails_in_its_call(tmp_path, mount):
    root = write_carray(tmp_path / "prices", np.arange(250.0), chunklen=64)
    m = mount(root, options=["rw"])
    array = m.mountpoint / "array.npy"
    size = array.stat().st_size
    assert (size + 12) % PAGE  # (the write does not end where the kernel cuts writes)
    assert append(array, np.array([1.5]).tobytes() + b"\x00" * 4) == errno.EPERM
    assert array.stat().st_size == size
    assert len(bcolz.open(str(root))) == 250
    assert np.array_equal(np.load(array), np.arange(250.0))
    assert "ends inside an item" in m.log_text()


def test_long_append_cut_inside_items_is_taken_and_short_one_refused(tmp_path, mount):
    """12-byte items (int32 x 3): the kernel cuts a 1 MiB write at page boundaries
    that fall inside items, and cat copies 128 KiB blocks that end inside items; both
    are stored whole. A short write that ends inside an item is refused after them."""
    start = np.arange(750, dtype=np.int32).reshape(250, 3)
    root = write_carray(tmp_path / "rows", start, chunklen=16384)
    m = mount(root, options=["rw"])
    array = m.mountpoint / "array.npy"
    size = array.stat().st_size
    assert (PAGE - size % PAGE) % 12  # (the kernel's first cut falls inside an item)
    big = np.arange(3 * 87382, dtype=np.int32).reshape(-1, 3) + 1000
    assert append(array, big.tobytes()) == big.nbytes > 1 << 20
    copied = np.arange(3 * 25000, dtype=np.int32).reshape(-1, 3) - 7
    (tmp_path / "copied.bin").write_bytes(copied.tobytes())
    with open(array, "ab") as out:
        subprocess.run(["cat", str(tmp_path / "copied.bin")], stdout=out, check=True)
    expected = np.concatenate([start, big, copied])
    size = array.stat().st_size
    assert append(array, bytes(5)) == errno.EPERM
    assert array.stat().st_size == size
    assert np.array_equal(bcolz.open(str(root))[:], expected)
    assert np.array_equal(np.load(array), expected)
