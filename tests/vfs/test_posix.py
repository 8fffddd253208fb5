"""POSIX details on real mounts: link counts, ``.``/``..``, symbolic links, permissions."""

import errno
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from ..conftest import DATA, Mount

pytestmark = pytest.mark.fuse


def test_directory_link_counts(mount, tmp_path):
    source = tmp_path / "n.mf"
    shutil.copy(DATA / "mf2_nested.mf", source)
    m = mount(source, options=["rw"])
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["SUB", "table.dat"]
    assert os.stat(root).st_nlink == 3  # 2 + SUB
    os.listdir(root / "SUB")
    assert os.stat(root / "SUB").st_nlink == 2
    os.mkdir(root / "SUB" / "DEEPER")
    os.listdir(root / "SUB")
    assert os.stat(root / "SUB").st_nlink == 3
    found = subprocess.run(["find", str(root), "-type", "f"], capture_output=True, text=True,
                           check=True, timeout=30).stdout.split()
    assert sorted(os.path.relpath(p, root) for p in found) == ["SUB/x", "SUB/y", "table.dat"]


def test_unlinked_open_file_has_no_links(mount, tmp_path):
    source = tmp_path / "n.mf"
    shutil.copy(DATA / "mf2_nested.mf", source)
    root = mount(source, options=["rw"]).mountpoint
    fd = os.open(root / "SUB" / "x", os.O_RDWR)
    try:
        assert os.fstat(fd).st_nlink == 1
        os.unlink(root / "SUB" / "x")
        assert os.fstat(fd).st_nlink == 0  # POSIX: unlinked but still open
        os.ftruncate(fd, 100)  # the daemon's attributes replace the kernel's
        assert os.fstat(fd).st_nlink == 0
        assert len(os.pread(fd, 200, 0)) == 100
    finally:
        os.close(fd)


def test_readdir_lists_dot_and_dotdot(mount):
    m = mount(DATA / "mf2_nested.mf")
    listing = subprocess.run(["ls", "-ai1", str(m.mountpoint / "SUB")], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    inodes = dict(reversed(line.split()) for line in listing if line)
    assert set(inodes) == {".", "..", "x", "y"}
    assert int(inodes["."]) == os.stat(m.mountpoint / "SUB").st_ino
    assert int(inodes[".."]) == os.stat(m.mountpoint).st_ino


@pytest.fixture
def tree_with_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not part of the tree")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("in the tree")
    links = {"passwd": "/etc/passwd", "outdir": str(outside), "rel": "sub/f",
             "dangling": "no/such/file", "linked.mf": str(DATA / "mf2_basic.mf")}
    for name, target in links.items():
        os.symlink(target, src / name)
    return src, links


def test_symlinks_in_a_directory_source_are_links_never_followed(mount, tmp_path,
                                                                 tree_with_links):
    src, links = tree_with_links
    m = mount(src)
    root = m.mountpoint
    assert sorted(os.listdir(root)) == sorted([*links, "sub"])
    for name, target in links.items():
        st = os.lstat(root / name)
        assert stat.S_ISLNK(st.st_mode), name
        assert st.st_size == len(os.fsencode(target))
        assert os.readlink(root / name) == target
    long = subprocess.run(["ls", "-l", str(root)], capture_output=True, text=True,
                          check=True).stdout
    assert "passwd -> /etc/passwd" in long and "rel -> sub/f" in long
    assert (root / "rel").read_text() == "in the tree"  # resolved by the kernel, in the mount
    with pytest.raises(FileNotFoundError):
        (root / "dangling").read_text()
    with pytest.raises(OSError) as exc:
        os.open(root / "passwd", os.O_RDONLY | os.O_NOFOLLOW)
    assert exc.value.errno == errno.ELOOP

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(root), str(copy)], check=True, timeout=30)
    assert {n: os.readlink(copy / n) for n in links} == links
    assert (copy / "sub" / "f").read_text() == "in the tree"

    found = subprocess.run(["find", "-L", str(root)], capture_output=True, text=True,
                           timeout=30)
    assert str(root / "sub" / "f") in found.stdout and "Traceback" not in m.log_text()


def test_creating_links_and_special_files_is_refused(mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    m = mount(src, options=["rw"])
    attempts = {"symlink": lambda: os.symlink("f", m.mountpoint / "l"),
                "link": lambda: os.link(m.mountpoint / "f", m.mountpoint / "h"),
                "fifo": lambda: os.mkfifo(m.mountpoint / "p")}
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno in (errno.ENOSYS, errno.EPERM), what
    assert sorted(os.listdir(src)) == ["f"]


def run_as_nobody(*cmd):
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("options,refused", [(["rw", "allow_other"], True),
                                             (["rw", "allow_other", "no_default_permissions"],
                                              False)])
def test_allow_other_checks_permissions(tmp_path, options, refused):
    # A place every user can reach (pytest's tmp_path is private to root).
    public = tempfile.mkdtemp(prefix="ctdsfs-allow-other-", dir="/tmp")
    try:
        os.chmod(public, 0o755)
        source = os.path.join(public, "data.mf")
        shutil.copy(DATA / "mf2_basic.mf", source)
        os.chmod(source, 0o644)  # owner root: others may read, not write
        mnt = os.path.join(public, "mnt")
        os.mkdir(mnt)
        m = Mount(source, mnt, options, log=tmp_path / "m.log")
        try:
            target = os.path.join(mnt, "hello.txt")
            read = run_as_nobody("cat", target)
            assert (read.returncode, read.stdout) == (0, "hello")
            write = run_as_nobody("sh", "-c", f"printf x >> {target}")
            assert (write.returncode != 0) == refused, write.stderr
            assert ("Permission denied" in write.stderr) == refused
        finally:
            m.close()
    finally:
        shutil.rmtree(public)
