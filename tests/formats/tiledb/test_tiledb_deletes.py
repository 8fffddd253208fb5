"""Deletes (``__commits/NAME.del``) applied in sparse/ as libtiledb applies them, compared
with ``A.query(order='G')[:]`` of tiledb-py on arrays it writes and deletes from here
(int, float and datetime dimensions, nullable and var-sized attributes, duplicates,
several deletes at several times, with time travel)."""

import io
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest
import tiledb

from ctdsfs.errors import BlockError, FormatError
from ctdsfs.formats.tiledb.array import open_file
from ctdsfs.formats.tiledb.deletes import parse_condition

SMALL_BUFFERS = tiledb.Config({"sm.consolidation.buffer_size": 100000})


def load(view, name):
    return np.load(io.BytesIO(bytes(view.read(name, 0, 1 << 30))))


def assert_same(uri, ts=None):
    """sparse/ of the array (at ``ts``) holds what tiledb-py reads, field by field."""
    array = open_file(uri, timestamp=None if ts is None else (0, ts))
    assert array.not_shown() == []
    view = array.nested("sparse")
    with tiledb.open(uri, timestamp=ts) as A:
        ref = A.query(order="G")[:]
        schema = A.schema
    for field in [d for d in schema.domain] + [a for a in schema]:
        want = ref[field.name]
        if getattr(field, "isvar", False):
            offsets = load(view, f"{field.name}.offsets.npy")
            data = bytes(view.read(f"{field.name}.data", 0, 1 << 30))
            got = [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
            valid = load(view, f"{field.name}.validity.npy") == 1 if field.isnullable \
                else np.ones(len(got), bool)
            assert [g if v else None for g, v in zip(got, valid)] == \
                [None if m else w for w, m in zip(np.ma.getdata(want),
                                                 np.ma.getmaskarray(want))], (ts, field.name)
        else:
            got = load(view, f"{field.name}.npy")
            assert got.dtype == want.dtype and np.array_equal(got, want), (ts, field.name)
    return len(ref[schema.domain.dim(0).name])


@pytest.fixture(scope="module")
def deleted_uri(tmp_path_factory):
    """Three writes of 12 cells (overlapping coordinates, newest wins) and three deletes
    between and after them."""
    uri = str(tmp_path_factory.mktemp("deletes") / "a")
    dom = tiledb.Domain(
        tiledb.Dim("x", domain=(0, 99), tile=10, dtype=np.int64),
        tiledb.Dim("t", domain=(np.datetime64(0, "ms"), np.datetime64(10**6, "ms")),
                   tile=1000, dtype="datetime64[ms]"))
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=dom, sparse=True, capacity=3,
        attrs=[tiledb.Attr("v", dtype=np.float64),
               tiledb.Attr("s", dtype=str, var=True, nullable=True)]))
    rng = np.random.default_rng(1)
    for t in (10, 20, 30):
        cells = rng.choice(36, 12, replace=False)
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[cells // 3, ((cells % 3) * 500).astype("datetime64[ms]")] = {
                "v": rng.random(12) * 10,
                "s": np.array([["a", "b", "cc", None][i % 4] for i in range(12)], object)}
    for t, cond in ((15, "v > 7.5"), (25, "s == 'b' or x < 3"),
                    (35, "s < 'c' and v >= 2.0")):
        with tiledb.open(uri, "d", timestamp=t) as A:
            A.query(cond=cond).submit()
    return uri


def test_deletes_at_every_time(deleted_uri):
    counts = [assert_same(deleted_uri, ts) for ts in (12, 15, 22, 25, 32)]
    assert counts[0] > counts[1] and assert_same(deleted_uri) < 36


def test_a_delete_removes_the_newest_write_only(tmp_path):
    """x=1 holds 5, then 10: a delete of a > 8 removes it (the 5 does not come back);
    x=2 holds 10, then 5: the 5 stays. A write at the delete's own time is deleted too."""
    uri = str(tmp_path / "newest")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("x", domain=(0, 9), tile=5, dtype=np.int32)),
        sparse=True, attrs=[tiledb.Attr("a", dtype=np.int32)]))
    for t, xs, values in ((10, [1, 2], [5, 10]), (15, [1, 2], [10, 5]), (20, [3], [30])):
        with tiledb.open(uri, "w", timestamp=t) as A:
            A[np.array(xs, np.int32)] = np.array(values, np.int32)
    with tiledb.open(uri, "d", timestamp=20) as A:
        A.query(cond="a > 8").submit()
    assert assert_same(uri) == 1
    assert assert_same(uri, 19) == 2


@pytest.mark.parametrize("cond", ["n > 2", "s == None", "s != None", "s < 'b'", "s == 'c'",
                                  "y >= 0.5 or n == 1"])
def test_deletes_with_duplicates_and_nulls(tmp_path, cond):
    """Duplicates kept; a null fails every comparison stored (tiledb-py stores the
    negated condition: null cells are deleted unless the condition says null)."""
    uri = str(tmp_path / "dups")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("y", domain=(-1.0, 1.0), tile=0.5,
                                        dtype=np.float32)),
        sparse=True, allows_duplicates=True,
        attrs=[tiledb.Attr("n", dtype=np.int16),
               tiledb.Attr("s", dtype=str, var=True, nullable=True)]))
    with tiledb.open(uri, "w", timestamp=10) as A:
        A[np.array([0.1, 0.1, -0.5, 0.7, 0.9], np.float32)] = {
            "n": np.array([1, 2, 3, 4, 5], np.int16),
            "s": np.array(["a", None, "c", "", None], dtype=object)}
    with tiledb.open(uri, "d", timestamp=20) as A:
        A.query(cond=cond).submit()
    assert_same(uri)


def test_consolidated_with_deletes(deleted_uri, tmp_path):
    """A fragment consolidated with deletes keeps, per cell, when a delete removed it and
    which deletes it processed; a delete after the consolidation still applies to it,
    and to what is left after vacuuming."""
    uri = str(tmp_path / "consolidated")
    shutil.copytree(deleted_uri, uri)
    tiledb.consolidate(uri, config=SMALL_BUFFERS)
    with tiledb.open(uri, "d", timestamp=45) as A:
        A.query(cond="v < 1.5").submit()
    assert any(open_file(uri).fragment(n)._load_meta().has_delete_meta
               for n in open_file(uri).fragment_names)
    counts = [assert_same(uri, ts) for ts in (12, 22, 32, 40)]
    assert counts[-1] > assert_same(uri)
    tiledb.vacuum(uri)
    assert len(open_file(uri).fragment_names) == 1
    for ts in (22, None):
        assert_same(uri, ts)
    info = subprocess.run(["ctdsfs", "info", uri], capture_output=True, text=True,
                          check=True).stdout
    assert "not shown" not in info


def test_deletes_in_consolidated_commits(deleted_uri, tmp_path):
    """Commits consolidated (``sm.consolidation.mode=commits``) and vacuumed: the deletes
    live on only inside the ``.con`` file, each after its line."""
    uri = str(tmp_path / "commits")
    shutil.copytree(deleted_uri, uri)
    tiledb.consolidate(uri, config=tiledb.Config({"sm.consolidation.mode": "commits"}))
    tiledb.vacuum(uri, config=tiledb.Config({"sm.vacuum.mode": "commits"}))
    commits = os.listdir(os.path.join(uri, "__commits"))
    assert [n for n in commits if n.endswith(".con")] and \
        not [n for n in commits if n.endswith(".del")]
    for ts in (15, 25, None):
        assert_same(uri, ts)


def value_node(op, name, value):
    return struct.pack("<BBI", 1, op, len(name)) + name + struct.pack("<Q", len(value)) + value


@pytest.mark.parametrize("body, says", [
    (b"\x00\x00" + struct.pack("<Q", 1) * 70, "truncated"),  # (not enough bytes left)
    (b"".join(b"\x00\x02" + struct.pack("<Q", 1) for _ in range(70))
     + value_node(0, b"a", b"\0" * 4), "deeper than 64"),
    (b"\x00\x02" + struct.pack("<Q", 2) + value_node(0, b"a", b"") * 2, "NOT with 2"),
    (b"\x00\x00" + struct.pack("<Q", 1 << 60), "exceeds"),
    (b"\x02", "node type 2"),
    (value_node(9, b"a", b""), "comparison 9"),
    (value_node(0, b"a", b"") + b"x", "bytes after"),
])
def test_hostile_conditions_are_one_line_errors(body, says):
    with pytest.raises(FormatError, match=says):
        parse_condition(body, "A: __commits/x.del")


def test_a_damaged_delete_is_eio_for_sparse_reads(deleted_uri, tmp_path):
    uri = str(tmp_path / "damaged")
    shutil.copytree(deleted_uri, uri)
    delete = next(n for n in os.listdir(os.path.join(uri, "__commits")) if n.endswith(".del"))
    path = os.path.join(uri, "__commits", delete)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    view = open_file(uri).nested("sparse")
    with pytest.raises(BlockError, match=delete):
        view.read("x.npy", 0, 100)
