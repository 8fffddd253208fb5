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
