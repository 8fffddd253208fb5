"""One damaged fragment beside healthy ones, for every file a fragment has (its metadata
truncated, zeroed, flipped or missing; a data, var data, offsets, validity or coordinates file
missing or truncated; its commit file missing), in a dense and a sparse array: the
array's root still lists, the healthy fragments read as tiledb-py reads them, the
damaged fragment's files and every view file that needs it are EIO (the mount logs one
line, never a traceback) while the views still list, through the container API and
through a real mount."""

import errno
import io
import json
import os
import random
import shutil

import numpy as np
import pytest
import tiledb

from ctdsfs.errors import BlockError
from ctdsfs.formats import open_container

DENSE_WRITES = ((1, 0, 30), (2, 20, 40), (3, 50, 60))  # (timestamp, first, stop): tiles of 10
SPARSE_WRITES = ((1, 0, 30), (2, 20, 40), (3, 50, 60))  # keys k00.. (the newest write wins)


def cells(t, first, stop):
    n = stop - first
    return {"v": np.arange(first, stop, dtype=np.float64) * t,
            "t": np.array([f"{t}:{i}" * (i % 4) for i in range(first, stop)], dtype=object),
            "m": np.ma.masked_array(np.arange(first, stop, dtype=np.int32) + 100 * t,
                                    mask=np.arange(n) % 3 == 0)}


def attributes():
    return [tiledb.Attr("v", dtype=np.float64, filters=tiledb.FilterList([tiledb.ZstdFilter()])),
            tiledb.Attr("t", dtype=str, var=True),
            tiledb.Attr("m", dtype=np.int32, nullable=True)]


def write_dense(uri):
    """1-D, tile-aligned writes: a fragment's tiles are exactly the cells it wrote."""
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 59), tile=10, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=False, attrs=attributes()))
    for t, first, stop in DENSE_WRITES:
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[first:stop] = cells(t, first, stop)


def write_sparse(uri):
    """One string dimension (the view reads every fragment's domain to list itself)."""
    dom = tiledb.Domain(tiledb.Dim("s", dtype="ascii"))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True, capacity=8,
                                                attrs=attributes()))
    for t, first, stop in SPARSE_WRITES:
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[np.array([f"k{i:02d}" for i in range(first, stop)], dtype=object)] = \
                cells(t, first, stop)


# damage -> (file of the fragment, what is done to it, the fragment's files that are then
# EIO (None: its metadata cannot be read, only fragment.json and raw/ are shown), the
# view's files that are then EIO (None: every one))
DAMAGES = {
    "metadata truncated": ("__fragment_metadata.tdb", "truncate", None, None),
    "metadata zeroed": ("__fragment_metadata.tdb", "zero", None, None),
    "metadata flipped": ("__fragment_metadata.tdb", "flip", None, None),
    "metadata missing": ("__fragment_metadata.tdb", "remove", None, None),
    "values missing": ("a0.tdb", "remove", ["v.npy"], ["v.npy"]),
    "values truncated": ("a0.tdb", "truncate", ["v.npy"], ["v.npy"]),
    "var data missing": ("a1_var.tdb", "remove", ["t.data"], ["t.offsets.npy", "t.data"]),
    "var data truncated": ("a1_var.tdb", "truncate", ["t.data"], ["t.offsets.npy", "t.data"]),
    "offsets missing": ("a1.tdb", "remove", ["t.offsets.npy"], ["t.offsets.npy", "t.data"]),
    "offsets truncated": ("a1.tdb", "truncate", ["t.offsets.npy"],
                          ["t.offsets.npy", "t.data"]),
    "validity missing": ("a2_validity.tdb", "remove", ["m.validity.npy"], ["m.validity.npy"]),
    "validity truncated": ("a2_validity.tdb", "truncate", ["m.validity.npy"],
                           ["m.validity.npy"]),
    "coordinates missing": ("d0_var.tdb", "remove", ["s.data"], None),
    "coordinates truncated": ("d0.tdb", "truncate", ["s.offsets.npy"], None),
    "commit missing": ("__commits", "uncommit", [], []),
}
VIEW_FILES = {"dense": ["v.npy", "t.offsets.npy", "t.data", "m.npy", "m.validity.npy"],
              "sparse": ["s.offsets.npy", "s.data", "v.npy", "t.offsets.npy", "t.data", "m.npy",
                         "m.validity.npy"]}


def spoil(uri, fragment, file_name, how):
    """Damage ``file_name`` of ``fragment`` (the oldest: every view needs it)."""
    if how == "uncommit":
        os.unlink(uri / "__commits" / f"{fragment}.wrt")
        return
    path = uri / "__fragments" / fragment / file_name
    data = bytearray(path.read_bytes())
    if how == "remove":
        path.unlink()
        return
    if how == "truncate":
        data = data[:len(data) // 2]
    elif how == "zero":
        data = bytearray(len(data))
    else:  # (the footer's length, its last u64, grows by 2**60)
        data[-1] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Both arrays as tiledb-py wrote them, with what tiledb-py reads of every fragment
    and of the whole array: {kind: (path, {fragment: cells}, whole array)}."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for kind, write in (("dense", write_dense), ("sparse", write_sparse)):
        uri = root / kind
        write(str(uri))
        refs = {}
        folder = open_container(str(uri)).nested("fragments")
        for name in folder.names():
            frag = folder.nested(name)
            domain = json.loads(frag.read("fragment.json", 0, 1 << 20))["non_empty_domain"]
            refs[name] = fragment_cells(str(uri), name, domain)
        out[kind] = uri, refs
    return out


@pytest.fixture(scope="module")
def damaged(pristine, tmp_path_factory):
    """A tree of one copy of each array per damage, the oldest fragment damaged."""
    tree = tmp_path_factory.mktemp("damaged")
    cases = []
    for kind, (uri, refs) in pristine.items():
        oldest = sorted(refs)[0]
        for damage, (file_name, how, _, _) in DAMAGES.items():
            if file_name.startswith("d0") and kind == "dense":
                continue  # (a dense fragment stores no coordinates)
            case = tree / f"{kind}-{damage.replace(' ', '-')}"
            shutil.copytree(uri, case)
            spoil(case, oldest, file_name, how)
            cases.append((case, kind, damage, oldest))
    return tree, cases


def fragment_cells(uri, name, domain):
    """What tiledb-py reads of one fragment, opened at its timestamps (nullable fields
    masked): the dense array over the fragment's domain, the sparse one whole."""
    t1, t2 = (int(p) for p in name.split("_")[2:4])
    with tiledb.open(uri, timestamp=(t1, t2)) as A:
        return A[domain[0][0]:domain[0][1] + 1] if isinstance(domain[0][0], int) else A[:]


def as_bytes(values):
    return [v if isinstance(v, bytes) else v.encode() for v in values]


def var_cells(read, folder, field):
    offsets = np.load(io.BytesIO(read(folder, f"{field}.offsets.npy")))
    data = read(folder, f"{field}.data")
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def assert_reads_as_tiledb(read, folder, ref, kind):
    """A healthy fragment's files hold what tiledb-py reads of it."""
    def npy(name):
        return np.load(io.BytesIO(read(folder, name)))
    assert np.array_equal(npy("v.npy"), ref["v"])
    assert var_cells(read, folder, "t") == as_bytes(ref["t"])
    assert np.array_equal(npy("m.npy"), ref["m"].data)
    assert np.array_equal(npy("m.validity.npy").astype(bool), ~np.ma.getmaskarray(ref["m"]))
    if kind == "sparse":
        assert var_cells(read, folder, "s") == as_bytes(ref["s"])


def check_case(read, listdir, is_eio, case, kind, damage, oldest, refs):
    """The rules of the module, through ``read(folder, name)``, ``listdir(folder)`` and
    ``is_eio(folder, name)`` (folders relative to the array)."""
    _, _, eio_files, eio_views = DAMAGES[damage]
    root = listdir("")
    assert {"schema.json", "fragments", kind} <= set(root), (case, root)
    assert json.loads(read("", "schema.json"))["array_type"] == kind
    shown = sorted(listdir("fragments"))
    healthy = [n for n in sorted(refs) if n != oldest]
    assert shown == ([] if damage == "commit missing" else [oldest]) + healthy, case
    for name in healthy:
        assert_reads_as_tiledb(read, f"fragments/{name}", refs[name], kind)
    if eio_files is None:  # (the metadata: fragment.json says why, raw/ shows the files)
        said = json.loads(read(f"fragments/{oldest}", "fragment.json"))
        assert "__fragment_metadata.tdb" in said["problem"], said
        assert "raw" in listdir(f"fragments/{oldest}")
    for name in eio_files or []:
        assert is_eio(f"fragments/{oldest}", name), (case, name)
    assert sorted(listdir(kind)) == sorted(VIEW_FILES[kind]), case  # (EIO: when read)
    for name in VIEW_FILES[kind] if eio_views is None else eio_views:
        assert is_eio(kind, name), (case, name)
    if damage == "commit missing":  # (tiledb-py leaves the fragment out too)
        with tiledb.open(str(case)) as A:
            whole = A[:] if kind == "dense" else A.query(order="G")[:]
        assert np.load(io.BytesIO(read(kind, "v.npy"))).tobytes() == whole["v"].tobytes()
        assert [c.rstrip(b"\0") for c in var_cells(read, kind, "t")] == \
            as_bytes(whole["t"])  # (tiledb-py drops the fill's trailing NUL)


def test_damaged_fragment_through_the_container_api(pristine, damaged):
    _, cases = damaged
    for case, kind, damage, oldest in cases:
        array = open_container(str(case))

        def folder_of(path, array=array):
            container = array
            for part in filter(None, path.split("/")):
                container = container.nested(part)
            return container

        def read(path, name):
            folder = folder_of(path)
            return bytes(folder.read(name, 0, folder.entry_size(name)))

        def is_eio(path, name):
            try:
                read(path, name)
            except BlockError as exc:
                assert "\n" not in str(exc)
                return True
            return False

        check_case(read, lambda path: folder_of(path).names(), is_eio, case, kind, damage,
                   oldest, pristine[kind][1])
        assert array.describe()["fragments"]  # (info and check say what is wrong, no more)
        problems, _ = array.check()
        assert problems or damage == "commit missing", case


@pytest.mark.parametrize("workers", [1, 2])
def test_damaged_fragment_through_a_mount(pristine, damaged, mount, workers):
    tree, cases = damaged
    m = mount(tree, [f"workers={workers}"])
    for case, kind, damage, oldest in cases:
        top = m.mountpoint / case.name

        def read(path, name, top=top):
            return (top / path / name).read_bytes()

        def is_eio(path, name, top=top):
            try:
                read(path, name)
            except OSError as exc:
                assert exc.errno == errno.EIO, (path, name, exc)
                return True
            return False

        check_case(read, lambda path, top=top: os.listdir(top / path), is_eio, case, kind,
                   damage, oldest, pristine[kind][1])
    log = m.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def test_random_damage_to_one_fragment_leaves_the_others(pristine, tmp_path):
    """Bytes of the oldest fragment's files set to 0, 0xFF or flipped, or a file cut
    short, at random: the root, fragments/ and the views still list, the other
    fragments read as tiledb-py reads them, reading anything else fails at most with a
    one-line EIO, and where the fragment's metadata cannot be read every file of the
    view is EIO (never merged without it)."""
    rng = random.Random(35)
    for round_ in range(40):
        kind = ("dense", "sparse")[round_ % 2]
        uri, refs = pristine[kind]
        oldest = sorted(refs)[0]
        case = tmp_path / f"r{round_}"
        shutil.copytree(uri, case)
        files = case / "__fragments" / oldest
        for step in range(rng.choice((1, 2, 4))):
            path = files / ("__fragment_metadata.tdb" if round_ % 4 < 2 and step == 0 else
                            rng.choice(sorted(os.listdir(files))))
            data = bytearray(path.read_bytes())
            if not data:
                continue
            at = rng.randrange(len(data))
            if rng.random() < 0.25:
                data = data[:at]
            else:
                data[at] = rng.choice((0, 0xFF, data[at] ^ (1 << rng.randrange(8))))
            path.write_bytes(bytes(data))
        array = open_container(str(case))
        assert {"schema.json", "fragments", kind} <= set(array.names())
        fragments = array.nested("fragments")
        assert fragments.names() == sorted(refs), case
        for name in sorted(refs)[1:]:
            frag = fragments.nested(name)
            assert_reads_as_tiledb(
                lambda _, file, frag=frag: bytes(frag.read(file, 0, frag.entry_size(file))),
                "", refs[name], kind)
        damaged = fragments.nested(oldest)
        unreadable = "problem" in json.loads(damaged.read("fragment.json", 0, 1 << 20))
        for folder in (damaged, array.nested(kind)):
            for name in folder.names():
                if folder.nested(name) is None:
                    try:
                        folder.read(name, 0, folder.entry_size(name))
                        assert not (unreadable and folder is not damaged), (case, name)
                    except BlockError as exc:
                        assert "\n" not in str(exc)
        shutil.rmtree(case)
