"""Read-write mounts: real programs write, casacore reads back (crashes:
``test_mount_rw_kill``)."""

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from ctdsfs.formats import open_container

from .conftest import SCRIPTS, make_casacore_table, unmount
from .formats.multifile.test_write import check_crcs, snapshot, snapshot_file

pytestmark = pytest.mark.fuse


def new_container(path, block_size=4096, crc=False):
    cmd = ["ctdsfs", "new", str(path), "--block-size", str(block_size)] + (["--crc"] if crc else [])
    subprocess.run(cmd, check=True)
    return path


def dump_table(path, home):
    out = subprocess.run([sys.executable, str(SCRIPTS / "make_sample_table.py"), "--dump",
                          str(path)], check=True, capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)))
    return json.loads(out.stdout)


def validate(path, opened=None):
    """Strict consistency: no hidden entries, blocks used once, free list disjoint, CRCs right.

    For MultiHDF5: no hidden entries and every file's dataset as casacore sizes it.
    ``opened``: the container at ``path`` already open (closed here).
    """
    def walk(c):
        assert c.problems == []
        if c.format_name == "MultiHDF5":
            for n in c.names():
                rows = c._data(c._entry(n)).shape[0]
                blocks = c.entry_blocks(n)
                assert rows in ((blocks + 1) if blocks else 0, blocks)
        else:
            used = [b for n in c.names() for b in list(c._entry(n).blocks)]
            free = c.header.free_blocks.tolist()
            cont = [b for s in c.header.cont_sets for b in s.tolist()]
            everything = used + free + cont
            assert len(everything) == len(set(everything)), "a block is claimed twice"
            assert all(0 < b < c.header.nblocks for b in everything)
        for n in c.names():
            if c.nested(n) is not None:
                walk(c.nested(n))
    c = opened or open_container(path)
    walk(c)
    if c.format_name == "MultiFile" and c.header.use_crc:
        check_crcs(path)
    c.close()


@pytest.mark.tools
@pytest.mark.parametrize("crc", [False, True])
def test_python_casacore_writes_a_table_inside_a_mount(mount, tmp_path, crc):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".casarc").write_text("\n")
    container = new_container(tmp_path / "ms.mf", block_size=4096, crc=crc)
    m = mount(container, options=["rw"])
    subprocess.run([sys.executable, str(SCRIPTS / "make_sample_table.py"),
                    str(m.mountpoint / "obs.tab"), "300"], check=True,
                   env=dict(os.environ, HOME=str(home)))
    assert m.close() == 0
    reference = make_casacore_table(tmp_path / "ref.tab", rows=300, multifile=False)
    validate(container)
    info = subprocess.run(["ctdsfs", "info", "--json", str(container)], check=True,
                          capture_output=True, text=True)
    assert json.loads(info.stdout)["files"][0] == {
        "name": "obs.tab", "size": json.loads(info.stdout)["files"][0]["size"], "nested": True,
        "blocks": json.loads(info.stdout)["files"][0]["blocks"]}
    again = mount(container)
    assert sorted(os.listdir(again.mountpoint / "obs.tab" / "ANTENNA")) == sorted(
        os.listdir(reference / "ANTENNA"))
    assert dump_table(again.mountpoint / "obs.tab", home) == dump_table(reference, home)


@pytest.mark.tools
@pytest.mark.parametrize("crc", [False, True])
def test_containers_ctdsfs_writes_are_read_by_casacore(mount, tmp_path, crc):
    home = tmp_path / "home"
    home.mkdir()
    table = make_casacore_table(tmp_path / "orig.tab", block_size=4096, rows=200)
    expected = dump_table(table, home)
    original = mount(table / "table.mf")
    copy = new_container(tmp_path / "copy.mf", block_size=4096, crc=crc)
    target = mount(copy, options=["rw"])
    for name in os.listdir(original.mountpoint):
        shutil.copyfile(original.mountpoint / name, target.mountpoint / name)
    assert target.close() == 0
    original.close()
    os.replace(copy, table / "table.mf")
    assert dump_table(table, home) == expected  # casacore checks the CRCs we wrote
    if crc:
        data = bytearray((table / "table.mf").read_bytes())
        data[4096 + 10] ^= 0xFF  # casacore must notice a corrupted block
        (table / "table.mf").write_bytes(data)
        with pytest.raises(subprocess.CalledProcessError):
            dump_table(table, home)


@pytest.mark.parametrize("name", ["p.mf", "p.mfh5"])
def test_posix_write_semantics(mount, tmp_path, name):
    container = new_container(tmp_path / name, block_size=512)
    m = mount(container, options=["rw"])
    root = m.mountpoint
    (root / "a").write_bytes(b"hello")
    with open(root / "a", "ab") as f:
        f.write(b" world")
    assert (root / "a").read_bytes() == b"hello world"
    with open(root / "a", "r+b") as f:
        f.seek(2000)
        f.write(b"!")
    assert (root / "a").read_bytes() == b"hello world" + bytes(2000 - 11) + b"!"
    os.truncate(root / "a", 3)
    assert (root / "a").read_bytes() == b"hel"
    os.truncate(root / "a", 700)
    assert (root / "a").read_bytes() == b"hel" + bytes(697)
    with open(root / "a", "wb") as f:  # O_TRUNC
        f.write(b"new")
    assert (root / "a").read_bytes() == b"new"

    f = open(root / "a", "r+b")  # unlinked while open: still readable and writable
    os.unlink(root / "a")
    assert not (root / "a").exists()
    f.write(b"NEW")
    f.seek(0)
    assert f.read() == b"NEW"
    f.close()

    os.mkdir(root / "d")
    (root / "d" / "x").write_bytes(b"x" * 3000)
    with pytest.raises(OSError) as exc:
        os.rmdir(root / "d")
    assert exc.value.errno == errno.ENOTEMPTY
    (root / "b").write_bytes(b"b")
    os.rename(root / "b", root / "d" / "x")  # across containers, replacing
    assert (root / "d" / "x").read_bytes() == b"b" and not (root / "b").exists()
    os.mkdir(root / "e")
    with pytest.raises(OSError) as exc:
        os.rename(root / "e", root / "d" / "e")
    assert exc.value.errno == errno.EXDEV
    shutil.move(str(root / "e"), str(root / "d" / "e"))  # mv copies instead
    assert os.path.isdir(root / "d" / "e")
    os.rename(root / "d", root / "D")
    assert (root / "D" / "x").read_bytes() == b"b"
    os.chmod(root / "D" / "x", 0o600)  # accepted, nothing stored
    os.utime(root / "D" / "x", (0, 0))
    st = os.statvfs(root)
    assert st.f_bsize == 512 and st.f_bavail > 0
    assert m.close() == 0
    validate(container)
    r = open_container(container)
    assert snapshot(r) == {"D/": b"", "D/x": b"b", "D/e/": b""}


def test_sizes_past_the_disk_or_the_format_through_a_mount(mount, tmp_path):
    """truncate -s / a write far out: ENOSPC or EFBIG, the file unchanged, the mount writable."""
    container = new_container(tmp_path / "s.mf", block_size=4096)
    m = mount(container, options=["rw"])
    f = m.mountpoint / "f"
    f.write_bytes(b"data")
    for size, code in ((999999999999999, errno.ENOSPC), ((1 << 63) - 1, errno.EFBIG)):
        with pytest.raises(OSError) as exc:
            os.truncate(f, size)
        assert exc.value.errno == code
        assert os.path.getsize(f) == 4 and f.read_bytes() == b"data"
    with pytest.raises(OSError) as exc:
        with open(f, "r+b") as out:
            out.seek(999999999999999)
            out.write(b"!")
            out.flush()
            os.fsync(out.fileno())
    assert exc.value.errno == errno.ENOSPC
    (m.mountpoint / "g").write_bytes(b"more")
    assert m.close() == 0
    validate(container)
    assert snapshot_file(container) == {"f": b"data", "g": b"more"}


@pytest.mark.parametrize("name", ["full.mf", "full.mfh5"])
def test_full_disk_through_a_mount(mount, small_disk, name):
    """A full disk: ENOSPC (not EIO), committed files intact, rm frees space, writes go on."""
    container = new_container(small_disk / name, block_size=4096)
    m = mount(container, options=["rw"])
    root = m.mountpoint
    kept = os.urandom(300000)
    (root / "kept").write_bytes(kept)
    chunk = os.urandom(1 << 20)
    with pytest.raises(OSError) as exc:
        with open(root / "filler", "wb") as out:
            for _ in range(16):  # 16 MiB cannot fit on 8 MiB
                out.write(chunk)
                out.flush()
            os.fsync(out.fileno())
    assert exc.value.errno == errno.ENOSPC
    assert (root / "kept").read_bytes() == kept
    os.unlink(root / "filler")
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)  # commits: the file gives the space back
    finally:
        os.close(fd)
    if name.endswith(".mf"):
        assert os.path.getsize(container) < 400000
        after = os.urandom(4 << 20)
    else:  # HDF5 keeps the freed space inside the file; reusing it goes through the journal
        after = os.urandom(256 << 10)
    (root / "after").write_bytes(after)
    assert (root / "after").read_bytes() == after
    assert "Traceback" not in m.log_text() and "read-only" not in m.log_text()
    assert m.close() == 0
    validate(container)
    assert snapshot_file(container) == {"kept": kept, "after": after}


@pytest.mark.parametrize("name", ["l.mf", "l.mfh5"])
def test_second_read_write_mount_is_refused(mount, tmp_path, name):
    container = new_container(tmp_path / name)
    mount(container, options=["rw"])
    other = tmp_path / "other"
    other.mkdir()
    result = subprocess.run(["mount.ctdsfs", "-o", "rw", str(container), str(other)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "another writer" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_create_option_and_daemon_commit_on_unmount(tmp_path):
    container = tmp_path / "made.mf"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mount.ctdsfs", "-o", "create,blocksize=1024,crc,commit=3600",
                        str(container), str(mnt)], check=True)
        (mnt / "f").write_bytes(b"f" * 5000)
        os.mkdir(mnt / "sub")
        (mnt / "sub" / "g").write_bytes(b"g")
    finally:
        unmount(mnt)
    deadline = time.monotonic() + 20
    while True:  # the daemon commits after the unmount, then exits
        try:
            state = snapshot_file(container)
            if state.get("sub/g") == b"g":
                break
        except Exception:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert state == {"f": b"f" * 5000, "sub/": b"", "sub/g": b"g"}
    c = open_container(container)
    assert c.block_size == 1024 and c.header.use_crc


def bump_header_counter(container, value):
    """What another writer's commit looks like to us: the header counter moves on."""
    with open(container, "r+b") as f:
        f.seek(16)
        f.write(value.to_bytes(8, "big"))


def test_change_under_a_read_write_mount(mount, tmp_path):
    container = new_container(tmp_path / "x.mf")
    m = mount(container, options=["rw"])
    (m.mountpoint / "f").write_bytes(b"one")
    bump_header_counter(container, 1000)  # nothing pending here: the mount reloads
    (m.mountpoint / "g").write_bytes(b"two")
    assert open_container(container).header.counter > 1000
    held = open(m.mountpoint / "f", "r+b")
    held.write(b"ONE")
    held.flush()  # pending, not committed: the other writer's change now conflicts
    bump_header_counter(container, 5000)
    with pytest.raises(OSError):
        held.close()  # the last writer's close commits, and that fails
    with pytest.raises(OSError) as exc:
        (m.mountpoint / "h").write_bytes(b"three")
    assert exc.value.errno == errno.EROFS
    assert "switched to read-only" in m.log_text()
    assert snapshot_file(container) == {"f": b"one", "g": b"two"}


def random_tree_ops(rng, roots, steps):
    """The same random operations on every root (mount and shadow directory)."""
    names = [f"f{i}" for i in range(6)]
    dirs = ["", "s1/", "s1/s2/"]
    for root in roots:
        for d in dirs[1:]:
            os.makedirs(os.path.join(root, d), exist_ok=True)
    for _ in range(steps):
        d = rng.choice(dirs)
        name = d + rng.choice(names)
        op = rng.random()
        offset = rng.randrange(0, 20000)
        data = rng.randbytes(rng.randrange(0, 9000))
        size = rng.randrange(0, 25000)
        other = rng.choice(dirs) + rng.choice(names)
        for root in roots:
            path = os.path.join(root, name)
            if op < 0.4:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT)
                os.pwrite(fd, data, offset)
                os.close(fd)
            elif not os.path.exists(path):
                continue
            elif op < 0.55:
                os.truncate(path, size)
            elif op < 0.65:
                os.unlink(path)
            elif op < 0.8:
                os.rename(path, os.path.join(root, other))
            else:
                with open(path, "rb") as f:
                    f.seek(offset)
                    f.read(len(data))


def tree(root):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.join(rel, f)] = fh.read()
        for d in dirs:
            out[os.path.join(rel, d) + "/"] = b""
    return out


@pytest.mark.parametrize("name,crc", [("r.mf", False), ("r.mf", True), ("r.mfh5", False)])
def test_random_operations_match_a_shadow_directory(mount, tmp_path, name, crc):
    rng = random.Random(100 + crc)
    container = new_container(tmp_path / name, block_size=1024, crc=crc)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    m = mount(container, options=["rw", "commit=1"])
    for _ in range(10):
        random_tree_ops(rng, [str(m.mountpoint), str(shadow)], 150)
        assert tree(m.mountpoint) == tree(shadow)
    assert m.close() == 0
    validate(container)
    again = mount(container)
    assert tree(again.mountpoint) == tree(shadow)


@pytest.mark.parametrize("fmt", ["mf2", "hdf5"])
def test_read_only_mount_follows_another_writer(mount, tmp_path, fmt):
    from ctdsfs.formats import create_container
    container = tmp_path / "live.container"
    writer = create_container(container, format=fmt, block_size=1024)
    writer.create("data")
    writer.write("data", 0, b"a" * 5000)
    writer.commit()
    m = mount(container)
    assert (m.mountpoint / "data").read_bytes() == b"a" * 5000  # now in the page cache
    writer.write("data", 0, b"b" * 5000)
    writer.create("new")
    writer.commit()
    assert sorted(os.listdir(m.mountpoint)) == ["data", "new"]
    assert (m.mountpoint / "data").read_bytes() == b"b" * 5000
    writer.close()
