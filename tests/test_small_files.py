"""Small files and small reads: what the kernel may answer itself, and reads that wait.

The daemon is stopped (SIGSTOP) to see what needs it: whatever the kernel
answers from its own caches still works, whatever reaches the daemon hangs
(bounded here by a subprocess timeout), and it is resumed in every case.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from ctdsfs.formats import create_container, open_container

pytestmark = pytest.mark.fuse

OLD_CACHE_SECONDS = 1.0  # how long the kernel kept names and attributes before


@contextlib.contextmanager
def stopped(process):
    """``process`` stopped (SIGSTOP) inside the block, always resumed after it."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


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
    """Whether a thread of process ``pid`` sleeps waiting for a page or a FUSE answer."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{task}/wchan") as f:
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
