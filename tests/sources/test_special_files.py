"""FIFOs, sockets and device nodes planted in every kind of source directory a mount shows
(a table in separate files, a MeasurementSet's subtable, a MultiFile table's legacy view, a
TileDB array, a bcolz rootdir, a plain directory), in place of the files the formats read
and beside them: the mount stays responsive, never opens them (a FIFO would block the
daemon for good), hides them, and shows the rest as it shows it without them; unmounting
ends the daemon."""

import json
import os
import shutil
import stat
import subprocess
import sys

import bcolz
import numpy as np
import pytest
import tiledb

from ..conftest import Mount, require_fuse
from ..formats.casacore.test_columns import made  # noqa: F401  (the table fixture)

WALK = r"""
import errno, hashlib, json, os, stat, sys
root, found = sys.argv[1], {}
for folder, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, root)
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
            continue
        if not stat.S_ISREG(mode):
            found[rel] = "special"
            continue
        try:
            with open(path, "rb") as f:
                found[rel] = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            found[rel] = errno.errorcode[exc.errno]
print(json.dumps(found))
"""
WALK_SECONDS = 60  # what a responsive mount of these few MiB needs, many times over

KINDS = {"fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "device": stat.S_IFCHR}
# where each kind of source gets one: in place of a file its format reads, and beside them
PLANTED = {
    "table": ["table.f1", "extra"],
    "ms": ["ANTENNA/table.f0", "extra", "ANTENNA/extra"],
    "mftable": ["extra"],
    "array": ["FRAGMENT/a0.tdb", "extra"],
    "rootdir": ["c0/data/__0.blp", "extra"],
    "plain": ["extra", "sub/extra"],
}
# what must read as before: files none of the planted ones holds a byte of
HEALTHY = ["table/table.dat", "table/columns/a_uchar.npy", "table/columns/s_double.npy",
           "ms/columns/UVW.npy", "ms/ANTENNA/table.dat", "mftable/table.f3",
           "mftable/columns/a_short.npy", "array/schema.json", "rootdir/c1.npy",
           "plain/ok", "plain/sub/ok"]


def _array(path):
    """A TileDB dense array of two fragments (the first's data file is planted over)."""
    schema = tiledb.ArraySchema(domain=tiledb.Domain(tiledb.Dim("x", (0, 99), 10, dtype=np.int64)),
                                attrs=[tiledb.Attr("a", np.int32)])
    tiledb.Array.create(str(path), schema)
    for lo in (0, 50):
        with tiledb.open(str(path), "w") as array:
            array[lo:lo + 50] = np.arange(lo, lo + 50, dtype=np.int32)


@pytest.fixture(scope="module")
def tree(made, tmp_path_factory):  # noqa: F811
    """A directory holding every kind of source, and what a mount shows of it (file ->
    SHA-256)."""
    root = tmp_path_factory.mktemp("sources") / "tree"
    root.mkdir()
    shutil.copytree(made("fixed", "StandardStMan"), root / "table")
    shutil.copytree(made("ms", "20"), root / "ms")
    shutil.copytree(made("fixed", "StandardStMan", multifile=True), root / "mftable")
    _array(root / "array")
    bcolz.ctable([np.arange(300), np.arange(300) / 7.0], names=["c0", "c1"],
                 rootdir=str(root / "rootdir"), mode="w", chunklen=64).flush()
    (root / "plain" / "sub").mkdir(parents=True)
    (root / "plain" / "ok").write_bytes(b"plain bytes\n" * 100)
    (root / "plain" / "sub" / "ok").write_bytes(b"more bytes\n" * 100)
    require_fuse()
    with _mounted(root, tmp_path_factory.mktemp("reference")) as (mountpoint, mount):
        shown = _walk(mountpoint, mount)
    assert all(name in shown and len(shown[name]) == 64 for name in HEALTHY), shown
    return root, shown


class _mounted:
    def __init__(self, source, where, workers=None):
        self.mountpoint = where / "mnt"
        self.mountpoint.mkdir()
        self.mount = Mount(source, self.mountpoint,
                           ["columns"] + ([f"workers={workers}"] if workers else []))

    def __enter__(self):
        return self.mountpoint, self.mount

    def __exit__(self, *exc):
        self.mount.close()


def _walk(mountpoint, mount):
    """Every file the mount shows: its SHA-256, or the errno its read gave. A mount that
    does not answer in time fails the test (its daemon killed, so the walk ends too)."""
    walker = subprocess.Popen([sys.executable, "-c", WALK, str(mountpoint)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = walker.communicate(timeout=WALK_SECONDS)
    except subprocess.TimeoutExpired:
        mount.proc.kill()  # (a reader waiting on the daemon cannot be ended otherwise)
        walker.kill()
        walker.communicate()
        pytest.fail(f"the mount did not answer within {WALK_SECONDS} s")
    assert walker.returncode == 0, err
    return json.loads(out)


def _fragment(array):
    return sorted(os.listdir(array / "__fragments"))[0]


@pytest.mark.parametrize("kind,workers", [("fifo", 1), ("fifo", 2), ("socket", 2),
                                          ("device", 2)])
def test_special_files_in_every_kind_of_source(tree, tmp_path, kind, workers):
    """Before, a FIFO in place of table.f1 hung the daemon (and every later request) at
    its first listing of columns/, and the others were shown as empty regular files. With
    one process and with several."""
    reference, shown = tree
    root = tmp_path / "tree"
    shutil.copytree(reference, root, symlinks=True)
    fragment = _fragment(root / "array")
    planted = []
    for source, places in PLANTED.items():
        for place in places:
            path = root / source / place.replace("FRAGMENT", f"__fragments/{fragment}")
            if path.exists():
                path.unlink()
            os.mknod(path, 0o644 | KINDS[kind], os.makedev(1, 3) if kind == "device" else 0)
            planted.append(path)
    with _mounted(root, tmp_path, workers) as (mountpoint, mount):
        found = _walk(mountpoint, mount)
        log = mount.log_text()
    assert mount.proc.returncode == 0  # unmounted, and the daemon ended by itself
    assert "Traceback" not in log and "internal error" not in log, log
    assert not [n for n in found if n.endswith("extra")], found  # hidden
    assert "special" not in found.values(), found
    for name, digest in found.items():  # nothing else new, nothing wrong: EIO at most
        if name.endswith(".json"):  # a description: it names what is not shown, and why
            assert len(digest) == 64, name
        else:
            assert digest in (shown.get(name), "EIO"), name
    assert all(found.get(name) == shown[name] for name in HEALTHY), \
        {n: found.get(n) for n in HEALTHY}
    assert all(f"{path.name!r} hidden: " in log for path in planted
               if path.parent.name not in (fragment, "data")), log  # (views' own: raw/)


@pytest.mark.parametrize("place", ["container", "_hdrext", "journal"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_as_a_container_or_beside_one(data_dir, tmp_path, kind, place):
    """A FIFO, socket or device node named as a container, as a MultiFile's _hdrext, or as a
    MultiHDF5 file's journal: ``ctdsfs info`` refuses it in one line and returns (before,
    the journal's or the _hdrext's open blocked for good on a FIFO)."""
    source = {"container": "mf2_basic.mf", "_hdrext": "casacore_test_v1.mf",
              "journal": "mh5_basic.mfh5"}[place]
    container = tmp_path / source
    shutil.copy(data_dir / source, container)
    if place == "_hdrext":
        shutil.copy(data_dir / f"{source}_hdrext", tmp_path)
    planted = {"container": container, "_hdrext": tmp_path / f"{source}_hdrext",
               "journal": tmp_path / f"{source}.ctdsfs-journal"}[place]
    if planted.exists():
        planted.unlink()
    os.mknod(planted, 0o644 | KINDS[kind], os.makedev(1, 3) if kind == "device" else 0)
    done = subprocess.run(["ctdsfs", "info", str(container)], capture_output=True, text=True,
                          timeout=WALK_SECONDS)
    assert done.returncode == 1, done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert planted.name in done.stderr, done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_as_table_dat_for_tableinfo(tmp_path, kind):
    """``ctdsfs tableinfo`` of a directory whose table.dat is a FIFO, socket or device node
    refuses it in one line and returns (before, its open blocked for good on a FIFO)."""
    os.mknod(tmp_path / "table.dat", 0o644 | KINDS[kind],
             os.makedev(1, 3) if kind == "device" else 0)
    done = subprocess.run(["ctdsfs", "tableinfo", str(tmp_path)], capture_output=True,
                          text=True, timeout=WALK_SECONDS)
    assert done.returncode == 1, done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "table.dat" in done.stderr, done.stderr


@pytest.mark.parametrize("swap", ["fifo", "link"])
def test_table_dat_swapped_under_a_legacy_view(made, tmp_path, swap):  # noqa: F811
    """A MultiFile table's table.dat replaced, while its view is shown, by a FIFO (before:
    the next listing blocked for good) or by a link to a file outside (before: its bytes
    were served as table.dat): the listing answers, and table.dat is hidden or EIO."""
    import errno
    import threading

    from ctdsfs.sources.directory import directory_or_table
    from ctdsfs.vfs import ROOT_INO, ContainerFS
    from ctdsfs.vfs.filesystem import FSError

    path = tmp_path / "t"
    shutil.copytree(made("fixed", "StandardStMan", multifile=True), path)
    fs = ContainerFS(directory_or_table(str(path), source=True), str(path))
    outside = tmp_path / "outside"
    outside.write_bytes(b"SECRET" * 100)
    os.unlink(path / "table.dat")
    os.mkfifo(path / "table.dat") if swap == "fifo" else os.symlink(outside, path / "table.dat")
    listed = {}
    lister = threading.Thread(target=lambda: listed.update(
        (n, a.size) for n, a, _ in fs.readdir(fs.opendir(ROOT_INO))), daemon=True)
    lister.start()
    lister.join(WALK_SECONDS)
    assert not lister.is_alive() and "table.f3" in listed
    if swap == "fifo":
        assert "table.dat" not in listed
        return
    with pytest.raises(FSError) as failed:
        fs.read(fs.open(fs.lookup(ROOT_INO, "table.dat").ino, os.O_RDONLY), 0, 4096)
    assert failed.value.errno == errno.EIO and "symbolic link" in str(failed.value)
