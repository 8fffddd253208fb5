"""Say what you show: a container ctdsfs recognises but cannot show as promised (held by
another writer, encrypted, damaged) is refused in one line as the mount's source, and shown
raw and read-only inside a tree, with ``ctdsfs info`` saying why; nothing is lost."""

import errno
import os
import shutil
import subprocess

import bcolz
import numpy as np
import pytest
import tiledb

from ctdsfs.formats import open_container

from ..conftest import is_mounted, unmount

KEY = "0123456789abcdeF0123456789abcdeF"


def write_encrypted_array(uri):
    ctx = tiledb.Ctx(tiledb.Config({"sm.encryption_type": "AES_256_GCM",
                                    "sm.encryption_key": KEY}))
    dim = tiledb.Dim(name="d", domain=(0, 9), tile=10, dtype=np.int64)
    schema = tiledb.ArraySchema(domain=tiledb.Domain(dim),
                                attrs=[tiledb.Attr(name="a", dtype=np.float64)])
    tiledb.Array.create(str(uri), schema, ctx=ctx)
    with tiledb.open(str(uri), "w", ctx=ctx) as array:
        array[:] = np.arange(10.0)
    return uri


def write_rootdir(path, n=250):
    bcolz.carray(np.arange(n, dtype=np.float64), rootdir=str(path), mode="w",
                 chunklen=64).flush()
    return path


def mount_daemon(source, mountpoint, options=()):
    """``mount.ctdsfs`` as a user runs it (daemonizing): (exit status, stderr lines)."""
    mountpoint.mkdir(exist_ok=True)
    cmd = ["mount.ctdsfs", str(source), str(mountpoint)] + (["-o", ",".join(options)]
                                                            if options else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if is_mounted(mountpoint):  # (a failure of the code under test: clear it away)
        unmount(mountpoint)
    return done.returncode, done.stderr.splitlines()


def ctdsfs_info(path):
    done = subprocess.run(["ctdsfs", "info", str(path)], capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_second_rw_mount_of_a_rootdir_is_refused_and_nothing_is_lost(tmp_path, mount):
    root = write_rootdir(tmp_path / "r")
    first = mount(root, options=["rw"])
    status, lines = mount_daemon(root, tmp_path / "second", ["rw"])
    assert status == 1
    assert len(lines) == 1 and str(root) in lines[0] and "another writer" in lines[0], lines
    extra = np.arange(20.0) + 0.5
    with open(first.mountpoint / "array.npy", "ab") as f:
        f.write(extra.tobytes())
    assert sorted(os.listdir(root)) == ["__attrs__", "data", "meta"]  # nothing stray
    assert np.array_equal(bcolz.open(str(root))[:],
                          np.concatenate([np.arange(250.0), extra]))


def test_encrypted_tiledb_array_is_refused_in_one_line(tmp_path):
    array = write_encrypted_array(tmp_path / "enc")
    status, lines = mount_daemon(array, tmp_path / "mnt")
    assert status == 1
    assert len(lines) == 1 and str(array) in lines[0] and "encrypted" in lines[0], lines


def test_inside_a_tree_they_are_raw_read_only_and_info_says_why(tmp_path, mount):
    tree = tmp_path / "tree"
    tree.mkdir()
    root = write_rootdir(tree / "held")
    write_encrypted_array(tree / "enc")
    (tree / "bad.blp").write_bytes(b"blpk" + bytes(60))  # a bloscpack header that lies
    holder = open_container(root, writable=True)  # another writer (as a rw mount holds it)
    try:
        top = mount(tree, options=["rw"]).mountpoint
        # the held rootdir: its own files, read-only; the array shows raw, read-only
        assert sorted(os.listdir(top / "held")) == ["__attrs__", "data", "meta"]
        assert "__schema" in os.listdir(top / "enc")
        sizes = (root / "meta" / "sizes").read_bytes()
        for path in (top / "held" / "meta" / "sizes", top / "enc" / "__meta" / "x",
                     top / "bad.blp"):
            with pytest.raises(OSError) as caught:
                with open(path, "r+b" if path.exists() else "wb") as f:
                    f.write(b"x")
            assert caught.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM), path
        assert (root / "meta" / "sizes").read_bytes() == sizes
        assert (tree / "bad.blp").read_bytes() == b"blpk" + bytes(60)
        assert not (tree / "enc" / "__meta" / "x").exists()
        status, out, err = ctdsfs_info(tree)
        assert status == 0, err
        lines = out.splitlines()
        enc = next(line for line in lines if line.rstrip("/ ").split("  ")[-1] == "enc"
                   or " enc/" in line)
        assert "shown raw and read-only" in enc and "encrypted" in enc
        assert any("bad.blp" in line and "shown raw" in line for line in lines), out
        status, out, err = ctdsfs_info(root)  # the held rootdir: info names its writer
        assert status == 0 and "another writer holds" in out, out + err
    finally:
        holder.close()


def test_a_container_file_copied_into_a_rw_tree_is_written(tmp_path, mount):
    """A file that is no container yet (an empty ``.blp`` being copied in) stays a plain
    writable file: only a recognised container that fails to open is read-only."""
    from ..formats.bcolz.test_bcolz import bloscpack_file

    tree = tmp_path / "tree"
    tree.mkdir()
    packed = bloscpack_file(tmp_path / "packed.blp", bytes(range(256)) * 64, chunk_size=4096)
    top = mount(tree, options=["rw"]).mountpoint
    shutil.copyfile(packed, top / "copy.blp")
    assert (tree / "copy.blp").read_bytes() == packed.read_bytes()
