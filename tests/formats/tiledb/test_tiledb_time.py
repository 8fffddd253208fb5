"""Time travel (``-o timestamp=T`` or ``T1:T2``): dense/, sparse/, fragments/,
metadata.json and schema.json as ``tiledb.open(uri, timestamp=...)`` reads the array,
compared with tiledb-py on arrays it writes here at chosen timestamps."""

import io
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tiledb

from ctdsfs.formats.tiledb.array import open_file
from ctdsfs.mount import UsageError, parse_options

STAMPS = (10, 20, 30)
TRAVELS = (5, 10, 15, 20, 25, (15, 25), (20, 20), (11, 40), (21, 40))


def load(view, name):
    return np.load(io.BytesIO(bytes(view.read(name, 0, 1 << 30))))


def as_range(ts):
    return ts if isinstance(ts, tuple) else (0, ts)


def metadata(array):
    return {k: v["value"] for k, v in json.loads(array.read("metadata.json", 0, 1 << 20)).items()}


def partly_consolidate(uri):
    """The writes at 10 and 20 consolidated into one fragment, none vacuumed (small
    buffers: libtiledb's default ones take seconds to allocate)."""
    tiledb.consolidate(uri, config=tiledb.Config({"sm.consolidation.timestamp_start": 10,
                                                  "sm.consolidation.timestamp_end": 20,
                                                  "sm.consolidation.buffer_size": 100000}))


@pytest.fixture(scope="module")
def sparse_uri(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("time") / "sparse")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 99), tile=10, dtype=np.int64),
                        tiledb.Dim("y", domain=(-5.0, 5.0), tile=2.5, dtype=np.float64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=4,
        attrs=[tiledb.Attr("a", dtype=np.int32),
               tiledb.Attr("s", dtype=str, var=True, nullable=True)]))
    for t in STAMPS:
        with tiledb.open(uri, "w", timestamp=t) as A:
            xs = np.array([1, 2, t // 10 + 3, 50 + t])
            A[xs, np.array([0.5, -1.0, 2.0, 4.5])] = {
                "a": np.full(4, t, np.int32), "s": np.array([f"w{t}-{i}" for i in range(4)])}
        with tiledb.open(uri, "w", timestamp=t) as A:
            A.meta[f"k{t}"] = t
            A.meta["last"] = t
    partly_consolidate(uri)
    return uri


def test_sparse_at_timestamps(sparse_uri):
    for ts in TRAVELS:
        array = open_file(sparse_uri, timestamp=as_range(ts))
        view = array.nested("sparse")
        with tiledb.open(sparse_uri, timestamp=ts) as A:
            ref = A.query(order="G")[:]
            assert metadata(array) == dict(A.meta), ts
        for name in ("x", "y", "a"):
            got = load(view, f"{name}.npy")
            assert got.dtype == ref[name].dtype and np.array_equal(got, ref[name]), (ts, name)
        offsets = load(view, "s.offsets.npy")
        data = bytes(view.read("s.data", 0, 1 << 20))
        assert [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])] == \
            list(ref["s"]), ts


def test_fragments_in_the_range(sparse_uri):
    def shown(ts):
        names = open_file(sparse_uri, timestamp=ts).nested("fragments").names()
        return sorted(tuple(int(p) for p in n.split("_")[2:4]) for n in names)
    assert shown((0, 15)) == [(10, 10), (10, 20)]  # (the consolidated one by its cells)
    assert shown((21, 40)) == [(30, 30)]
    assert shown((0, 5)) == []
    assert shown((0, 99)) == [(10, 10), (10, 20), (20, 20), (30, 30)]
    info = subprocess.run(["ctdsfs", "info", "--timestamp", "21:40", sparse_uri],
                          capture_output=True, text=True, check=True).stdout
    assert "1 fragment(s)" in info and "metadata keys    k30, last" in info


def test_dense_at_timestamps(tmp_path):
    """A consolidated dense fragment keeps no per-cell timestamps: libtiledb reads it only
    where the range holds it whole, the fragments it merged elsewhere."""
    uri = str(tmp_path / "dense")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 19), tile=5, dtype=np.int64),
                        tiledb.Dim("y", domain=(1, 4), tile=2, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, cell_order="col-major",
        attrs=[tiledb.Attr("a", dtype=np.float32),
               tiledb.Attr("n", dtype=np.int16, nullable=True)]))
    for k, t in enumerate(STAMPS):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[3 * k:3 * k + 8, 2:4] = {"a": np.full((8, 2), t, np.float32),
                                       "n": np.full((8, 2), t, np.int16)}
    partly_consolidate(uri)
    for ts in TRAVELS:
        view = open_file(uri, timestamp=as_range(ts)).nested("dense")
        with tiledb.open(uri, timestamp=ts) as A:
            ref = A[:]
        assert np.array_equal(load(view, "a.npy"), ref["a"], equal_nan=True), ts
        valid = load(view, "n.validity.npy") == 1
        assert np.array_equal(valid, ~np.ma.getmaskarray(ref["n"])), ts
        assert np.array_equal(load(view, "n.npy")[valid], np.ma.compressed(ref["n"])), ts


def test_schema_at_timestamp(tmp_path):
    """An attribute added by a later schema is not in the schema (nor dense/) of the
    array before it; before the first schema, the first is read."""
    uri = str(tmp_path / "evolved")
    dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=5, dtype=np.int64))
    tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, attrs=[
        tiledb.Attr("a", dtype=np.int64)]))
    with tiledb.open(uri, "w", timestamp=10) as A:
        A[0:10] = np.arange(10)
    created = open_file(uri).schema_names[0]
    created = int(created.split("_")[2])
    evolution = tiledb.ArraySchemaEvolution()
    evolution.add_attribute(tiledb.Attr("b", dtype=np.int32, fill=7))
    evolution.timestamp(created + 100)
    evolution.array_evolve(uri)
    for ts, names in ((20, ["a"]), (created + 50, ["a"]), (created + 100, ["a", "b"])):
        array = open_file(uri, timestamp=(0, ts))
        fields = [a["name"] for a in json.loads(array.read("schema.json", 0, 1 << 20))
                  ["attributes"]]
        with tiledb.open(uri, timestamp=ts) as A:
            assert [A.schema.attr(i).name for i in range(A.schema.nattr)] == names
        assert fields == names
        assert sorted(n[:-4] for n in array.nested("dense").names()) == names


def test_group_at_timestamp(sparse_uri, tmp_path):
    """A group's own metadata as ``tiledb.Group`` opened at the time reads it, its arrays
    at that time too."""
    uri = str(tmp_path / "group")
    tiledb.Group.create(uri)
    for t in (10, 20):
        group = tiledb.Group(uri, "w", config=tiledb.Config({"sm.group.timestamp_end": t}))
        group.meta[f"g{t}"] = t
        group.close()
    shutil.copytree(sparse_uri, os.path.join(uri, "member"))
    for ts in (15, 25):
        shown = open_file(uri, timestamp=(0, ts))
        group = tiledb.Group(uri, "r", config=tiledb.Config({"sm.group.timestamp_end": ts}))
        assert metadata(shown) == dict(group.meta)
        group.close()
        member = shown.nested("member")
        with tiledb.open(os.path.join(uri, "member"), timestamp=ts) as A:
            assert metadata(member) == dict(A.meta)


def test_mount_option_and_refusals(sparse_uri, mount, tmp_path):
    m = mount(sparse_uri, options=["timestamp=15"])
    with tiledb.open(sparse_uri, timestamp=15) as A:
        assert np.array_equal(np.load(m.mountpoint / "sparse" / "a.npy"),
                              A.query(order="G")[:]["a"])
    assert len(list((m.mountpoint / "fragments").iterdir())) == 2
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    for source, option, says in ((plain, "timestamp=15", "this tree shows none"),
                                 (plain / "missing.npy", "timestamp=15", "for TileDB arrays")):
        result = subprocess.run(["mount.ctdsfs", str(source), str(tmp_path / "empty"),
                                 "-o", option], capture_output=True, text=True, timeout=60)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and says in lines[0], result.stderr
    for option in ("timestamp=20:10", "timestamp=soon", "timestamp=-5", "timestamp"):
        with pytest.raises(UsageError, match="needs T or T1:T2"):
            parse_options(option)
    assert parse_options("timestamp=7:9").timestamp == (7, 9)


def test_check_at_timestamp(sparse_uri, tmp_path):
    """A damaged fragment outside the range is not read: check at the time is clean."""
    uri = str(tmp_path / "damaged")
    shutil.copytree(sparse_uri, uri)
    old = next(n for n in os.listdir(os.path.join(uri, "__fragments"))
               if n.startswith("__10_10_"))
    data = os.path.join(uri, "__fragments", old, "a0.tdb")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 3)
    whole = subprocess.run(["ctdsfs", "check", "--quiet", uri], capture_output=True, text=True)
    assert whole.returncode == 1 and old in whole.stdout
    later = subprocess.run(["ctdsfs", "check", "--quiet", "--timestamp", "21:40", uri],
                           capture_output=True, text=True)
    assert later.returncode == 0, later.stdout + later.stderr
    (tmp_path / "plain").mkdir()
    plain = subprocess.run(["ctdsfs", "check", "--timestamp", "5", str(tmp_path / "plain")],
                           capture_output=True, text=True)
    assert plain.returncode == 1 and "this tree shows none" in plain.stdout
    tree = subprocess.run(["ctdsfs", "check", "--quiet", "--timestamp", "21:40", str(tmp_path)],
                          capture_output=True, text=True)  # (a tree holding the array)
    assert tree.returncode == 0, tree.stdout + tree.stderr
