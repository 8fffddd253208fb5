"""Read-write mounts killed (``kill -9``) at random moments: the container is always the
last commit or the next, never anything else."""

import os
import random

import pytest

from ctdsfs.formats import open_container

from .conftest import Mount, require_fuse
from .formats.multifile.test_write import snapshot
from .test_mount_rw import new_container, validate

pytestmark = pytest.mark.fuse


# kill points per run (each a mount, a kill and a check: seconds each, an HDF5 mount's
# probe the most); raise them for a longer campaign
CRASH_POINTS = int(os.environ.get("CTDSFS_CRASH_POINTS", "35"))
HDF5_CRASH_POINTS = int(os.environ.get("CTDSFS_HDF5_CRASH_POINTS", "20"))


@pytest.mark.parametrize("name,points,block_size", [
    ("crash.mf", CRASH_POINTS, 512),
    ("bulk.mf", 20, 65536),  # writes of whole-block runs: the O_DIRECT path
    ("crash.mfh5", HDF5_CRASH_POINTS, 512)])  # HDF5 through the journal
def test_kill_9_never_loses_a_commit(tmp_path, name, points, block_size):
    """kill -9 the daemon at random moments; the container is always the last or next commit."""
    require_fuse()
    rng = random.Random(9)
    hdf5 = name.endswith(".mfh5")
    container = new_container(tmp_path / name, block_size=block_size, crc=not hdf5)
    scale = block_size // 512  # sizes and offsets in proportion to the block size
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = {}
    names = ["a", "b", "c", "sub/x", "sub/y"]
    outcomes = {"old": 0, "new": 0}
    for point in range(3 * points):  # (more kill points while none hit a commit in flight)
        m = Mount(container, mnt, options=["rw", "commit=3600"], log=tmp_path / "crash.log")
        delay = rng.uniform(0.0, 0.25)
        m.kill_after(delay)
        try:
            while True:
                name = rng.choice(names)
                expected = dict(state)
                path = mnt / name
                if name.startswith("sub/") and "sub/" not in expected:
                    os.mkdir(mnt / "sub")
                    expected["sub/"] = b""
                op = rng.random()
                if op < 0.6 or name not in expected:
                    offset = rng.randrange(0, 3000 * scale)
                    data = rng.randbytes(rng.randrange(1, 4000 * scale))
                    old = expected.get(name, b"").ljust(offset, b"\0")
                    expected[name] = old[:offset] + data + old[offset + len(data):]
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
                    os.pwrite(fd, data, offset)
                    os.close(fd)  # the last writer's close commits
                elif op < 0.8:
                    size = rng.randrange(0, 5000 * scale)
                    expected[name] = expected[name][:size].ljust(size, b"\0")
                    os.truncate(path, size)
                else:
                    del expected[name]
                    os.unlink(path)
                dirfd = os.open(mnt, os.O_RDONLY)
                try:
                    os.fsync(dirfd)  # commits what the operation left pending
                finally:
                    os.close(dirfd)
                state = expected
        except OSError:
            pass  # the daemon is gone
        m.reap_killed()
        left = open_container(container)  # (once: a MultiHDF5's open starts a probe process)
        got = snapshot(left)
        if got == state:
            outcomes["old"] += 1
        else:
            assert got == expected, f"kill point {point}: neither the last nor the next commit"
            outcomes["new"] += 1
            state = expected
        validate(container, left)
        if point + 1 >= points and (points < 20 or min(outcomes.values()) > 0):
            break
    print(container.name, outcomes)
    if points >= 20:  # the kills really hit commits in flight, and between them
        assert outcomes["new"] > 0 and outcomes["old"] > 0, outcomes
