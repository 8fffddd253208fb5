"""Small files and small reads: what the kernel may answer itself, and reads that wait.

The daemon is stopped (SIGSTOP) to see what needs it: whatever the kernel
answers from its own caches still works, whatever reaches the daemon hangs
(bounded here by a subprocess timeout), and it is resumed in every case.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ctdsfs.formats import create_container, open_container
from ctdsfs.formats.multifile import index as multifile_index

pytestmark = pytest.mark.fuse

OLD_CACHE_SECONDS = 1.0  # how long the kernel kept names and attributes before


@contextlib.contextmanager
def stopped(process):
    """``process`` and its children (a mount's worker processes) stopped (SIGSTOP) inside
    the block, always resumed after it."""
    pids = with_workers(process.pid)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def with_workers(pid):
    """``pid`` and its child processes (the worker processes of a mount daemon)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [pid, *map(int, f.read().split())]


def answers_without_waiting(code, *args):
    """Whether ``python -c code args`` finishes within 10 s (a stopped daemon it needs
    makes it hang: then it is killed)."""
    try:
        subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return True


STAT_ALL = "import os, sys; [os.lstat(path) for path in sys.argv[1:]]"
HOLD_OPEN = ("import os, sys; held = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]; "
             "print('held', flush=True); sys.stdin.read()")


def small_tree_container(path, dirs=3, files=20):
    """A MultiFile of ``dirs`` nested directories of ``files`` small files each."""
    c = create_container(path, block_size=1024)
    for d in range(dirs):
        sub = c.make_nested(f"d{d}")
        for i in range(files):
            sub.create(f"f{i}")
            sub.write(f"f{i}", 0, bytes([i]) * (100 + 37 * i))
    c.commit()
    c.close()
    return path


def test_the_kernel_keeps_names_and_attributes_and_forgets_them_on_a_change(mount, tmp_path):
    container = small_tree_container(tmp_path / "tree.mf")
    m = mount(container)
    seen = sorted(os.path.join(top, n) for top, dirs, files in os.walk(m.mountpoint)
                  for n in dirs + files)
    assert len(seen) == 3 + 3 * 20
    # Open in a process of their own, so memory pressure evicts none of them (a child
    # forked from here would inherit the files and flush them, asking the daemon).
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, *seen], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        time.sleep(OLD_CACHE_SECONDS + 0.5)  # past the old timeouts: the kernel would ask again
        with stopped(m.proc):
            assert answers_without_waiting(STAT_ALL, *seen)
    finally:
        holder.communicate(b"", timeout=20)
    assert os.stat(m.mountpoint / "d1" / "f3").st_size == 100 + 37 * 3
    # Another process commits: the kernel's copies are invalidated, without an open.
    writer = open_container(container, writable=True)
    writer.nested("d1").write("f3", 0, b"x" * 5000)
    writer.nested("d1").remove("f4")
    writer.commit()
    writer.close()
    deadline = time.monotonic() + 20
    while os.stat(m.mountpoint / "d1" / "f3").st_size != 5000 or \
            (m.mountpoint / "d1" / "f4").exists():
        assert time.monotonic() < deadline, "another writer's change is never seen"
        time.sleep(0.05)
    assert (m.mountpoint / "d1" / "f3").read_bytes() == b"x" * 5000


WAITING_FOR_IO = {"folio_wait_bit_common", "wait_on_page_bit_common", "request_wait_answer"}


def waits_for_io(pid):
    """Whether a thread of process ``pid`` (or of its workers) sleeps waiting for a page or
    a FUSE answer."""
    for one in with_workers(pid):
        for task in os.listdir(f"/proc/{one}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{one}/task/{task}/wchan") as f:
                    if f.read().strip() in WAITING_FOR_IO:
                        return True
    return False


READ_THE_MIDDLE = "import sys; f = open(sys.argv[1], 'rb'); f.seek(8 << 20); f.read(1 << 20)"


def test_a_large_read_waiting_for_its_disk_holds_up_no_other_request(mount, tmp_path):
    """The container lies on a second (stopped) mount, so a read of it waits as long as
    the test likes: meanwhile the daemon still answers statfs. (Reads under
    THREADED_READ_MIN stay on the loop: a thread hop costs more than most of them.)"""
    source = tmp_path / "source"
    source.mkdir()
    c = create_container(source / "inner.mf", block_size=65536)
    c.create("pad.bin")
    c.write("pad.bin", 0, os.urandom(16 << 20))
    c.commit()
    c.close()
    outer = mount(source, options=["norecurse"], name="outer")
    inner = mount(outer.mountpoint / "inner.mf", name="inner")
    assert os.listdir(inner.mountpoint) == ["pad.bin"]
    with stopped(outer.proc):
        # A process of its own: a child forked from here would inherit the open file
        # and close it (a flush to the daemon) before it can run anything.
        reader = subprocess.Popen([sys.executable, "-c", READ_THE_MIDDLE,
                                   str(inner.mountpoint / "pad.bin")])
        deadline = time.monotonic() + 20
        while not waits_for_io(inner.proc.pid):
            assert time.monotonic() < deadline, "the read never reached the stopped mount"
            time.sleep(0.01)
        answered = answers_without_waiting("import os, sys; os.statvfs(sys.argv[1])",
                                           inner.mountpoint)
        assert reader.poll() is None  # the read was still waiting all along
    assert reader.wait(20) == 0
    assert answered
    inner.close()  # before the mount it reads from


# -- the persistent index of plain files (formats/multifile/index.py)

def varied_tree_container(path):
    """A MultiFile of 4 nested directories of 40 files of 2-8 KiB: a cold listing that
    reads every file's first bytes reads them all."""
    c = create_container(path, block_size=1024)
    for d in range(4):
        sub = c.make_nested(f"d{d}")
        for i in range(40):
            sub.create(f"f{i}")
            sub.write(f"f{i}", 0, bytes([65 + i % 26]) * (2048 + 151 * i))
    c.commit()
    c.close()
    return path


def bytes_read(pid):
    """What process ``pid`` and its workers have read so far (``rchar``: page cache hits
    count too)."""
    total = 0
    for one in with_workers(pid):
        with open(f"/proc/{one}/io") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    return total


def tree_and_bytes_read(m):
    """(every path under the mount, with a '/' after directories; bytes the daemon read
    to list them)."""
    before = bytes_read(m.proc.pid)
    tree = sorted(os.path.relpath(os.path.join(top, n), m.mountpoint) + ("/" if n in dirs else "")
                  for top, dirs, files in os.walk(m.mountpoint) for n in dirs + files)
    return tree, bytes_read(m.proc.pid) - before


def index_files(cache):
    return sorted((cache / "ctdsfs" / "index").glob("*.json"))


def settled(path):
    """``path``, once its last change is older than the index's racy window: a mount that
    opens a container changed just before keeps no index of it (a change in the same
    instant could leave its times as they were), and a daemon started from byte-compiled
    modules opens it within that window."""
    st = os.stat(path)
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    while multifile_index._racy(identity, time.time_ns()):
        time.sleep(0.01)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The daemons' ``XDG_CACHE_HOME``: where they keep the index."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_mount_lists_a_tree_without_reading_its_files(mount, tmp_path, cache):
    container = varied_tree_container(tmp_path / "tree.mf")
    # (one process: several workers would each read what they are first asked about)
    m = mount(container, options=["no_index", "workers=1"])
    tree, cold = tree_and_bytes_read(m)
    m.close()
    assert len(tree) == 4 + 4 * 40 and "d2/" in tree and "d2/f7" in tree
    assert cold > 4 * 40 * 2048  # every file was read
    assert not (cache / "ctdsfs").exists()  # no_index: none kept
    m = mount(container, options=["workers=1"])
    first_tree, first = tree_and_bytes_read(m)
    m.close()
    assert first_tree == tree and first > cold * 0.9  # nothing to use yet
    assert len(index_files(cache)) == 1
    m = mount(container, options=["workers=1"])
    second_tree, second = tree_and_bytes_read(m)
    assert second_tree == tree
    assert second * 10 < cold  # the four nested headers only


def rewrite_in_place_as_a_container(container, directory, name):
    """Another writer makes ``directory/name`` hold an (empty) MultiFile: its first bytes
    change in place, so no header changes, and the container's mtime is set back."""
    before = os.stat(container)
    top = open_container(container)
    sub = top.nested(directory)
    offset = int(sub._entries[name].blocks[0]) * sub.block_size  # (both: 1024-byte blocks)
    at = int(top._entries[directory].blocks[offset // top.block_size]) * top.block_size
    top.close()
    image = container.with_name("empty.mf")
    create_container(image, block_size=512).close()
    with open(container, "r+b") as f:
        f.seek(at)
        f.write(image.read_bytes())
    os.utime(container, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_an_index_of_a_container_changed_since_is_never_believed(mount, tmp_path, cache):
    container = settled(varied_tree_container(tmp_path / "tree.mf"))
    m = mount(container)
    tree, _ = tree_and_bytes_read(m)
    m.close()
    assert "d1/f30" in tree and len(index_files(cache)) == 1
    rewrite_in_place_as_a_container(container, "d1", "f30")
    m = mount(container)
    changed, _ = tree_and_bytes_read(m)
    assert changed == sorted(tree[:tree.index("d1/f30")] + ["d1/f30/"]
                             + tree[tree.index("d1/f30") + 1:])


def hostile_indexes(valid):
    """Index files to be ignored, made from ``valid`` (the index a mount wrote)."""
    good = json.loads(valid)
    dev, ino, size, mtime, ctime = good["identity"]
    fingerprint = good["containers"]["/d0"][0]
    everything_plain = {path: [fingerprint, "ff"] for path, (fingerprint, _) in
                        good["containers"].items()}
    yield b"\x00\xffnot an index"
    yield b"[" * 100_000
    yield valid + b" " * (9 << 20)
    for containers in ([], {"": "x"}, {"": ["x"]}, {"": [1, "ff"]}, {"": ["x", ["f1"]]},
                       {"/d0": [fingerprint, "not hex"]}, {"/d0": [fingerprint, "ffff"]}):
        yield json.dumps({**good, "containers": containers}).encode()
    yield json.dumps({**good, "identity": "me"}).encode()
    yield json.dumps({**good, "format": 1}).encode()
    # Another container file's (a ctime of its own) that says every file is plain:
    yield json.dumps({**good, "identity": [dev, ino, size, mtime, ctime + 1],
                      "containers": everything_plain}).encode()


def test_a_damaged_foreign_or_huge_index_is_ignored_and_rewritten(mount, tmp_path, cache):
    container = settled(small_tree_container(tmp_path / "tree.mf", dirs=2, files=5))
    m = mount(container)
    tree, _ = tree_and_bytes_read(m)
    m.close()
    [index] = index_files(cache)
    valid = index.read_bytes()
    for hostile in hostile_indexes(valid):
        index.write_bytes(hostile)
        m = mount(container)
        assert tree_and_bytes_read(m)[0] == tree, hostile[:100]
        assert m.close() == 0
        assert "Traceback" not in m.log.read_text()
        assert index.read_bytes() == valid  # rewritten


def test_processes_that_each_saw_part_of_a_container_keep_what_all_saw(tmp_path, cache,
                                                                        monkeypatch):
    """A mount's workers each learn which files are plain from the requests they answer;
    the index keeps the union (same header), and a record for another header replaces."""
    container = settled(small_tree_container(tmp_path / "tree.mf", dirs=2, files=5))
    monkeypatch.setattr(multifile_index, "_directory", str(cache / "ctdsfs" / "index"))
    fd = os.open(container, os.O_RDONLY)
    try:
        first, second = multifile_index.open_index(fd), multifile_index.open_index(fd)
        first.save({"": ("header", "05"), "d0": ("old", "01")})
        second.save({"": ("header", "0a"), "d0": ("new", "02")})
        assert multifile_index.open_index(fd).records == {"": ("header", "0f"),
                                                          "d0": ("new", "02")}
    finally:
        os.close(fd)
