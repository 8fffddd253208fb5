"""POSIX semantics of ContainerFS, without FUSE."""

import errno
import os
import stat

import pytest

from ctdsfs.formats import create_container, open_container
from ctdsfs.vfs import ROOT_INO, ContainerFS, FSError, filesystem

from ..conftest import DATA, pattern


@pytest.fixture
def nested_fs():
    path = DATA / "mf2_nested.mf"
    return ContainerFS(open_container(path), path)


def listing(fs, ino):
    """The entries of directory ``ino`` (without ``.`` and ``..``)."""
    return [(name, attr) for name, attr, _ in fs.readdir(fs.opendir(ino))
            if name not in (".", "..")]


def test_tree_and_attributes(nested_fs):
    fs = nested_fs
    top = dict(listing(fs, ROOT_INO))
    assert set(top) == {"table.dat", "SUB"}
    assert stat.S_ISREG(top["table.dat"].mode) and top["table.dat"].size == 300
    assert stat.S_ISDIR(top["SUB"].mode)
    sub = dict(listing(fs, top["SUB"].ino))
    assert {n: a.size for n, a in sub.items()} == {"x": 5000, "y": 10}
    x = sub["x"]
    assert x.blksize == 4096 and x.blocks == 2 * 4096 // 512
    assert x.mode & 0o222 == 0  # read-only mount: no write bits
    st = os.stat(DATA / "mf2_nested.mf")
    assert (x.uid, x.gid, x.mtime_ns) == (st.st_uid, st.st_gid, st.st_mtime_ns)


def test_inodes_are_stable_and_unique(nested_fs):
    fs = nested_fs
    first = {n: a.ino for n, a in listing(fs, ROOT_INO)}
    again = {n: fs.lookup(ROOT_INO, n).ino for n in first}
    assert first == again
    sub_ino = first["SUB"]
    inos = [a.ino for _, a in listing(fs, sub_ino)] + list(first.values()) + [ROOT_INO]
    assert len(set(inos)) == len(inos)
    assert fs.lookup(sub_ino, "..").ino == ROOT_INO
    assert fs.lookup(sub_ino, ".").ino == sub_ino


def test_listing_attributes_are_those_of_lookup(nested_fs):
    """A listing builds a file's attributes in bulk: they must be exactly lookup's."""
    fs = nested_fs
    for parent in (ROOT_INO, fs.lookup(ROOT_INO, "SUB").ino):
        entries = listing(fs, parent)
        assert entries and all(attr == fs.lookup(parent, name) for name, attr in entries)


def test_readdir_resumes_at_offset(nested_fs):
    entries = list(nested_fs.readdir(ROOT_INO, 0))
    assert [e[0] for e in nested_fs.readdir(ROOT_INO, entries[2][2])] == [entries[3][0]]


def test_readdir_builds_only_the_batch_asked_for(nested_fs, monkeypatch):
    """The kernel reads a listing in small batches: each builds attributes for its own
    entries only, so a listing costs its length, not its square."""
    whole = nested_fs.readdir(ROOT_INO)
    built = []
    listed_attrs = nested_fs._listed_attrs
    monkeypatch.setattr(nested_fs, "_listed_attrs", lambda directory, nodes, *given:
                        built.extend(nodes) or listed_attrs(directory, nodes, *given))
    batches, start = [], 0
    while batch := nested_fs.readdir(ROOT_INO, start, 2):
        batches.append([name for name, _, _ in batch])
        start = batch[-1][2]
    assert sum(batches, []) == [name for name, _, _ in whole]
    assert all(len(b) <= 2 for b in batches)
    assert [node.key for node in built] == [name for name, _, _ in whole[2:]]


def test_readdir_lists_dot_entries_and_counts_subdirectories(nested_fs, monkeypatch):
    fs = nested_fs
    assert fs.getattr(ROOT_INO).nlink == 3  # 2 + SUB, from the first stat on
    monkeypatch.setattr(filesystem, "CLASSIFY_MAX", 1)
    fs._subdirs.clear()
    assert fs.getattr(ROOT_INO).nlink == 1  # too large to classify for a stat: "unknown"
    entries = {name: attr for name, attr, _ in fs.readdir(ROOT_INO)}
    assert list(entries)[:2] == [".", ".."]
    sub = entries["SUB"].ino
    assert entries["."].ino == entries[".."].ino == ROOT_INO
    assert entries["."].nlink == fs.getattr(ROOT_INO).nlink == 3  # 2 + SUB
    assert entries["table.dat"].nlink == 1
    sub_entries = {name: attr for name, attr, _ in fs.readdir(sub)}
    assert (sub_entries["."].ino, sub_entries[".."].ino) == (sub, ROOT_INO)
    assert fs.getattr(sub).nlink == 2  # no subdirectories


def test_open_read_release(nested_fs):
    fs = nested_fs
    sub = fs.lookup(ROOT_INO, "SUB").ino
    fh = fs.open(fs.lookup(sub, "x").ino, os.O_RDONLY)
    assert fs.read(fh, 4000, 200) == pattern(5000, 17, 1)[4000:4200]
    assert fs.read(fh, 4990, 100) == pattern(5000, 17, 1)[4990:]
    assert fs.read(fh, 6000, 100) == b""
    fs.release(fh)
    with pytest.raises(FSError) as exc:
        fs.read(fh, 0, 1)
    assert exc.value.errno == errno.EBADF


@pytest.mark.parametrize("op,code", [
    (lambda fs: fs.lookup(ROOT_INO, "missing"), errno.ENOENT),
    (lambda fs: fs.lookup(ROOT_INO, "n" * 300), errno.ENAMETOOLONG),
    (lambda fs: fs.getattr(999), errno.ENOENT),
    (lambda fs: fs.getattr(0), errno.ENOENT),
    (lambda fs: fs.getattr(1 << 63), errno.ENOENT),
    (lambda fs: fs.opendir(fs.lookup(ROOT_INO, "table.dat").ino), errno.ENOTDIR),
    (lambda fs: fs.lookup(fs.lookup(ROOT_INO, "table.dat").ino, "x"), errno.ENOTDIR),
    (lambda fs: fs.open(fs.lookup(ROOT_INO, "SUB").ino, os.O_RDONLY), errno.EISDIR),
    (lambda fs: fs.open(fs.lookup(ROOT_INO, "table.dat").ino, os.O_RDWR), errno.EROFS),
    (lambda fs: fs.open(fs.lookup(ROOT_INO, "table.dat").ino, os.O_WRONLY), errno.EROFS),
    (lambda fs: fs.open(fs.lookup(ROOT_INO, "table.dat").ino, os.O_RDONLY | os.O_TRUNC),
     errno.EROFS),
])
def test_errors(nested_fs, op, code):
    with pytest.raises(FSError) as exc:
        op(nested_fs)
    assert exc.value.errno == code


def test_bad_block_is_eio(tmp_path):
    data = bytearray((DATA / "mf2_crc.mf").read_bytes())
    data[2 * 4096] ^= 1
    p = tmp_path / "bad.mf"
    p.write_bytes(data)
    fs = ContainerFS(open_container(p), p)
    fh = fs.open(fs.lookup(ROOT_INO, "f1").ino, os.O_RDONLY)
    assert fs.read(fh, 0, 4096) == pattern(20000, 13, 5, 251)[:4096]
    with pytest.raises(FSError) as exc:
        fs.read(fh, 4096, 10)
    assert exc.value.errno == errno.EIO


def test_statfs_in_container_blocks():
    path = DATA / "mf2_free.mf"
    fs = ContainerFS(open_container(path), path)
    st = fs.statfs()
    assert (st["f_bsize"], st["f_blocks"], st["f_bfree"], st["f_bavail"]) == (4096, 7, 3, 0)
    assert st["f_namemax"] == 255


def test_reload_when_another_process_commits(tmp_path):
    from ctdsfs.formats import create_container
    path = tmp_path / "shared.mf"
    writer = create_container(path, block_size=256)
    writer.create("keep")
    writer.write("keep", 0, b"v1")
    writer.create("gone")
    writer.make_nested("SUB").create("x")
    writer.commit()
    fs = ContainerFS(open_container(path), path)
    keep = fs.lookup(ROOT_INO, "keep").ino
    sub = fs.lookup(ROOT_INO, "SUB").ino
    fs.lookup(sub, "x")
    fh = fs.open(keep, os.O_RDONLY)
    assert fs.may_keep_cache(fh) is False  # first open: nothing cached yet
    fs.release(fh)

    writer.write("keep", 0, b"v2")
    writer.remove("gone")
    writer.nested("SUB").create("y")
    writer.commit()

    assert [n for n, _ in listing(fs, ROOT_INO)] == ["keep", "SUB"]
    assert fs.lookup(ROOT_INO, "keep").ino == keep  # same inode after the reload
    fh = fs.open(keep, os.O_RDONLY)
    assert fs.may_keep_cache(fh) is False  # the kernel must drop pages of before
    assert fs.read(fh, 0, 10) == b"v2"
    assert sorted(n for n, _ in listing(fs, sub)) == ["x", "y"]
    with pytest.raises(FSError):
        fs.lookup(ROOT_INO, "gone")
    fs.release(fh)
    fh = fs.open(keep, os.O_RDONLY)
    assert fs.may_keep_cache(fh) is True  # unchanged since: keep the cache


def tree_with_nested(tmp_path, files):
    """A MultiFile with directory ``d`` of ``files`` small files, a subdirectory ``sub``,
    a file ``subtable`` holding a MultiFile, a stored ``copy.mf`` and a ``tiny`` file."""
    path = tmp_path / "tree.mf"
    c = create_container(path, block_size=1024)
    d = c.make_nested("d")
    for i in range(files):
        d.create(f"f{i}")
        d.write(f"f{i}", 0, pattern(200 + 50 * i, i + 1, i))
    d.make_nested("sub")
    for name in ("subtable", "copy.mf"):  # a real MultiFile's bytes; a .mf is a stored file
        d.create(name)
        d.write(name, 0, (DATA / "mf2_basic.mf").read_bytes())
    d.create("tiny")
    d.write("tiny", 0, b"\0" * 8)
    c.commit()
    c.close()
    return ContainerFS(open_container(path), path)


def test_listing_tells_nested_containers_in_a_few_reads(tmp_path):
    """A listing decides which of its files are nested containers by their first bytes:
    read in one pass in container order (a cold `find` waited on one read per file)."""
    files = 200
    fs = tree_with_nested(tmp_path, files)
    reads = []
    real_pread = fs.root.store.pread
    fs.root.store.pread = lambda offset, size: reads.append(size) or real_pread(offset, size)
    top = dict(listing(fs, ROOT_INO))
    kinds = {name: stat.S_ISDIR(attr.mode) for name, attr in listing(fs, top["d"].ino)}
    assert {name for name, is_dir in kinds.items() if is_dir} == {"sub", "subtable"}
    assert len(kinds) == files + 4
    # the headers of the three containers opened, and the first bytes of all files at once
    assert len(reads) <= 40, str(reads)  # one read per file before: 225


def test_requests_on_a_read_only_tree_do_not_walk_its_entries(tmp_path):
    """Each request asks whether the tree has pending changes (before reloading it):
    a tree opened read-only has none, and walking every nested entry per request made
    reading 20,000 files cost the square of their number."""
    fs = tree_with_nested(tmp_path, 50)
    walks = []

    class WalkCounting(dict):
        def values(self):
            walks.append(1)
            return super().values()

    top = dict(listing(fs, ROOT_INO))
    files = listing(fs, top["d"].ino)
    directory = fs.root.nested("d")
    directory._nested = WalkCounting(directory._nested)
    for name, attr in files:
        if not stat.S_ISDIR(attr.mode):
            fs.release(fs.open(attr.ino, os.O_RDONLY))
    assert walks == []
