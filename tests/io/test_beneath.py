"""Paths inside a directory source never lead outside it (io/beneath.py)."""

import errno
import os
import stat

import pytest

from ctdsfs.errors import FormatError
from ctdsfs.io.beneath import (
    create_exclusive_beneath,
    kind_beneath,
    listdir_beneath,
    open_beneath,
    read_small_beneath,
)


@pytest.fixture
def tree(tmp_path):
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "folder" / "secret").write_bytes(b"outside bytes")
    (outside / "target").write_bytes(b"outside file")
    root = tmp_path / "root"
    (root / "inner").mkdir(parents=True)
    (root / "inner" / "file").write_bytes(b"inside")
    (root / "linked").symlink_to(outside / "folder")
    (root / "inner" / "link").symlink_to(outside / "target")
    return root, outside


def test_a_file_inside_reads(tree):
    root, _ = tree
    assert read_small_beneath(root, "inner/file", 100) == b"inside"
    assert sorted(listdir_beneath(root, "inner")) == ["file", "link"]
    assert kind_beneath(root, "inner", stat.S_ISDIR)


def test_a_linked_folder_is_never_followed(tree):
    root, _ = tree
    assert os.path.exists(root / "linked" / "secret")  # the plain open would follow it
    with pytest.raises(FormatError):
        read_small_beneath(root, "linked/secret", 100)
    with pytest.raises(OSError) as exc:
        listdir_beneath(root, "linked")
    assert exc.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert not kind_beneath(root, "linked/secret", stat.S_ISREG)


def test_a_linked_file_and_dotdot_are_refused(tree):
    root, _ = tree
    with pytest.raises(FormatError):
        read_small_beneath(root, "inner/link", 100)
    with pytest.raises(OSError):
        open_beneath(root, "inner/../../outside/target")


def test_a_planted_hard_link_is_replaced_not_written(tree):
    root, outside = tree
    os.link(outside / "target", root / "inner" / ".tmp")
    fd = create_exclusive_beneath(root, "inner/.tmp")
    os.write(fd, b"new")
    os.close(fd)
    assert (outside / "target").read_bytes() == b"outside file"
    assert (root / "inner" / ".tmp").read_bytes() == b"new"
    (root / "inner" / ".tmp2").symlink_to(outside / "target")
    os.close(create_exclusive_beneath(root, "inner/.tmp2"))
    assert (outside / "target").read_bytes() == b"outside file"
