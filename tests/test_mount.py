"""Real FUSE mounts: byte-exact reads, EIO on bad blocks, mount(8) conventions, clean exits."""

import errno
import filecmp
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import (
    DATA,
    Mount,
    evicted,
    is_mounted,
    make_casacore_table,
    pattern,
    run_tomf,
    unmount,
)
from .formats.multifile.test_multifile import build_v2

pytestmark = pytest.mark.fuse

FIXTURE_TREES = {
    "mf2_basic.mf": {"empty.bin": b"", "data10000.bin": pattern(10000, 7, 3),
                     "hello.txt": b"hello"},
    "mf2_crc.mf": {"f1": pattern(20000, 13, 5, 251), "f2": b"\xab" * 4096},
    "mf2_free.mf": {"a": pattern(5000, 3, 1), "c": pattern(4096, 11, 7)},
    "mf2_nested.mf": {"table.dat": pattern(300, 3, 11), "SUB/x": pattern(5000, 17, 1),
                      "SUB/y": b"0123456789"},
    "mf2_bighdr.mf": {f"file_{k:03d}": bytes((k * 17 + j * 3) % 256 for j in
                                             range(800 if k in (0, 15, 30, 45, 59) else 700))
                      for k in range(60)},
}


def tree(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def random_reads(path, expected, count=300, seed=0):
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(count):
            off = rng.randrange(0, len(expected) + 10)
            size = rng.randrange(1, 70_000)
            assert os.pread(fd, size, off) == expected[off:off + size]
    finally:
        os.close(fd)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_TREES))
def test_fixture_copies_byte_exact(mount, tmp_path, fixture):
    m = mount(DATA / fixture)
    shutil.copytree(m.mountpoint, tmp_path / "copy")
    assert tree(tmp_path / "copy") == FIXTURE_TREES[fixture]
    for rel, content in FIXTURE_TREES[fixture].items():
        if content:
            random_reads(m.mountpoint / rel, content, count=50)


def test_v1_with_hdrext(mount):
    m = mount(DATA / "casacore_test_v1.mf")
    assert sorted(os.listdir(m.mountpoint)) == ["file0", "file2"]
    import numpy as np
    file2 = np.fromfile(m.mountpoint / "file2", "<i8")
    assert file2.tolist() == list(range(128, 256)) + list(range(640, 768)) + [0, 1]


@pytest.mark.tools
@pytest.mark.parametrize("block_size", [512, 65536])
def test_python_casacore_table_matches_twin(mount, tmp_path, block_size):
    packed = make_casacore_table(tmp_path / "mf.tab", block_size=block_size, rows=400)
    twin = make_casacore_table(tmp_path / "sep.tab", rows=400, multifile=False)
    m = mount(packed / "table.mf")
    names = sorted(os.listdir(m.mountpoint))
    assert any("_TSM" in n for n in names)
    shutil.copytree(m.mountpoint, tmp_path / "copy")
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "copy", twin, names, shallow=False)
    assert (mismatch, errors) == ([], []) and match == names
    for n in names:
        random_reads(m.mountpoint / n, (twin / n).read_bytes(), count=40)


@pytest.mark.tools
def test_tomf_v1_container(mount, tmp_path):
    rng = random.Random(2)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(60):
        (src / f"a_rather_long_storage_manager_name_{i:03d}").write_bytes(
            rng.randbytes(rng.randrange(0, 5000)))
    out = run_tomf(sorted(src.iterdir()), tmp_path / "legacy.mf", 512)
    assert (tmp_path / "legacy.mf_hdrext").exists()
    m = mount(out)
    shutil.copytree(m.mountpoint, tmp_path / "copy")
    assert tree(tmp_path / "copy") == tree(src)


def test_corrupted_block_gives_eio_and_one_log_line(mount, tmp_path):
    data = bytearray((DATA / "mf2_crc.mf").read_bytes())
    data[3 * 4096 + 100] ^= 0x40  # f1 block 2
    bad = tmp_path / "bad.mf"
    bad.write_bytes(data)
    m = mount(bad)
    good = pattern(20000, 13, 5, 251)
    fd = os.open(m.mountpoint / "f1", os.O_RDONLY)
    try:
        assert os.pread(fd, 8192, 0) == good[:8192]
        assert os.pread(fd, 4096, 16384) == good[16384:]
        with pytest.raises(OSError) as exc:
            os.pread(fd, 4096, 8192)
        assert exc.value.errno == errno.EIO
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        (m.mountpoint / "f1").read_bytes()
    assert (m.mountpoint / "f2").read_bytes() == b"\xab" * 4096
    lines = [line for line in m.log_text().splitlines() if "CRC" in line]
    assert len(lines) == 1, lines  # once per block and mount, whatever the kernel retries
    assert f"{bad}: f1: block 2 (container block 3) fails its CRC check" in lines[0]

    m2 = mount(bad, options=["nocrc"])
    assert (m2.mountpoint / "f1").read_bytes()[8192 + 100] == good[8192 + 100] ^ 0x40


def test_bad_block_in_a_nested_container_is_logged_with_its_path(mount, tmp_path):
    from ctdsfs.formats import create_container

    content = random.Random(7).randbytes(4 * 512)
    bad = tmp_path / "data.mf"
    c = create_container(bad, block_size=512, use_crc=True)
    sub = c.make_nested("SUBTABLE")
    sub.create("table.f0")
    sub.write("table.f0", 0, content)
    c.close()
    data = bytearray(bad.read_bytes())
    data[data.find(content[1024:1536]) + 9] ^= 1  # table.f0's third block
    bad.write_bytes(data)
    m = mount(bad)
    for _ in range(3):
        with pytest.raises(OSError) as exc:
            (m.mountpoint / "SUBTABLE" / "table.f0").read_bytes()
        assert exc.value.errno == errno.EIO
    lines = [line for line in m.log_text().splitlines() if "CRC" in line]
    assert len(lines) == 1 and f"{bad}: SUBTABLE/table.f0: block " in lines[0], lines


def run_cli(*args, timeout=60):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result, text):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert text in result.stderr


def test_mount_errors_are_one_line(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    junk = tmp_path / "junk.mf"
    junk.write_text("not a container\n")
    assert_one_line_error(run_cli("mount.ctdsfs", str(junk), str(mnt)), "not a container ctdsfs knows")
    assert_one_line_error(run_cli("mount.ctdsfs", str(tmp_path / "nope.mf"), str(mnt)),
                          "No such file")
    assert_one_line_error(run_cli("mount.ctdsfs", str(DATA / "mf2_basic.mf"),
                                  str(tmp_path / "missing")), "mount point does not exist")
    assert_one_line_error(run_cli("mount.ctdsfs", str(DATA / "mf2_basic.mf"), str(junk)),
                          "not a directory")
    assert_one_line_error(run_cli("mount.ctdsfs", "-o", "bogus", str(DATA / "mf2_basic.mf"),
                                  str(mnt)), "unknown mount option 'bogus'")
    bad = bytearray((DATA / "mf2_crc.mf").read_bytes())
    bad[115] ^= 1
    (tmp_path / "badhdr.mf").write_bytes(bad)
    assert_one_line_error(run_cli("mount.ctdsfs", str(tmp_path / "badhdr.mf"), str(mnt)),
                          "header CRC mismatch")
    assert not is_mounted(mnt)


@pytest.mark.parametrize("foreground", [True, False])
def test_a_mount_the_kernel_refuses_is_one_line(tmp_path, foreground):
    """No usable /dev/fuse (as in a container without the device): pyfuse3 says only
    "fuse_session_mount failed" and libfuse prints its reason on stderr; both make one line."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = (f"mount --bind /dev/null /dev/fuse && exec mount.ctdsfs {'-f' if foreground else ''} "
           f"{DATA / 'mf2_basic.mf'} {mnt}")
    result = run_cli("unshare", "-m", "sh", "-c", cmd)  # /dev/fuse hidden in a namespace only
    assert_one_line_error(result, "the kernel refused the mount (fuse: mount failed: Invalid "
                                  "argument)")
    assert not is_mounted(mnt)


def test_mount_point_in_use(mount, tmp_path):
    m = mount(DATA / "mf2_basic.mf")
    result = run_cli("mount.ctdsfs", str(DATA / "mf2_crc.mf"), str(m.mountpoint))
    assert_one_line_error(result, "already in use")
    assert sorted(os.listdir(m.mountpoint)) == ["data10000.bin", "empty.bin", "hello.txt"]


def test_daemon_returns_once_live_and_exits_on_unmount(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run_cli("mount.ctdsfs", str(DATA / "mf2_nested.mf"), str(mnt))
        assert result.returncode == 0, result.stderr
        assert is_mounted(mnt)  # live the moment the command returned
        assert (mnt / "SUB" / "y").read_bytes() == b"0123456789"
        assert subprocess.run(["fusermount3", "-u", str(mnt)]).returncode == 0
    finally:
        unmount(mnt)
    assert not is_mounted(mnt)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(mount, signum):
    m = mount(DATA / "mf2_basic.mf")
    assert (m.mountpoint / "hello.txt").read_bytes() == b"hello"
    m.proc.send_signal(signum)
    assert m.proc.wait(timeout=20) == 0
    assert not is_mounted(m.mountpoint)
    assert "received: unmounting" in m.log_text()


def test_mount_t_fuse_ctdsfs_and_fstab(tmp_path):
    assert os.path.exists("/sbin/mount.fuse.ctdsfs"), \
        "mount helper link not installed: run scripts/setup.sh"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    source = str(DATA / "mf2_basic.mf")
    try:
        result = run_cli("mount", "-t", "fuse.ctdsfs", "-o", "ro,nosuid", source, str(mnt))
        assert result.returncode == 0, result.stderr
        assert (mnt / "hello.txt").read_bytes() == b"hello"
        assert run_cli("umount", str(mnt)).returncode == 0
        assert not is_mounted(mnt)

        fstab = tmp_path / "fstab"
        fstab.write_text(f"{source} {mnt} fuse.ctdsfs ro,noauto,nofail,x-test=1 0 0\n")
        result = run_cli("mount", "-T", str(fstab), str(mnt))
        assert result.returncode == 0, result.stderr
        assert (mnt / "data10000.bin").read_bytes() == pattern(10000, 7, 3)
    finally:
        unmount(mnt)


def test_hostile_names_cannot_escape(mount, tmp_path):
    files = [("ok", b"1"), ("..", b"2"), ("../escape", b"3"), ("a\0b", b"4"), (".", b"5"),
             ("ok", b"dup"), ("caf\udcc3", b"raw")]
    m = mount(build_v2(tmp_path / "hostile.mf", files, block_size=1024))
    assert sorted(os.listdir(os.fsencode(m.mountpoint))) == [b"caf\xc3", b"ok"]
    assert (m.mountpoint / "ok").read_bytes() == b"1"
    assert "hidden" in m.log_text()
    assert not (tmp_path / "escape").exists()


def test_statfs_and_stat(mount):
    m = mount(DATA / "mf2_free.mf")
    st = os.statvfs(m.mountpoint)
    assert (st.f_bsize, st.f_blocks, st.f_bfree) == (4096, 7, 3)
    a = os.stat(m.mountpoint / "a")
    assert a.st_size == 5000 and a.st_blocks == 16 and a.st_mode & 0o222 == 0
    with pytest.raises(OSError) as exc:
        open(m.mountpoint / "a", "r+b")
    assert exc.value.errno == errno.EROFS


def test_only_a_source_on_a_local_disk_is_read_on_the_loop(mount, tmp_path):
    """A read of a network filesystem (or another FUSE mount) may stall for minutes:
    only a source on a local filesystem has lone reads answered on the mount's loop."""
    from ctdsfs.mount import on_local_disk

    assert on_local_disk(tmp_path)  # (the tests' own disk)
    m = mount(DATA / "mf2_free.mf")
    assert on_local_disk(tmp_path / "a file not made yet")
    assert not on_local_disk(m.mountpoint / "a")  # fuse.ctdsfs
    assert not on_local_disk(tmp_path)  # a directory source holding it
    assert not on_local_disk("/proc/self/status")


def _read_in_parallel(path, readers):
    """Each of ``readers`` threads reads its share of ``path`` in 1 MiB reads, all
    starting at once."""
    size = path.stat().st_size
    start = threading.Barrier(readers)

    def read_share(part):
        fd = os.open(path, os.O_RDONLY)
        at, end = size * part // readers, size * (part + 1) // readers
        start.wait()
        while at < end:
            at += len(os.pread(fd, min(1 << 20, end - at), at))
        os.close(fd)
    threads = [threading.Thread(target=read_share, args=(i,)) for i in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_parallel_readers_of_a_decoded_view_are_answered_on_the_loop(mount, tmp_path):
    """A local mount of a format decoded from chunks (a bcolz rootdir here) answers the
    reads of several readers at once on its loop: no read goes to one of trio's worker
    threads (which stay, idle, for a while after their last call: named "Trio thread N",
    or after the function they run), whose hops cost the mount more CPU than they saved;
    the decoders' own threads work ahead as before."""
    import bcolz
    import numpy as np

    values = np.sin(np.arange(8 << 20) / 1000)
    bcolz.carray(values, rootdir=str(tmp_path / "carr"), mode="w").flush()
    m = mount(tmp_path / "carr")
    for chunk in (tmp_path / "carr" / "data").iterdir():
        evicted(chunk)  # (reads wait for the disk: chunks not decoded ahead yet)
    _read_in_parallel(m.mountpoint / "array.npy", 4)
    threads = [(task / "comm").read_text().strip()
               for task in Path(f"/proc/{m.proc.pid}/task").iterdir()]
    assert threads and not [name for name in threads
                            if name.startswith(("Trio thread", "read from"))], threads


def test_unknown_command_says_so(tmp_path):
    for args, text in [(["frobnicate"], "unknown command 'frobnicate' (see 'ctdsfs --help')"),
                       (["chek"], "unknown command 'chek' (did you mean 'check'?)"),
                       (["obs.mf"], "to mount it: ctdsfs mount obs.mf MOUNTPOINT")]:
        result = run_cli("ctdsfs", *args)
        assert_one_line_error(result, text)
        assert result.returncode == 2
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:  # 'ctdsfs SOURCE MOUNTPOINT -o ...', as mount.fuse3 runs it, still mounts
        result = run_cli("ctdsfs", str(DATA / "mf2_basic.mf"), str(mnt), "-o", "ro")
        assert result.returncode == 0, result.stderr
        assert (mnt / "hello.txt").read_bytes() == b"hello"
    finally:
        unmount(mnt)


def test_contradictory_options_are_refused(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    new = tmp_path / "new.mf"
    for options, text in [("ro,create", "'ro' and 'create' contradict each other"),
                          ("rw,ro", "'ro' and 'rw' contradict each other"),
                          ("nosuid,suid", "'suid' and 'nosuid' contradict each other"),
                          ("allow_other,default_permissions,no_default_permissions",
                           "'default_permissions' and 'no_default_permissions' contradict"),
                          ("ro,commit=10", "'ro' and 'commit' contradict each other"),
                          ("blocksize=4096", "'blocksize' means nothing without 'create'"),
                          ("rw,crc", "'crc' means nothing without 'create'"),
                          ("no_default_permissions",
                           "'no_default_permissions' means nothing without 'allow_other'")]:
        try:
            assert_one_line_error(run_cli("mount.ctdsfs", "-o", options, str(new), str(mnt)),
                                  text)
        finally:
            unmount(mnt)
    assert not new.exists()


def test_mount_point_must_be_empty_unless_nonempty(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "underneath").write_text("hidden by the mount")
    try:
        assert_one_line_error(run_cli("mount.ctdsfs", str(DATA / "mf2_basic.mf"), str(mnt)),
                              "mount point is not empty (-o nonempty mounts over its files)")
    finally:
        unmount(mnt)
    m = Mount(DATA / "mf2_basic.mf", mnt, ["nonempty"], log=tmp_path / "m.log")
    try:
        assert sorted(os.listdir(mnt)) == ["data10000.bin", "empty.bin", "hello.txt"]
    finally:
        m.close()
    assert (mnt / "underneath").read_text() == "hidden by the mount"


HEAVY_MODULES = ("numpy", "h5py", "tiledb", "blosc", "botocore", "boto3", "fsspec", "tqdm",
                 "obstore", "zstandard")
MODULE_LIST_AT_EXIT = """
import atexit, sys
out = sys.argv.pop()
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
from ctdsfs.cli import mount_main
sys.argv[0] = "mount.ctdsfs"
sys.exit(mount_main())
"""


@pytest.mark.parametrize("kind", ["multifile", "directory"])
def test_a_multifile_mount_imports_no_heavy_library(tmp_path, kind):
    """A mount of a plain MultiFile (or a directory holding one) and reading all of it
    import no numpy, h5py, tiledb, blosc, botocore, fsspec or tqdm: each costs every mount
    tenths of a second and megabytes (the daemon lists its modules as it exits). fastcrc
    is loaded only where a container has CRCs (the directory's ``crc.mf``)."""
    if kind == "multifile":
        source = DATA / "mf2_nested.mf"
    else:
        source = tmp_path / "tree"
        source.mkdir()
        shutil.copy(DATA / "mf2_crc.mf", source / "crc.mf")
        (source / "plain.txt").write_bytes(b"plain")
    mnt, modules = tmp_path / "mnt", tmp_path / "modules.txt"
    mnt.mkdir()
    # (one process: a mount's worker processes are forks of it, and import what it would)
    proc = subprocess.Popen([sys.executable, "-c", MODULE_LIST_AT_EXIT, "-f", str(source),
                             str(mnt), "-o", "workers=1", str(modules)])
    try:
        while not is_mounted(mnt):
            assert proc.poll() is None, "mount.ctdsfs exited before the mount was live"
            time.sleep(0.02)
        assert tree(mnt), "nothing read through the mount"
    finally:
        unmount(mnt)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    loaded = modules.read_text().split()
    assert "pyfuse3" in loaded and "ctdsfs.formats.multifile.container" in loaded
    assert [m for m in loaded if m.split(".")[0] in HEAVY_MODULES] == []
    assert ("fastcrc" in loaded) == (kind == "directory")
