"""The table of plain files the processes of one mount share (shared_index): what one
process found plain another does not read again; only plain files are shared, never a
nested container or a file shown plain for another reason; a changed file or a full
table shares nothing; a process killed holding the table's lock blocks no one."""

import fcntl
import os
import signal
import struct

import pytest

from ctdsfs.formats.multifile import shared_index
from ctdsfs.formats.multifile.container import open_file
from ctdsfs.toolbox import pack

from ...conftest import DATA


def _reads():
    """Read calls this process made so far (/proc/self/io's syscr, this look's own not
    yet counted)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("syscr:"))


def _reads_during(work):
    """Read calls made by ``work()`` (those of the looks themselves taken off)."""
    first = _reads()
    second = _reads()
    work()
    return _reads() - second - (second - first)


@pytest.fixture
def table(monkeypatch):
    """A table of this test's own, as a mount with several workers makes before they fork."""
    monkeypatch.setattr(shared_index, "_table", None)
    shared_index.enable()
    return shared_index._table


@pytest.fixture
def packed(tmp_path):
    """A MultiFile of plain files, a nested container (``sub``) and a file that looks
    nested but fails to open (``broken``)."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for i in range(30):
        (tree / f"f{i}.bin").write_bytes(os.urandom(700 + 97 * i))
        (tree / "sub" / f"g{i}.bin").write_bytes(os.urandom(900 + 31 * i))
    broken = bytearray((DATA / "mf2_basic.mf").read_bytes())
    broken[96:100] = struct.pack(">I", 0xFFFF)  # the entry count: more than the header holds
    (tree / "broken").write_bytes(broken)
    pack(str(tree), str(tmp_path / "t.mf"), block_size=512, quiet=True)
    return tmp_path / "t.mf"


def _in_a_child(work):
    """Run ``work()`` in a forked process (as a mount's worker), wait for it to end."""
    pid = os.fork()
    if pid == 0:
        try:
            work()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def _classify_all(container):
    container.classify(container.names())
    container.nested("sub").classify(container.nested("sub").names())


def test_what_one_process_found_plain_another_does_not_read(table, packed):
    """The container opened before the fork, as the daemon opens it: a worker tells every
    file apart; another then reads none of the plain files' first bytes, and still finds
    the nested container (read by itself) and the broken one shown as a file."""
    container = open_file(str(packed))
    _in_a_child(lambda: _classify_all(container))
    names = container.names()
    plain = [n for n in names if n.startswith("f")]
    sub = container.nested("sub")  # (reads its header: not shared)
    assert sub is not None and container.nested("broken") is None
    assert _reads_during(lambda: container.classify(plain)) == 0
    assert _reads_during(lambda: sub.classify(sub.names())) == 0
    assert container.classify(plain) == [None] * len(plain)
    assert sub.classify(sub.names()) == [None] * 30
    assert any("looks nested" in problem for problem in container.problems)


def test_only_plain_files_are_shared(table, packed):
    """A nested container and a file shown as a file because it failed to open are never
    marked: another process reads both itself (and finds the same)."""
    container = open_file(str(packed))
    _in_a_child(lambda: _classify_all(container))
    marked = [name for i, name in enumerate(container.names())
              if container._shared.plain(i)]
    assert sorted(marked) == sorted(n for n in container.names() if n.startswith("f"))
    found = {}
    assert _reads_during(lambda: found.update(zip(container.names(),
                                                  container.classify(container.names())))) > 0
    assert found["sub"] is not None and found["broken"] is None


def test_a_changed_file_shares_nothing_with_its_old_self(table, packed):
    """What was found in the file as it was does not apply once it changed (its times)."""
    _in_a_child(lambda: _classify_all(open_file(str(packed))))
    os.utime(packed, ns=(1, 1))
    container = open_file(str(packed))
    plain = [n for n in container.names() if n.startswith("f")]
    assert _reads_during(lambda: container.classify(plain)) > 0


def test_a_full_table_shares_nothing_and_costs_nothing(monkeypatch, packed):
    """A table with no room for a container's record: each process reads for itself."""
    monkeypatch.setattr(shared_index, "_table", shared_index.SharedPlainTable(size=64))
    container = open_file(str(packed))
    assert container._shared is None
    _in_a_child(lambda: _classify_all(container))
    assert container.nested("sub") is not None
    assert _reads_during(lambda: container.classify(container.names())) > 0


def test_a_process_killed_holding_the_lock_blocks_no_one(table, packed):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        fcntl.lockf(table._fd, fcntl.LOCK_EX)
        os.write(write_end, b"locked")
        signal.pause()
        os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 6) == b"locked"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_end)
    container = open_file(str(packed))
    assert container._shared is not None
