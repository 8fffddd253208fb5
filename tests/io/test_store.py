import ctypes
import mmap
import os

import pytest

from ctdsfs.io.store import READ_AROUND, FileStore

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(path, size):
    """Which pages of ``path`` the page cache holds (mincore of a mapping)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        pages = (ctypes.c_ubyte * (size // PAGE))()
        view = ctypes.c_char.from_buffer(m)  # the mapping's first byte
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(size),
                            pages):
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del view
    return [bool(p & 1) for p in pages]


@pytest.fixture
def cold_file(tmp_path):
    """A file of 8 windows, written, synced and dropped from the page cache."""
    path = tmp_path / "cold.bin"
    path.write_bytes(os.urandom(8 * READ_AROUND))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert not any(resident_pages(path, 8 * READ_AROUND))
    return path


def test_a_small_read_of_a_read_only_file_brings_in_its_whole_window(cold_file):
    store = FileStore(cold_file)
    try:
        at = 3 * READ_AROUND + 5 * PAGE
        got = store.pread(at, 100)
        per_window = READ_AROUND // PAGE
        resident = resident_pages(cold_file, 8 * READ_AROUND)
        assert all(resident[3 * per_window:4 * per_window])
        assert not any(resident[:3 * per_window]) and not any(resident[5 * per_window:])
        assert got == cold_file.read_bytes()[at:at + 100]
    finally:
        store.close()


def test_a_writable_file_is_read_as_asked(cold_file):
    store = FileStore(cold_file, writable=True)
    try:
        store.pread(3 * READ_AROUND + 5 * PAGE, 100)
        assert sum(resident_pages(cold_file, 8 * READ_AROUND)) < READ_AROUND // PAGE // 2
    finally:
        store.close()
