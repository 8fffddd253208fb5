"""The inode numbers worker processes share (vfs.shared_inodes): a name numbered by one
process has that number in every other, whatever the name holds."""

import json
import os

from ctdsfs.vfs.shared_inodes import SharedInodes

NAMES = ["a", "", "b\0c", "d", "a", "\udcff\udcfe", "e\0", "f"]  # (a NUL, a repeat, bytes)


def test_names_numbered_by_one_process_are_the_others_numbers():
    table = SharedInodes(2)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            table.after_fork()
            numbers = table.number(1, NAMES) + table.number(7, ["a", "g"])
            os.write(write_end, json.dumps(numbers).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        theirs = json.loads(pipe.read())
    os.waitpid(pid, 0)
    table.after_fork()
    assert table.number(1, NAMES) + table.number(7, ["a", "g"]) == theirs
    assert len(set(theirs)) == len(set(NAMES)) + 2
    assert theirs[0] == theirs[4]  # (a name asked twice has one number)
    for name, ino in zip(NAMES, theirs):
        assert table.where(ino) == (1, name)
    assert table.number(1, ["h"]) == [max(theirs) + 1]


def test_a_worker_reads_what_another_found_committed_since(tmp_path):
    """Workers of one mount each hold the container's tree: once one of them finds that
    another process committed (its lookup, listing or open reloads), the others reload
    before they read, not serve the bytes from before (the kernel sends a reader's
    open and its reads to whichever worker is free)."""
    from ctdsfs.formats import create_container, open_container
    from ctdsfs.vfs.filesystem import ROOT_INO, ContainerFS

    path = tmp_path / "live.mf"
    writer = create_container(path, format="mf2", block_size=1024)
    writer.create("data")
    writer.write("data", 0, b"a" * 5000)
    writer.commit()
    table = SharedInodes(ROOT_INO + 1)
    table.after_fork()
    workers = [ContainerFS(open_container(path), path) for _ in range(2)]
    for fs in workers:
        fs.share_inodes(table)
    ino = workers[0].lookup(ROOT_INO, "data").ino
    fh = workers[1].open(ino, os.O_RDONLY)
    assert workers[1].read(fh, 0, 5000) == b"a" * 5000
    writer.write("data", 0, b"b" * 5000)
    writer.commit()
    assert workers[0].open(ino, os.O_RDONLY) == fh  # (it reloads: a handle is the inode)
    assert workers[1].read(fh, 0, 5000) == b"b" * 5000
    writer.close()
    for fs in workers:
        fs.close()


def test_a_worker_reads_only_the_names_of_what_it_answers_for(monkeypatch):
    """The names another worker numbered are read only for the directory, or the
    number, this one is asked about: a walk one worker answered costs the others only
    the batches' headers (reading every name cost each of them a large share of the
    walk's CPU)."""
    table = SharedInodes(2)
    directories = {parent: [f"{parent}-{i}" for i in range(40)] for parent in range(1, 51)}
    pid = os.fork()
    if pid == 0:
        try:
            table.after_fork()
            for parent, names in directories.items():
                table.number(parent, names[:10])
                table.number(parent, names)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    table.after_fork()
    read = []
    real_read = SharedInodes._read
    monkeypatch.setattr(SharedInodes, "_read",
                        lambda self, index: read.append(index) or real_read(self, index))
    assert table.count() == 1 + 50 * 40
    assert read == []
    assert table.where(2 + 7 * 40 + 15) == (8, "8-15")  # (the 8th directory's, 2nd batch)
    assert len(read) == 1
    read.clear()
    numbers = table.number(20, directories[20][::-1])
    assert len(read) == 2 and numbers == list(range(2 + 20 * 40 - 1, 2 + 19 * 40 - 1, -1))
    read.clear()
    assert table.number(20, ["20-3", "new"]) == [2 + 19 * 40 + 3, 2 + 50 * 40]
    assert read == []


def test_a_listing_numbers_the_names_after_its_batch_in_one_go(tmp_path):
    """A listing's first batch numbers the names after it too (up to NUMBERED_AHEAD), so
    that its next batches find their numbers without the table's lock; a number is
    still made once, and the names of a batch are the ones given back."""
    from ctdsfs.formats import create_container, open_container
    from ctdsfs.vfs.filesystem import NUMBERED_AHEAD, ROOT_INO, ContainerFS

    path = tmp_path / "many.mf"
    writer = create_container(path, format="mf2", block_size=1024)
    names = sorted(f"f{i:04d}" for i in range(NUMBERED_AHEAD + 100))
    for name in names:
        writer.create(name)
    writer.commit()
    writer.close()
    table = SharedInodes(ROOT_INO + 1)
    table.after_fork()
    fs = ContainerFS(open_container(path), path)
    fs.share_inodes(table)
    listed = fs.readdir(ROOT_INO, 0, 10)
    assert [name for name, _, _ in listed] == [".", "..", *names[:8]]
    assert table.count() == 1 + 8 + NUMBERED_AHEAD
    more = fs.readdir(ROOT_INO, 10, 40)
    assert [name for name, _, _ in more] == names[8:48]
    assert [attr[0] for _, attr, _ in listed[2:] + more] == list(range(2, 50))
    assert table.count() == 1 + 8 + NUMBERED_AHEAD  # (already numbered: none made again)
    assert table.number(ROOT_INO, ["f0003", "new"], ["f0009", "other"]) == [5, 10 + NUMBERED_AHEAD]
    assert table.count() == 1 + 8 + NUMBERED_AHEAD + 2
    fs.close()
