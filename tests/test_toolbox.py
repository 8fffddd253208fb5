"""ctdsfs pack / unpack / convert: whole MeasurementSets in one file and back, byte for byte."""

import filecmp
import json
import os
import shutil
import subprocess
import sys

import pytest

from ctdsfs.formats import open_container
from ctdsfs.sources.checking import check_path

from .conftest import DATA, SCRIPTS, make_casacore_table, run_on_terminal
from .formats.multifile.test_write import snapshot_file

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


@pytest.mark.parametrize("multifile,fmt", [(False, "mf2"), (True, "mf2"), (False, "hdf5"),
                                          (True, "hdf5")])
def test_pack_unpack_measurement_set_byte_exact(tmp_path, multifile, fmt):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "\n")
    subprocess.run([sys.executable, "-c", "import casacore.tables as t; t.default_ms('obs.ms').close()"],
                   check=True, cwd=tmp_path, env=dict(os.environ, HOME=str(home)))
    crc = ["--crc"] if fmt == "mf2" else []
    ctdsfs("pack", "--format", fmt, "--block-size", 4096, *crc, tmp_path / "obs.ms",
           tmp_path / "obs.container")
    assert open_container(tmp_path / "obs.container").format_name == \
        ("MultiHDF5" if fmt == "hdf5" else "MultiFile")
    assert check_path(tmp_path / "obs.container")[0] == []
    ctdsfs("unpack", tmp_path / "obs.container", tmp_path / "back.ms")
    same_tree(tmp_path / "obs.ms", tmp_path / "back.ms")


MAKE_MS = """
import casacore.tables as t, numpy as np
ms = t.default_ms('obs.ms')
ms.addrows(20)
ms.putcol('UVW', np.arange(60.).reshape(20, 3))
ms.putcol('TIME', np.arange(20) * 1.5)
ms.close()
ant = t.table('obs.ms/ANTENNA', readonly=False, ack=False)
ant.addrows(3)
ant.putcol('NAME', ['a', 'b', 'c'])
ant.close()
"""


@pytest.mark.fuse
@pytest.mark.parametrize("output", ["obs.mf", "obs.mfh5"])
def test_packed_measurement_set_read_by_casacore_through_the_mount(mount, tmp_path, output):
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-c", MAKE_MS], check=True, cwd=tmp_path,
                   env=dict(os.environ, HOME=str(home)))
    ctdsfs("pack", "--block-size", 8192, tmp_path / "obs.ms", tmp_path / output)  # format by name
    m = mount(tmp_path / output)
    dump = [sys.executable, str(SCRIPTS / "make_sample_table.py"), "--dump"]
    through = subprocess.run(dump + [str(m.mountpoint)], capture_output=True, text=True)
    original = subprocess.run(dump + [str(tmp_path / "obs.ms")], capture_output=True, text=True,
                              check=True)
    assert through.returncode == 0, through.stderr
    got = json.loads(through.stdout)
    assert got == json.loads(original.stdout)
    assert got["ANTENNA"]["NAME"] == ["a", "b", "c"] and len(got["main"]["TIME"]) == 20


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


def test_progress_bars_on_a_terminal_only(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "big").write_bytes(os.urandom(8 << 20))
    (tree / "sub" / "small").write_bytes(b"x" * 1000)
    commands = {"pack": ["pack", "--crc", "--block-size", "4096", tree, tmp_path / "t.mf"],
                "check": ["check", tmp_path / "t.mf"],
                "map": ["map", tmp_path / "t.mf"],
                "unpack": ["unpack", tmp_path / "t.mf", tmp_path / "back"]}
    for what, args in commands.items():
        status, shown = run_on_terminal(["ctdsfs", *map(str, args)])
        assert status == 0, shown
        assert f"{what}:" in shown and "B/s" in shown, (what, shown)  # throughput, ETA
    same_tree(tree, tmp_path / "back")
    status, shown = run_on_terminal(["ctdsfs", "check", "--quiet", str(tmp_path / "t.mf")])
    assert status == 0 and "B/s" not in shown and "clean" in shown
    piped = ctdsfs("check", tmp_path / "t.mf")  # not a terminal: no bar
    assert "B/s" not in piped.stderr + piped.stdout


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
    assert existing.returncode == 1 and "File exists" in existing.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ctdsfs-unpack-")]


def test_convert_round_trip_keeps_everything(tmp_path):
    ctdsfs("convert", DATA / "casacore_test_v1.mf", tmp_path / "v2.mf", "--format", "mf2", "--crc")
    ctdsfs("convert", tmp_path / "v2.mf", tmp_path / "v1.mf", "--format", "mf1")
    ctdsfs("convert", DATA / "mf2_nested.mf", tmp_path / "n.mf", "--format", "mf2",
           "--block-size", 512)
    original = snapshot_file(DATA / "casacore_test_v1.mf")
    assert snapshot_file(tmp_path / "v2.mf") == original
    assert snapshot_file(tmp_path / "v1.mf") == original
    assert open_container(tmp_path / "v2.mf").header.use_crc
    assert snapshot_file(tmp_path / "n.mf") == snapshot_file(DATA / "mf2_nested.mf")
    nested = ctdsfs("convert", DATA / "mf2_nested.mf", tmp_path / "x.mf", "--format", "mf1", ok=False)
    assert nested.returncode == 1 and "cannot nest" in nested.stderr
    assert not (tmp_path / "x.mf").exists()


def test_convert_v1_v2_hdf5_v2_round_trip_is_identical(tmp_path):
    steps = [("v2.mf", "mf2"), ("h.mfh5", "hdf5"), ("back.mf", "mf2")]
    source = DATA / "casacore_test_v1.mf"
    for name, fmt in steps:
        ctdsfs("convert", source, tmp_path / name, "--format", fmt)
        source = tmp_path / name
    original = snapshot_file(DATA / "casacore_test_v1.mf")
    assert original  # the fixture has files
    for name, _ in steps:
        assert snapshot_file(tmp_path / name) == original, name
    assert open_container(tmp_path / "h.mfh5").format_name == "MultiHDF5"
    # Nesting survives the trip through MultiHDF5 too.
    ctdsfs("convert", DATA / "mf2_nested.mf", tmp_path / "n.mfh5", "--format", "hdf5")
    ctdsfs("convert", tmp_path / "n.mfh5", tmp_path / "n.mf", "--format", "mf2")
    nested = snapshot_file(DATA / "mf2_nested.mf")
    assert "SUB/" in nested
    assert snapshot_file(tmp_path / "n.mfh5") == nested
    assert snapshot_file(tmp_path / "n.mf") == nested
    crc = ctdsfs("convert", DATA / "mf2_basic.mf", tmp_path / "c.mfh5", "--format", "hdf5",
                 "--crc", ok=False)
    assert crc.returncode == 1 and "no CRCs" in crc.stderr and not (tmp_path / "c.mfh5").exists()


def test_table_converted_to_v1_opens_in_casacore_3_5_natively(tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", block_size=4096, rows=40)
    home = tmp_path / ".home-t.tab"
    dump = [str(SCRIPTS / "make_sample_table.py"), "--dump", str(table)]
    expected = json.loads(subprocess.run([sys.executable] + dump, capture_output=True, text=True,
                                         check=True, env=dict(os.environ, HOME=str(home))).stdout)
    for directory in (table, table / "ANTENNA"):
        ctdsfs("convert", directory / "table.mf", directory / "v1.mf", "--format", "mf1")
        os.replace(directory / "v1.mf", directory / "table.mf")
        if (directory / "v1.mf_hdrext").exists():
            os.replace(directory / "v1.mf_hdrext", directory / "table.mf_hdrext")
    legacy = subprocess.run(["/usr/bin/python3"] + dump, capture_output=True, text=True,
                            env=dict(os.environ, HOME=str(home)))
    assert legacy.returncode == 0, legacy.stderr
    assert json.loads(legacy.stdout) == expected


def dump_values(table, python=sys.executable):
    result = subprocess.run([python, str(SCRIPTS / "make_sample_table.py"), "--dump", str(table)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def tree_bytes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f != "table.lock":  # casacore rewrites its lock file when it opens a table
                with open(os.path.join(dirpath, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(dirpath, f), root)] = fh.read()
    return out


def test_to_multifile_and_back(tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", rows=200, multifile=False)
    original, values = tree_bytes(table), dump_values(table)
    ctdsfs("to-multifile", "--block-size", 4096, table)
    assert sorted(os.listdir(table)) == ["ANTENNA", "table.dat", "table.info", "table.lock",
                                         "table.mf"]
    assert "table.mf" in os.listdir(table / "ANTENNA")
    assert dump_values(table) == values  # python-casacore 3.8, natively
    ctdsfs("to-sepfile", table)
    assert dump_values(table, python="/usr/bin/python3") == values  # casacore 3.5, natively
    assert tree_bytes(table) == original  # byte for byte the table casacore wrote
    assert not [p for p in os.listdir(tmp_path) if ".ctdsfs-" in p]


def test_to_sepfile_keeps_symbolic_links_as_links(tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", rows=10)
    os.symlink("/etc/hostname", table / "outside")
    os.symlink("ANTENNA", table / "ANTENNA_LINK")
    result = ctdsfs("to-sepfile", table, ok=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert os.readlink(table / "outside") == "/etc/hostname"
    assert os.readlink(table / "ANTENNA_LINK") == "ANTENNA"
    assert "table.mf" not in os.listdir(table / "ANTENNA")


def test_to_multifile_never_follows_symbolic_links(tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", rows=10, multifile=False)
    os.symlink("/etc/hostname", table / "outside")
    os.symlink("ANTENNA", table / "ANTENNA_LINK")
    ctdsfs("to-multifile", "--block-size", 4096, table)
    assert os.readlink(table / "outside") == "/etc/hostname"
    assert os.readlink(table / "ANTENNA_LINK") == "ANTENNA"
    assert "table.mf" in os.listdir(table / "ANTENNA")
    other = make_casacore_table(tmp_path / "o.tab", rows=10, multifile=False)
    before = tree_bytes(other)
    (other / "table.f0").rename(tmp_path / "real.f0")
    os.symlink(tmp_path / "real.f0", other / "table.f0")  # its bytes would come from outside
    result = ctdsfs("to-multifile", other, ok=False)
    assert result.returncode == 1 and "a symbolic link cannot be stored" in result.stderr
    assert result.stderr.count("\n") == 1
    assert os.readlink(other / "table.f0") == str(tmp_path / "real.f0")
    assert "table.mf" not in os.listdir(other)
    assert before.keys() == tree_bytes(other).keys()


@pytest.mark.parametrize("command", ["to-multifile", "to-sepfile"])
def test_kill_9_during_storage_change_leaves_a_readable_table(tmp_path, command):
    import random
    import time
    rng = random.Random(command)
    table = make_casacore_table(tmp_path / "t.tab", rows=40000,
                                multifile=command == "to-sepfile")
    values = dump_values(table)
    converted = tmp_path / "converted" / "t.tab"
    shutil.copytree(table, converted)
    ctdsfs(command, "--quiet", converted)
    # the files of the table before or after the change (the conversion is
    # deterministic); any other state must still hold the same values
    whole = (tree_bytes(table), tree_bytes(converted))
    staging = tmp_path / "t.tab.ctdsfs-new"
    mid_run = 0
    for attempt in range(8):
        proc = subprocess.Popen(["ctdsfs", command, "--quiet", str(table)])
        while proc.poll() is None and not staging.exists():
            time.sleep(0.0005)  # wait until the conversion itself has begun
        time.sleep(rng.uniform(0, 0.06))
        proc.kill()  # SIGKILL, somewhere in building, swapping or cleaning up
        mid_run += proc.wait() == -9
        assert tree_bytes(table) in whole or dump_values(table) == values, f"attempt {attempt}"
    assert mid_run >= 4  # most kills really hit a conversion in progress
    ctdsfs(command, table)  # a later run cleans up what the killed ones left
    assert tree_bytes(table) == whole[1]
    assert dump_values(table) == values
    assert not [p for p in os.listdir(tmp_path) if ".ctdsfs-" in p]


def test_every_command_refuses_an_existing_output_in_the_same_words(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_text("x")
    mf, mfh5, directory = tmp_path / "out.mf", tmp_path / "out.mfh5", tmp_path / "dir"
    mf.write_bytes(b"keep")
    mfh5.write_bytes(b"keep")
    directory.mkdir()
    dangling = tmp_path / "dangling.mfh5"
    os.symlink(tmp_path / "nowhere", dangling)
    source = DATA / "mf2_basic.mf"
    cases = [(mf, ["new", mf]), (mfh5, ["new", mfh5]), (dangling, ["new", dangling]),
             (mf, ["pack", tree, mf]), (mfh5, ["pack", tree, mfh5]),
             (mfh5, ["convert", source, mfh5, "--format", "hdf5"]),
             (mf, ["convert", source, mf, "--format", "mf1"]),
             (directory, ["unpack", source, directory])]
    for output, args in cases:
        result = ctdsfs(*args, ok=False)
        assert (result.returncode, result.stderr) == (1, f"ctdsfs: {output}: File exists\n"), args
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.mf")
    for link in (tmp_path / "dangling.mf", dangling):  # 'create' makes a missing SOURCE
        result = subprocess.run(["mount.ctdsfs", "-o", "create", link, mnt],
                                capture_output=True, text=True)
        assert (result.returncode, result.stderr) == (1, f"mount.ctdsfs: {link}: File exists\n")
    assert mf.read_bytes() == mfh5.read_bytes() == b"keep"
    assert os.listdir(directory) == [] and not os.path.exists(dangling)


def tree_bytes_total(root):
    return sum(os.lstat(os.path.join(top, f)).st_size
               for top, _, files in os.walk(root) for f in files)


def test_chosen_block_size_follows_the_files():
    from ctdsfs.toolbox import choose_block_size
    assert choose_block_size([1 << 30]) == 4 << 20  # one big file: casacore's default
    small = [1024 + (i * 7919) % (15 * 1024) for i in range(20_000)]  # 1-16 KiB
    chosen = choose_block_size(small, directories=200)
    padded = sum(-(-s // chosen) * chosen for s in small) + 2 * 200 * chosen
    assert chosen >= 512 and padded <= 1.05 * sum(small)
    assert choose_block_size(small + [1 << 30], directories=200) > chosen  # the big file pays


def test_pack_and_to_multifile_keep_a_measurement_set_small(tmp_path):
    """Without --block-size the size is chosen (and printed) so that the container holds a
    MeasurementSet in at most 1.1x its bytes; casacore reads it at any block size."""
    ms = tmp_path / "obs.ms"
    subprocess.run([sys.executable, "-c", MAKE_MS.replace("addrows(20)", "addrows(2000)")
                    .replace("arange(60.).reshape(20", "arange(6000.).reshape(2000")
                    .replace("arange(20)", "arange(2000)")], check=True, cwd=tmp_path)
    values, tree = dump_values(ms), tree_bytes_total(ms)
    packed = ctdsfs("pack", ms, tmp_path / "obs.mf")
    assert "block size" in packed.stdout and "chosen" in packed.stdout
    assert (tmp_path / "obs.mf").stat().st_size <= 1.1 * tree
    ctdsfs("unpack", tmp_path / "obs.mf", tmp_path / "back.ms")
    same_tree(ms, tmp_path / "back.ms")
    converted = ctdsfs("to-multifile", ms)
    assert converted.stdout.count("chosen for this table") == 1 + len(
        [d for d in os.listdir(ms) if (ms / d / "table.dat").exists()])
    assert tree_bytes_total(ms) <= 1.1 * tree
    assert dump_values(ms) == values  # python-casacore 3.8 reads the chosen block sizes
