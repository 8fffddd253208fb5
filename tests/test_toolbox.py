"""ctdsfs pack / unpack: whole MeasurementSets in one file and back, byte for byte."""

import filecmp
import json
import os
import subprocess
import sys

import pytest

from ctdsfs.formats.check import check_path

from .conftest import SCRIPTS, make_casacore_table

pytestmark = pytest.mark.tools


def same_tree(a, b):
    cmp = filecmp.dircmp(a, b)
    assert not (cmp.left_only or cmp.right_only or cmp.funny_files), (a, b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    for sub in cmp.common_dirs:
        same_tree(os.path.join(a, sub), os.path.join(b, sub))


def ctdsfs(*args, ok=True):
    result = subprocess.run(["ctdsfs", *map(str, args)], capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("multifile", [False, True])
def test_pack_unpack_measurement_set_byte_exact(tmp_path, multifile):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "\n")
    subprocess.run([sys.executable, "-c", "import casacore.tables as t; t.default_ms('obs.ms').close()"],
                   check=True, cwd=tmp_path, env=dict(os.environ, HOME=str(home)))
    ctdsfs("pack", "--block-size", 4096, "--crc", tmp_path / "obs.ms", tmp_path / "obs.mf")
    assert check_path(tmp_path / "obs.mf")[0] == []
    ctdsfs("unpack", tmp_path / "obs.mf", tmp_path / "back.ms")
    same_tree(tmp_path / "obs.ms", tmp_path / "back.ms")


@pytest.mark.fuse
def test_packed_table_read_by_casacore_through_the_mount(mount, tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", rows=80, multifile=False)
    ctdsfs("pack", "--block-size", 8192, table, tmp_path / "t.mf")
    m = mount(tmp_path / "t.mf")
    dump = [sys.executable, str(SCRIPTS / "make_sample_table.py"), "--dump"]
    through = subprocess.run(dump + [str(m.mountpoint)], capture_output=True, text=True)
    original = subprocess.run(dump + [str(table)], capture_output=True, text=True, check=True)
    assert through.returncode == 0, through.stderr
    assert json.loads(through.stdout) == json.loads(original.stdout)


def test_version_1_pack_read_by_casacore_3_5(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(30):
        (src / f"storage_manager_file_{i:02d}").write_bytes(bytes([i]) * (i * 100))
    ctdsfs("pack", "--format", "mf1", "--block-size", 512, src, tmp_path / "v1.mf")
    listing = subprocess.run(["lsmf", str(tmp_path / "v1.mf")], capture_output=True, text=True,
                             check=True).stdout
    assert "nfile = 30" in listing and "storage_manager_file_29   size=2900" in listing
    ctdsfs("unpack", tmp_path / "v1.mf", tmp_path / "back")
    same_tree(src, tmp_path / "back")


def test_refusals_leave_nothing_behind(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("x")
    bad = ctdsfs("pack", "--format", "mf1", tree, tmp_path / "v1.mf", ok=False)
    assert bad.returncode == 1 and "cannot nest" in bad.stderr
    assert not (tmp_path / "v1.mf").exists()
    os.symlink("sub/f", tree / "link")
    bad = ctdsfs("pack", tree, tmp_path / "l.mf", ok=False)
    assert bad.returncode == 1 and "symbolic links" in bad.stderr
    assert not (tmp_path / "l.mf").exists()
    os.unlink(tree / "link")
    ctdsfs("pack", tree, tmp_path / "ok.mf")
    again = ctdsfs("pack", tree, tmp_path / "ok.mf", ok=False)
    assert again.returncode == 1 and "exists" in again.stderr
    existing = ctdsfs("unpack", tmp_path / "ok.mf", tree, ok=False)
    assert existing.returncode == 1 and "already exists" in existing.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ctdsfs-unpack-")]
