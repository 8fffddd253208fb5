"""Temporaries of every writing format are made afresh (O_EXCL after unlinking a leftover):
a hard link planted at a temporary's name never receives a commit's bytes (issue 24, 12)."""

import os

import pytest

from ctdsfs.formats import create_container, open_container
from ctdsfs.io.journal import journal_path


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside"
    path.write_bytes(b"precious")
    return path


def test_multihdf5_staging_file(tmp_path, outside):
    target = tmp_path / "new.mfh5"
    os.link(outside, f"{target}.ctdsfs-new")
    create_container(target, format="hdf5").close()
    assert outside.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["new.mfh5", "outside"]


def test_multihdf5_journal(tmp_path, outside):
    target = tmp_path / "j.mfh5"
    create_container(target, format="hdf5").close()
    c = open_container(target, writable=True)
    c.create("a")
    c.write("a", 0, b"x" * 10000)
    os.link(outside, journal_path(target))
    c.commit()
    c.close()
    assert outside.read_bytes() == b"precious"
    assert open_container(target).read("a", 0, 3) == b"xxx"


def test_multifile_v1_header_extension(tmp_path, outside):
    target = tmp_path / "v1.mf"
    os.link(outside, f"{target}_hdrext.ctdsfs-new")
    c = create_container(target, format="mf1", block_size=512)
    for number in range(40):  # a header past block 0: written to v1.mf_hdrext
        c.create(f"file{number:03d}")
    c.commit()
    c.close()
    assert outside.read_bytes() == b"precious"
    assert len(open_container(target).names()) == 40
