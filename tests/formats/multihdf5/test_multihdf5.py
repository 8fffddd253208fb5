"""MultiHDF5 (casacore's HDF5 container): casacore-written files read, edited and mounted;
files ctdsfs writes laid out exactly as casacore's."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from ctdsfs.errors import ContainerFull, CtdsfsError
from ctdsfs.formats import create_container, open_container
from ctdsfs.formats.casacore.tabledat import decode as decode_table_dat
from ctdsfs.formats.multihdf5 import container as multihdf5
from ctdsfs.formats.multihdf5 import probe as hdf5_probe

from ...conftest import DATA, pattern
from ..multifile.test_write import snapshot

HEADER = "__MultiHDF5_Header__"


def layout(path):
    """What casacore's layout rules fix: header attribute types and shapes, every FileData
    dataset's type, shape, chunking, fill and allocation, and the superblock version."""
    out = {"superblock": open(path, "rb").read(9)[8]}
    with h5py.File(path, "r") as f:
        attrs = f[HEADER].attrs
        for key in attrs:
            a = attrs.get_id(key)
            t = a.get_type()
            info = [t.get_class(), t.get_size(), a.shape]
            if t.get_class() == h5py.h5t.STRING:
                info += [t.get_cset(), t.get_strpad(), t.is_variable_str()]
            elif t.get_class() == h5py.h5t.INTEGER:
                info += [t.get_order(), t.get_sign()]
            out[f"@{key}"] = info
        out["names"] = [n.decode() if isinstance(n, bytes) else n for n in attrs["names"]]
        out["sizes"] = attrs["sizes"].tolist()
        for name in out["names"]:
            d = f[name]["FileData"]
            plist = d.id.get_create_plist()
            out[name] = [d.dtype.str, d.shape, d.maxshape, d.chunks, d.compression,
                         plist.get_fill_time(), plist.get_alloc_time(), sorted(f[name])]
    return out


def test_casacore_multihdf5_fixture():
    c = open_container(DATA / "mh5_basic.mfh5")
    assert c.names() == ["empty.bin", "data10000.bin", "hello.txt"]
    assert c.read("data10000.bin", 0, 20000) == pattern(10000, 7, 3)
    assert c.read("hello.txt", 0, 100) == b"hello"
    assert c.read("empty.bin", 0, 10) == b""
    assert c.read("data10000.bin", 4090, 12) == pattern(10000, 7, 3)[4090:4102]
    assert c.block_size == 4096 and c.problems == []


def test_table_fixture_files():
    c = open_container(DATA / "t_mh5.tab" / "table.mfh5")
    assert sorted(c.names()) == ["table.f0", "table.f0i"]


def test_ctdsfs_writes_casacore_s_layout(tmp_path):
    """The fixture's own content written by ctdsfs the way tomf writes it: the same layout."""
    path = tmp_path / "mine.mfh5"
    c = create_container(path, format="hdf5", block_size=4096)
    for name in ("empty.bin", "data10000.bin", "hello.txt"):
        c.create(name)
        data = (DATA / "inputs" / name).read_bytes()
        for offset in range(0, len(data), 4096):  # tomf's block-sized writes
            c.write(name, offset, data[offset:offset + 4096])
    c.close()
    mine, casacore = layout(path), layout(DATA / "mh5_basic.mfh5")
    assert mine == casacore
    assert mine["data10000.bin"][1] == (4, 4096)  # casacore's spare row, kept
    assert snapshot(open_container(path)) == snapshot(open_container(DATA / "mh5_basic.mfh5"))


def test_editing_a_casacore_file(tmp_path):
    path = tmp_path / "edit.mfh5"
    shutil.copy(DATA / "mh5_basic.mfh5", path)
    c = open_container(path, writable=True)
    c.write("hello.txt", 5, b", world")
    c.truncate("data10000.bin", 5000)
    c.truncate("data10000.bin", 6000)  # the bytes after 5000 come back as zeros
    c.remove("empty.bin")
    c.create("new.bin")  # casacore reuses the deleted slot
    c.write("new.bin", 9000, b"x")
    c.close()
    with h5py.File(path, "r") as f:
        attrs = f[HEADER].attrs
        assert [n.decode() if isinstance(n, bytes) else n for n in attrs["names"]] == \
            ["new.bin", "data10000.bin", "hello.txt"]
        assert attrs["sizes"].tolist() == [9001, 6000, 12] and attrs["hdrCounter"] == 2
        assert "empty.bin" not in f
    r = open_container(path)
    assert r.read("hello.txt", 0, 100) == b"hello, world"
    assert r.read("data10000.bin", 0, 10000) == pattern(10000, 7, 3)[:5000] + bytes(1000)
    assert r.read("new.bin", 0, 10000) == bytes(9000) + b"x"


def test_empty_vectors_as_casacore_writes_them(tmp_path):
    """casacore's HDF5Record stores an empty vector as an {emptyarray, rank, casatype} scalar."""
    path = tmp_path / "empty.mfh5"
    create_container(path, format="hdf5", block_size=512).close()
    with h5py.File(path, "r") as f:
        attrs = f[HEADER].attrs
        assert attrs["names"].tolist() == (1, 1, 11)  # TpString
        assert attrs["sizes"].tolist() == (1, 1, 29)  # TpInt64
        assert attrs["names"].dtype.names == ("emptyarray", "rank", "casatype")
    c = open_container(path)
    assert c.names() == [] and c.block_size == 512 and c.problems == []


def test_nested_groups_and_limits(tmp_path):
    path = tmp_path / "n.mfh5"
    c = create_container(path, format="hdf5", block_size=256)
    sub = c.make_nested("SUB")
    sub.create("x")
    sub.write("x", 0, b"inner" * 100)
    c.rename("SUB", "RENAMED")
    sub.write("x", 500, b"!")  # still the same nested container after the rename
    for bad in (HEADER, multihdf5.ORPHAN_PREFIX + "1", "a/b", ".."):
        with pytest.raises(CtdsfsError):
            c.create(bad)
    c.close()
    with h5py.File(path, "r") as f:
        # as casacore's nested MultiHDF5: the file group keeps its (unused) dataset
        assert sorted(f["RENAMED"]) == ["FileData", HEADER, "x"]
        assert f["RENAMED"][HEADER].attrs["blockSize"] == 256
    assert snapshot(open_container(path)) == {"RENAMED/": b"",
                                              "RENAMED/x": b"inner" * 100 + b"!"}
    many = create_container(tmp_path / "many.mfh5", format="hdf5", block_size=64)
    for i in range(multihdf5.MAX_SLOTS):
        many.create(f"f{i}")
    with pytest.raises(ContainerFull, match="at most 4000"):
        many.create("one-too-many")
    many.close()
    assert len(open_container(tmp_path / "many.mfh5").names()) == multihdf5.MAX_SLOTS


def test_unlinked_open_file_and_leftovers_of_a_dead_writer(tmp_path):
    path = tmp_path / "o.mfh5"
    c = create_container(path, format="hdf5", block_size=128)
    c.create("a")
    c.write("a", 0, b"A" * 300)
    key = c.remove("a", keep_open=True)
    c.write(key, 300, b"B")
    assert c.read(key, 0, 1000) == b"A" * 300 + b"B" and c.names() == []
    c.commit()
    c.abandon()  # the writer dies before releasing it
    with h5py.File(path, "r") as f:
        assert any(k.startswith(multihdf5.ORPHAN_PREFIX) for k in f)
    again = open_container(path, writable=True)  # the next writer drops it
    again.close()
    with h5py.File(path, "r") as f:
        assert list(f) == [HEADER]


LEFT_OPEN = """
import sys, threading
from ctdsfs.formats import open_container

def keep(container):  # (a daemon thread's frame is never freed by the teardown)
    threading.Event().wait()

c = open_container(sys.argv[1], writable=True)
c.write("hello.txt", 0, b"HELLO")
threading.Thread(target=keep, args=(c,), daemon=True).start()
"""


def test_a_file_left_open_at_exit_ends_the_process_cleanly(tmp_path):
    """A writer still open when its process ends (kept by a daemon thread here; by fsspec's
    instance cache in a test run): the process exits with status 0, not SIGSEGV in HDF5's
    own exit handler, and what was not committed stays uncommitted."""
    path = tmp_path / "open.mfh5"
    shutil.copy(DATA / "mh5_basic.mfh5", path)
    result = subprocess.run([sys.executable, "-c", LEFT_OPEN, str(path)], capture_output=True,
                            text=True, timeout=60, cwd=Path(__file__).parents[3])
    assert (result.returncode, result.stderr) == (0, "")
    assert open_container(path).read("hello.txt", 0, 100) == b"hello"


def test_damaged_files_give_one_line(tmp_path):
    path = tmp_path / "cut.mfh5"
    data = (DATA / "mh5_basic.mfh5").read_bytes()
    path.write_bytes(data[:len(data) // 3])
    with pytest.raises(CtdsfsError) as exc:
        open_container(path)
    assert "not a readable HDF5 file" in str(exc.value) and "\n" not in str(exc.value)
    result = subprocess.run(["ctdsfs", "check", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr \
        and "internal error" not in result.stderr


def test_inconsistent_headers(tmp_path):
    path = tmp_path / "bad.mfh5"
    shutil.copy(DATA / "mh5_basic.mfh5", path)
    with h5py.File(path, "r+") as f:
        f["__MultiHDF5_Header__"].attrs["sizes"] = np.array([0, 10 ** 9, 5], np.int64)
    c = open_container(path)
    assert c.names() == ["empty.bin", "hello.txt"]
    assert "larger than its 4 rows" in c.problems[0]
    c.close()
    with h5py.File(path, "r+") as f:  # hostile names: hidden, the rest still served
        f["__MultiHDF5_Header__"].attrs["names"] = np.array(
            ["..", "__MultiHDF5_Header__", "hello.txt"], dtype=h5py.string_dtype("ascii"))
        f["__MultiHDF5_Header__"].attrs["sizes"] = np.array([0, 0, 5], np.int64)
    c = open_container(path)
    assert c.names() == ["hello.txt"] and len(c.problems) == 2
    assert "reserved name" in c.problems[0] and "reserved name" in c.problems[1]
    c.close()
    with pytest.raises(CtdsfsError, match="damaged entries"):
        open_container(path, writable=True)
    with h5py.File(path, "r+") as f:
        del f["__MultiHDF5_Header__"].attrs["blockSize"]
    with pytest.raises(CtdsfsError, match="not a casacore MultiHDF5"):
        open_container(path)


@pytest.mark.fuse
def test_mount_and_legacy_view(mount, tmp_path):
    m = mount(DATA / "mh5_basic.mfh5")
    for name in ("data10000.bin", "hello.txt", "empty.bin"):
        assert (m.mountpoint / name).read_bytes() == (DATA / "inputs" / name).read_bytes()
    src = tmp_path / "src"
    shutil.copytree(DATA / "t_mh5.tab", src / "t.tab")
    view = mount(src)
    assert "table.mfh5" not in os.listdir(view.mountpoint / "t.tab")
    out = subprocess.run(["taql", f"select A, S, D from {view.mountpoint / 't.tab'}"],
                         capture_output=True, text=True, check=True).stdout
    assert "10 selected rows" in out or "select result of 10 rows" in out
    for r in (0, 4, 9):
        assert f"{r}\t{r}\t" in out  # A and S columns: A=r, S=str(r)


@pytest.mark.fuse
@pytest.mark.tools
def test_casacore_3_5_writes_a_multihdf5_table_through_the_view(mount, tmp_path):
    """taql 3.5 updates casacore 3.8's MultiHDF5 table through the view; the changes land in
    table.mfh5 and table.dat keeps the MultiHDF5 storage option."""
    src = tmp_path / "src"
    shutil.copytree(DATA / "t_mh5.tab", src / "t.tab")
    m = mount(src, options=["rw"])
    view = m.mountpoint / "t.tab"
    for query in (f"update {view} set A=A+100, S='changed' where A<3",
                  f"insert into {view} (A, S) values (777, 'new row')"):
        subprocess.run(["taql", query], check=True, capture_output=True)
    assert m.close() == 0
    table = src / "t.tab"
    assert "table.f0" not in os.listdir(table)
    stored = decode_table_dat((table / "table.dat").read_bytes())
    assert stored.storage == "MultiHDF5" and stored.nrow == 11
    again = mount(src)
    out = subprocess.run(["taql", f"select A, S from {again.mountpoint / 't.tab'}"],
                         capture_output=True, text=True, check=True).stdout
    assert "100\tchanged" in out and "102\tchanged" in out and "3\t3" in out
    assert "777\tnew row" in out


FUZZ = """
import json, os, random, shutil, sys
import h5py
from ctdsfs.blockmap import block_map
from ctdsfs.formats import open_container
from ctdsfs.errors import CtdsfsError
from ctdsfs.formats.check import check_multihdf5
from tests.formats.multihdf5 import hdf5_mutations as mutations

source, work, seed, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
original = open(source, "rb").read()
with h5py.File(source, "r") as f:
    mutations.plant_secrets(work, int(f[mutations.HEADER].attrs["blockSize"]))
rng = random.Random(seed)
out = {"served": 0, "refused": 0, "escaped": [], "leaked": [], "called_clean": []}

def walk(c):
    for name in c.names():
        child = c.nested(name)
        if child is not None:
            walk(child)
            continue
        try:
            if mutations.MARKER in c.read(name, 0, 1 << 20):
                out["leaked"].append(f"case {case}: {c.label}/{name}")
        except CtdsfsError:
            pass  # one unreadable file: EIO for it, the rest still served

for case in range(cases):
    path = os.path.join(work, f"case{case}.mfh5")
    shutil.copy(source, path)
    mutation = rng.choice(mutations.STRUCTURAL) if rng.random() < 0.5 else None
    if mutation:
        mutations.mutate(path, mutation, rng, work)
    flips = 0 if mutation and rng.random() < 0.5 else rng.randrange(1, 9)
    data = bytearray(open(path, "rb").read())
    metadata = mutations.metadata_offsets(path) if flips else []
    for _ in range(flips):  # mostly in HDF5's structures, where the library is tested
        where = rng.choice(metadata) if rng.random() < 0.8 else rng.randrange(len(data))
        data[where] ^= rng.randrange(1, 256)
    open(path, "wb").write(data)
    what = f"case {case}: {mutation.__name__ if mutation else ''} {flips} flips"
    print(what, file=sys.stderr, flush=True)  # the last line names a case that killed us
    try:
        c = open_container(path)
        walk(c)
        c.describe()
        block_map(c)
        problems = check_multihdf5(c)[0]
        c.close()
        if mutation in mutations.ESCAPES and not flips and not problems:
            out["called_clean"].append(what)
        out["served"] += 1
    except CtdsfsError as exc:
        assert "\\n" not in str(exc)
        out["refused"] += 1
    except Exception as exc:
        out["escaped"].append(f"{what}: {type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


@pytest.mark.parametrize("source", ["mh5_basic", "t_mh5", "nested"])
def test_random_corruptions_are_refused_or_served_never_escape(tmp_path, source):
    """Bytes flipped and hostile HDF5 structures (external storage and links, virtual
    datasets, soft links, cycles, aliases, filters, huge dimensions) in casacore's files and
    a nested one: every failure is a one-line CtdsfsError or a hidden entry, no byte of the
    marker files planted beside it is ever served, and the reading process (a child, with a
    time limit) never dies by a signal or hangs: HDF5's crashes stay in ctdsfs's probe."""
    path = {"mh5_basic": DATA / "mh5_basic.mfh5", "t_mh5": DATA / "t_mh5.tab" / "table.mfh5",
            "nested": tmp_path / "nested.mfh5"}[source]
    if source == "nested":
        c = create_container(path, format="hdf5", block_size=512)
        sub = c.make_nested("SUB")
        deep = sub.make_nested("DEEP")
        for container, name in ((c, "a"), (c, "b"), (sub, "x"), (deep, "z")):
            container.create(name)
            container.write(name, 0, name.encode() * 700)
        c.close()
    env = dict(os.environ, **{hdf5_probe.TIME_LIMIT_ENV: "3"})
    try:
        result = subprocess.run([sys.executable, "-c", FUZZ, str(path), str(tmp_path), "11",
                                 "32"], capture_output=True, text=True, timeout=150, env=env,
                                cwd=Path(__file__).parents[3])
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"hung; the last case begun: {stderr.strip().splitlines()[-1:]}")
    assert result.returncode == 0, result.stderr[-2000:]
    outcomes = json.loads(result.stdout)
    assert outcomes["escaped"] == [] and outcomes["leaked"] == []
    assert outcomes["called_clean"] == []
    assert outcomes["served"] > 0 and outcomes["refused"] > 0, outcomes
