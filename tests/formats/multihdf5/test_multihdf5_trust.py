"""A hostile MultiHDF5 never serves bytes from outside the file, never crashes or hangs the
process that reads it, and never makes a walk of its tree explode."""

import math
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from ctdsfs.errors import CtdsfsError
from ctdsfs.formats import create_container, open_container
from ctdsfs.formats.multihdf5 import container as multihdf5
from ctdsfs.formats.multihdf5 import probe as hdf5_probe
from ctdsfs.sources.checking import check_path
from ctdsfs.sources.directory import directory_or_table

from ...conftest import DATA
from . import hdf5_mutations as mutations

HEADER = multihdf5.HEADER

# Single bytes of casacore's own t_mh5.tab/table.mfh5 that HDF5 2.0 cannot survive (found by
# flipping every byte of the header object and its global heap in a child with a time limit).
CRASH_FLIP = (9849, 0xFF)  # in the header attributes' object header: a segmentation fault
HANG_FLIP = (9952, 0x01)  # in the global heap holding the names: HDF5 spins forever

RAW_READ = """
import sys, h5py
f = h5py.File(sys.argv[1], "r", locking=False)
attrs = f["__MultiHDF5_Header__"].attrs
print([attrs[k] for k in attrs])
"""


def flipped(tmp_path, flip, name="bad.mfh5"):
    data = bytearray((DATA / "t_mh5.tab" / "table.mfh5").read_bytes())
    data[flip[0]] ^= flip[1]
    path = tmp_path / name
    path.write_bytes(data)
    return path


def raw_read(path, timeout):
    """h5py reading the header in a child process: its exit status (TimeoutExpired if hung)."""
    return subprocess.run([sys.executable, "-c", RAW_READ, str(path)], capture_output=True,
                          timeout=timeout).returncode


def children_cpu():
    """CPU seconds this process's HDF5 checks have used so far."""
    return hdf5_probe.checks_cpu_seconds()


def everything(container):
    """Every byte the container serves, nested containers included (entries are bounded)."""
    out = {}
    for name in container.names():
        child = container.nested(name)
        if child is not None:
            out.update({f"{name}/{k}": v for k, v in everything(child).items()})
        else:
            out[name] = container.read(name, 0, 1 << 20)
    return out


def one_line_failure(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return result


@pytest.fixture
def hostile(tmp_path):
    """mh5_basic.mfh5 with ``mutation`` applied to hello.txt, secrets planted beside it."""
    def make(mutation):
        path = tmp_path / "hostile.mfh5"
        shutil.copy(DATA / "mh5_basic.mfh5", path)
        mutations.plant_secrets(tmp_path, 4096)
        with mutations.open_for_mutation(path) as f:
            mutation(f, "hello.txt", str(tmp_path))
        return path
    return make


ESCAPES = [(mutations.external_storage, "FileData keeps its bytes in external files"),
           (mutations.external_link_group, "hello.txt is an external link"),
           (mutations.external_link_data, "FileData is an external link"),
           (mutations.virtual_dataset, "FileData is a virtual dataset"),
           (mutations.soft_link, "hello.txt is a soft link"),
           (mutations.gzip_filter, "FileData has filters (shuffle, deflate)")]


@pytest.mark.parametrize("mutation, reason", ESCAPES, ids=[m.__name__ for m, _ in ESCAPES])
def test_objects_reaching_outside_the_file_are_hidden(hostile, tmp_path, mutation, reason):
    path = hostile(mutation)
    c = open_container(path)
    assert c.names() == ["empty.bin", "data10000.bin"]
    assert len(c.problems) == 1 and c.problems[0].startswith(f"entry 'hello.txt' hidden: {reason}")
    assert all(mutations.MARKER not in data for data in everything(c).values())
    problems, _ = check_path(path)
    assert problems == [f"{path}: {c.problems[0]}"]
    one_line_failure(["ctdsfs", "check", str(path)])
    subprocess.run(["ctdsfs", "unpack", str(path), str(tmp_path / "out")], check=True,
                   capture_output=True)
    assert sorted(os.listdir(tmp_path / "out")) == ["data10000.bin", "empty.bin"]


def test_a_header_behind_an_external_link_is_refused(hostile):
    path = hostile(mutations.external_link_header)
    with pytest.raises(CtdsfsError, match="header refused: __MultiHDF5_Header__ is an external"):
        open_container(path)


def test_cycles_and_aliases_show_each_hdf5_object_once(tmp_path):
    """Two hard links back to the root inside a nested container would double the tree at
    every level; an alias of a group or of a FileData would serve one dataset twice."""
    path = tmp_path / "loops.mfh5"
    c = create_container(path, format="hdf5", block_size=256)
    for name in ("a", "b"):
        c.create(name)
        c.write(name, 0, name.encode() * 300)
    c.make_nested("SUB").create("x")
    c.make_nested("SUB2")
    c.close()
    with h5py.File(path, "r+") as f:
        mutations.loop_to_root(f["SUB"], None, None)
        del f["SUB2"][HEADER]
        f["SUB2"][HEADER] = f[HEADER]
        f["alias"] = f["a"]
        mutations.add_entry(f, "alias", 300)
        del f["b/FileData"]
        f["b/FileData"] = f["a/FileData"]
    c = open_container(path)
    assert walk_count(c, limit=1000) == 4  # a, SUB, SUB/x, SUB2 (as a file)
    assert c.names() == ["a", "SUB", "SUB2"] and c.nested("SUB").names() == ["x"]
    assert c.nested("SUB2") is None and c.problems[-1].endswith(
        "SUB2: its header group appears twice in the file's tree (an HDF5 hard link)")
    assert c.problems[:2] == ["entry 'b' hidden: its FileData appears twice in the file's tree "
                          "(an HDF5 hard link)",
                          "entry 'alias' hidden: its group appears twice in the file's tree "
                          "(an HDF5 hard link)"]
    assert len(c.nested("SUB").problems) == 2
    assert len(check_path(path)[0]) == 5
    c.close()
    subprocess.run(["ctdsfs", "unpack", str(path), str(tmp_path / "out")], check=True,
                   timeout=60)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["SUB", "SUB2", "a", "x"]
    with pytest.raises(CtdsfsError, match="damaged entries"):  # never two writable views
        open_container(path, writable=True)


def walk_count(container, limit):
    """Entries of the tree, counting stops at ``limit`` (an exploding tree cannot hang it)."""
    count = 0
    stack = [container]
    while stack and count < limit:
        c = stack.pop()
        for name in c.names():
            count += 1
            child = c.nested(name)
            if child is not None:
                stack.append(child)
    return count


def test_one_opened_file_shows_a_bounded_number_of_entries(tmp_path, monkeypatch):
    path = tmp_path / "many.mfh5"
    c = create_container(path, format="hdf5", block_size=64)
    for name in ("a", "b"):
        c.create(name)
    sub = c.make_nested("SUB")
    for name in ("x", "y", "z"):
        sub.create(name)
    c.close()
    monkeypatch.setattr(multihdf5, "MAX_TREE_ENTRIES", 4)
    c = open_container(path)
    assert walk_count(c, limit=100) == 4
    assert c.nested("SUB").names() == ["x"]
    assert c.nested("SUB").problems == ["2 entries hidden: the file shows at most 4 entries "
                                        "in all"]


def test_more_names_than_casacore_writes_are_refused_before_reading_them(hostile):
    path = hostile(mutations.too_many_names)
    with pytest.raises(CtdsfsError, match="names holds 5000 values, more than the 4000 casacore"):
        open_container(path)


def test_a_file_that_crashes_hdf5_is_refused_in_one_line(tmp_path):
    path = flipped(tmp_path, CRASH_FLIP)
    assert raw_read(path, timeout=60) < 0  # still a file that crashes the library
    message = f"{path}: HDF5 crashed (signal 11) while reading it: damaged file"
    with pytest.raises(CtdsfsError) as exc:
        open_container(path)
    assert str(exc.value) == message
    assert one_line_failure(["ctdsfs", "info", str(path)]).stderr == f"ctdsfs: {message}\n"
    assert message in one_line_failure(["ctdsfs", "check", str(path)]).stdout
    (tmp_path / "mnt").mkdir()
    mount = one_line_failure(["mount.ctdsfs", str(path), str(tmp_path / "mnt")])
    assert mount.stderr == f"mount.ctdsfs: {message}\n"


def test_a_file_that_hangs_hdf5_is_refused_after_the_time_limit(tmp_path, monkeypatch):
    path = flipped(tmp_path, HANG_FLIP)
    with pytest.raises(subprocess.TimeoutExpired):  # still a file that hangs the library
        raw_read(path, timeout=3)
    monkeypatch.setenv(hdf5_probe.TIME_LIMIT_ENV, "1.5")
    with pytest.raises(CtdsfsError) as exc:
        open_container(path)
    assert str(exc.value) == f"{path}: HDF5 did not finish reading it within 1.5 s: damaged file"


def test_a_file_that_spins_hdf5_costs_its_cpu_budget_not_the_wall_clock(tmp_path, monkeypatch):
    """The spinning child is ended by the kernel once it has spent its CPU budget getting
    nowhere (RLIMIT_CPU), long before the wall-clock backstop, however busy the machine."""
    path = flipped(tmp_path, HANG_FLIP)
    monkeypatch.delenv(hdf5_probe.TIME_LIMIT_ENV, raising=False)
    monkeypatch.setenv(hdf5_probe.CPU_LIMIT_ENV, "1")
    before, started = children_cpu(), time.monotonic()
    with pytest.raises(CtdsfsError) as exc:
        open_container(path)
    took, spent = time.monotonic() - started, children_cpu() - before
    assert str(exc.value) == (f"{path}: HDF5 spent 1 s of CPU time reading it without getting "
                              "further: damaged file")
    assert spent < 4 and took < hdf5_probe.time_limit() / 4, (spent, took)


def test_a_large_file_gets_the_cpu_budget_again_at_each_step(tmp_path, monkeypatch):
    """The budget bounds the CPU time between two steps forward, not the whole read: a valid
    file of 4,000 entries (the most casacore writes), which takes several times the
    budget in all, is accepted, past the whole second at which one limit set at the
    probe's start would have ended it (a fixed 2 s failed on a machine where it took 1.4)."""
    path = tmp_path / "many.mfh5"
    with h5py.File(path, "w", libver=multihdf5.LIBVER) as f:  # (much faster than 2,500 creates)
        for i in range(4000):
            f.create_dataset(f"f{i}/FileData", shape=(1, 512), dtype="u1", chunks=(1, 512))
        header = f.create_group(HEADER).attrs
        header["blockSize"], header["hdrCounter"] = np.int64(512), np.int64(1)
        header.create("names", [f"f{i}" for i in range(4000)], dtype=multihdf5.NAMES_TYPE)
        header["sizes"] = np.full(4000, 512, np.int64)
    monkeypatch.setenv(hdf5_probe.CPU_LIMIT_ENV, "0.5")
    before = children_cpu()
    assert hdf5_probe.probe(DATA / "mh5_basic.mfh5") == []
    started = children_cpu() - before  # (what a probe spends before its first step, about)
    before = children_cpu()
    assert hdf5_probe.probe(path) == []
    # (RLIMIT_CPU counts whole seconds: one limit would have ended it at the next one)
    assert children_cpu() - before > math.ceil(started + 0.5) + 0.1


def test_a_directory_source_shows_a_crashing_file_as_a_file(tmp_path):
    shutil.copy(DATA / "mh5_basic.mfh5", tmp_path / "good.mfh5")
    flipped(tmp_path, CRASH_FLIP, "crash.mfh5")
    source = directory_or_table(str(tmp_path), recurse=True)
    assert source.nested("good.mfh5").names() == ["empty.bin", "data10000.bin", "hello.txt"]
    assert source.nested("crash.mfh5") is None
    assert "crash.mfh5: HDF5 crashed (signal 11" in source.problems[0]


@pytest.mark.fuse
def test_a_mounted_file_turning_hostile_leaves_the_mount_alive(mount, tmp_path):
    """The read-only mount re-reads a file another process replaced: the crashing one shows
    nothing, the daemon lives on, and the good one comes back."""
    path = tmp_path / "live.mfh5"
    shutil.copy(DATA / "mh5_basic.mfh5", path)
    m = mount(path)
    assert sorted(os.listdir(m.mountpoint)) == ["data10000.bin", "empty.bin", "hello.txt"]
    os.replace(flipped(tmp_path, CRASH_FLIP), path)
    assert os.listdir(m.mountpoint) == []
    assert m.proc.poll() is None and "HDF5 crashed (signal 11" in m.log_text()
    shutil.copy(DATA / "mh5_basic.mfh5", tmp_path / "again.mfh5")
    os.replace(tmp_path / "again.mfh5", path)
    assert sorted(os.listdir(m.mountpoint)) == ["data10000.bin", "empty.bin", "hello.txt"]


@pytest.mark.fuse
def test_mounted_escapes_serve_nothing_from_outside(mount, tmp_path):
    path = tmp_path / "all.mfh5"
    c = create_container(path, format="hdf5", block_size=4096)
    names = [m.__name__ for m, _ in ESCAPES]
    for name in names + ["plain"]:
        c.create(name)
        c.write(name, 0, b"inside " * 100)
    c.close()
    mutations.plant_secrets(tmp_path, 4096)
    with h5py.File(path, "r+") as f:
        for mutation, _ in ESCAPES:
            mutation(f, mutation.__name__, str(tmp_path))
    m = mount(path)
    assert os.listdir(m.mountpoint) == ["plain"]
    assert (m.mountpoint / "plain").read_bytes() == b"inside " * 100
    for name in names:
        assert not os.path.exists(m.mountpoint / name)


def test_a_huge_claimed_size_costs_what_the_file_holds(hostile):
    """A FileData of 2**40 rows, never written, and a size to match: check reads the stored
    rows only (none) instead of 2**52 bytes of zeros; the map walks the chunk index; unpack
    and convert refuse up front what the target's file system cannot hold."""
    path = hostile(mutations.huge_dims)
    result = subprocess.run(["ctdsfs", "check", str(path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result
    c = open_container(path)
    assert c.entry_size("hello.txt") == (1 << 40) * 4096 - 1
    assert c.read("hello.txt", 1 << 50, 10) == bytes(10)
    result = subprocess.run(["ctdsfs", "map", str(path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "hello.txt" in result.stdout
    for command in (["unpack", str(path), str(path.parent / "out")],
                    ["convert", "--format", "mf2", str(path), str(path.parent / "out.mf")]):
        result = one_line_failure(["ctdsfs", *command])  # not 4 PiB of zeros written
        assert f"hostile.mfh5: its files hold {(1 << 40) * 4096 + 9999} bytes, more than the" \
            in result.stderr and len(result.stderr.splitlines()) == 1
    assert sorted(os.listdir(path.parent)) == ["hostile.mfh5", "secret.bin", "secret.h5"]
