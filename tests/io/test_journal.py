"""The redo journal under HDF5: every operation against a plain model, every crash point,
torn and hostile journals, and real h5py files through it."""

import os
import random

import h5py
import numpy as np
import pytest

from ctdsfs.errors import CtdsfsError, FormatError
from ctdsfs.io import journal
from ctdsfs.io.journal import JournaledFile, journal_path


def random_session(j, model, rng, steps):
    """Random writes, truncates and reads on ``j``, mirrored on the bytearray ``model``."""
    for _ in range(steps):
        op = rng.random()
        if op < 0.5:
            offset, data = rng.randrange(0, 40000), rng.randbytes(rng.randrange(1, 9000))
            model.extend(bytes(max(0, offset - len(model))))
            model[offset:offset + len(data)] = data
            j.seek(offset)
            j.write(data)
        elif op < 0.7:
            size = rng.randrange(0, 40000)
            del model[size:]
            model.extend(bytes(size - len(model)))
            j.truncate(size)
        else:
            offset, n = rng.randrange(0, 45000), rng.randrange(1, 9000)
            buf = bytearray(n)
            j.seek(offset)
            j.readinto(buf)
            assert bytes(buf) == bytes(model[offset:offset + n]).ljust(n, b"\0")


def journaled_random_file(path, rng, min_size=0):
    """``path`` filled with random bytes and opened for writing: (the bytes, the file)."""
    start = rng.randbytes(rng.randrange(min_size, 30000))
    path.write_bytes(start)
    return start, JournaledFile(path, True)


def test_operations_match_a_plain_file_and_commits_land(tmp_path):
    rng = random.Random(1)
    path = tmp_path / "f"
    for _ in range(60):
        start, j = journaled_random_file(path, rng)
        model = bytearray(start)
        for _ in range(3):
            random_session(j, model, rng, 10)
            j.commit()
            assert path.read_bytes() == bytes(model)
            assert not os.path.exists(journal_path(path))
            start = bytes(model)
        j.close()


def test_nothing_committed_is_touched_before_the_commit(tmp_path):
    """Between commits the committed bytes stay as they are: a crash there loses nothing."""
    rng = random.Random(2)
    path = tmp_path / "f"
    for _ in range(40):
        start, j = journaled_random_file(path, rng, 1)
        random_session(j, bytearray(start), rng, 20)
        assert path.read_bytes()[:len(start)] == start
        j.close()  # dies without committing
        # (Bytes it wrote past the committed end may stay: the committed state never reads them.)
        assert JournaledFile(path, False).read()[:len(start)] == start


@pytest.mark.parametrize("crash_after", ["journal", "some pages", "all pages", "size"])
def test_every_crash_point_of_a_commit_gives_the_old_or_the_new_state(tmp_path, crash_after):
    rng = random.Random(3)
    path = tmp_path / "f"
    for _ in range(30):
        start, j = journaled_random_file(path, rng, 1)
        model = bytearray(start)
        random_session(j, model, rng, 15)
        # The commit's own steps, stopped where a crash would stop them.
        os.fsync(j.fd)
        zeroed = (min(j.cut[0], j.size), min(j.cut[1], j.size))
        pages = {p: d for p, d in j.pages.items() if p * journal.PAGE < j.size}
        j._write_journal(zeroed, pages)
        if crash_after != "journal":
            items = sorted(pages.items())
            if crash_after == "some pages":
                items = items[:len(items) // 2]
            for page, data in items:
                os.pwrite(j.fd, data, page * journal.PAGE)
            if crash_after == "size":
                os.ftruncate(j.fd, j.size)
        j.close()
        assert JournaledFile(path, False).read() == bytes(model)  # a reader replays in memory
        assert os.path.exists(journal_path(path))
        JournaledFile(path, True).close()  # the next writer replays into the file
        assert path.read_bytes() == bytes(model)
        assert not os.path.exists(journal_path(path))


def test_a_torn_journal_is_a_commit_that_did_not_happen(tmp_path):
    rng = random.Random(4)
    path = tmp_path / "f"
    start = rng.randbytes(20000)
    for cut in (0, 5, 40, 4000, 9000, -1):
        path.write_bytes(start)
        j = JournaledFile(path, True)
        j.seek(100)
        j.write(b"x" * 9000)
        j.seek(25000)
        j.write(b"tail")
        os.fsync(j.fd)
        j._write_journal((j.size, j.size), dict(j.pages))
        j.close()
        data = open(journal_path(path), "rb").read()
        with open(journal_path(path), "wb") as f:
            f.write(data[:cut])
        assert JournaledFile(path, False).read()[:len(start)] == start
        JournaledFile(path, True).close()
        assert path.read_bytes()[:len(start)] == start
        assert not os.path.exists(journal_path(path))


def test_a_journal_that_reaches_outside_the_file_is_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(8192))
    j = JournaledFile(path, True)
    j.seek(0)
    j.write(b"y" * 10)
    j.size = 1 << 40  # a journal claiming a size the file does not have
    j._write_journal((0, 0), dict(j.pages))
    j.close()
    with pytest.raises(FormatError, match="journal reaches past the file"):
        JournaledFile(path, False)
    with pytest.raises(FormatError, match="journal reaches past the file"):
        JournaledFile(path, True)
    assert path.read_bytes() == bytes(8192)  # nothing replayed


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    first = JournaledFile(path, True)
    with pytest.raises(CtdsfsError, match="another writer"):
        JournaledFile(path, True)
    first.close()
    JournaledFile(path, True).close()


def test_hdf5_through_the_journal(tmp_path):
    """h5py writes through it; a plain h5py reader sees only committed states."""
    path = tmp_path / "h.h5"
    with h5py.File(path, "w", libver=("earliest", "v110")) as f:
        f["old"] = np.arange(1000)
    j = JournaledFile(path, True)
    f = h5py.File(j, "r+", locking=False)
    f["new"] = np.arange(5000)
    del f["old"]
    f.flush()
    with h5py.File(path, "r", locking=False) as reader:
        assert list(reader) == ["old"]
    j.commit()
    with h5py.File(path, "r", locking=False) as reader:
        assert list(reader) == ["new"] and reader["new"][-1] == 4999
    f.close()
    j.close()
