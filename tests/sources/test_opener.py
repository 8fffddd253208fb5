"""One opener, views on every table: a MeasurementSet python-casacore 3.8 stored as MultiFile
(every table a ``table.mf``) and packed by ``ctdsfs pack`` (the README's two steps) reads in
casacore 3.5 through a mount, and with ``-o columns`` gives getcol's arrays, as the same MS
mounted as a directory does; the fsspec filesystem shows what the mount shows for a
directory and an ``s3://`` prefix; ``ctdsfs info/ls/check`` take every kind of source."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import casacore.tables as ct
import fsspec
import numpy as np
import pytest

from ctdsfs.formats import open_container
from ctdsfs.formats.multifile.container import MultiFile
from ctdsfs.io.store import VirtualFileStore
from ctdsfs.sources.opener import open_source
from ctdsfs.toolbox import pack

from ..conftest import BUCKET
from ..formats.casacore.test_columns import write_table
from ..remote.test_remote import run, tree
from ..servers import CREDENTIALS

pytestmark = [pytest.mark.fuse, pytest.mark.tools]

LEGACY_PYTHON = "/usr/bin/python3"  # Debian's python3-casacore: casacore 3.5
PACKED = ("obs.mf", "obs.mfh5")  # the MultiFile MS packed into a MultiFile, a MultiHDF5

# Every column of every table (the main table and each subtable directory), as digests:
# getcol, or getvarcol where the cells differ in shape, or None where neither reads.
DUMP = r"""
import hashlib, json, os, sys
import numpy as np, casacore.tables as t

def digest(value):
    if isinstance(value, dict):
        return {key: digest(cell) for key, cell in sorted(value.items())}
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value
    array = np.ascontiguousarray(value)
    return [array.dtype.str, list(array.shape), hashlib.sha1(array.tobytes()).hexdigest()]

def dump(path):
    table = t.table(path, ack=False)
    columns = {}
    for name in table.colnames():
        try:
            columns[name] = digest(table.getcol(name))
        except RuntimeError:
            try:
                columns[name] = digest(table.getvarcol(name))
            except RuntimeError:
                columns[name] = None
    rows = table.nrows()
    table.close()
    return {"rows": rows, "columns": columns}

root = sys.argv[1]
tables = {"": dump(root)}
for name in sorted(os.listdir(root)):
    if os.path.isfile(os.path.join(root, name, "table.dat")):
        tables[name] = dump(os.path.join(root, name))
print(json.dumps(tables, sort_keys=True))
"""


def dump(table, python=sys.executable):
    result = subprocess.run([python, "-c", DUMP, str(table)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def ms(tmp_path_factory):
    """The MS python-casacore 3.8 stored as MultiFile, packed into a MultiFile and into a
    MultiHDF5, and what casacore 3.8 reads of every table of it."""
    where = tmp_path_factory.mktemp("opener")
    directory = Path(write_table(where / "mf.ms", "ms", "600", multifile=True))
    assert (directory / "ANTENNA" / "table.mf").is_file()
    pack(str(directory), str(where / "obs.mf"), quiet=True)
    pack(str(directory), str(where / "obs.mfh5"), format="hdf5", quiet=True)
    return SimpleNamespace(directory=directory, where=where, expected=dump(directory))


def table_names(expected):
    return [name for name in expected if name]


@pytest.mark.parametrize("packed", PACKED)
def test_casacore_3_5_reads_every_table_of_the_packed_multifile_ms(mount, ms, packed):
    m = mount(ms.where / packed)
    assert "table.mf" not in os.listdir(m.mountpoint / "ANTENNA")  # the legacy view
    got = dump(m.mountpoint, python=LEGACY_PYTHON)
    assert got == ms.expected
    assert len(table_names(got)) >= 10 and got[""]["columns"]["DATA"] is not None
    shown = subprocess.run(["showtableinfo", f"in={m.mountpoint / 'ANTENNA'}"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "read returned a bad value" not in shown.stdout


def columns_files(root):
    """{table: {file: bytes}} of every columns/ under ``root``."""
    return {str(folder.parent.relative_to(root)): {f.name: f.read_bytes()
                                                  for f in folder.iterdir()}
            for folder in [root / "columns", *root.glob("*/columns")]}


@pytest.mark.parametrize("packed", PACKED)
def test_columns_of_every_table_of_the_packed_ms_as_getcol(mount, ms, packed):
    shown = columns_files(mount(ms.where / packed, ["columns"]).mountpoint)
    assert shown == columns_files(mount(ms.directory, ["columns"]).mountpoint)
    assert set(shown) == {"."} | set(table_names(ms.expected))
    compared = 0
    for table, files in shown.items():
        with ct.table(str(ms.directory / table), ack=False) as reference:
            for name in reference.colnames():
                if f"{name}.npy" in files:
                    expected = reference.getcol(name)
                    got = np.load(io.BytesIO(files[f"{name}.npy"]))
                    assert got.dtype == expected.dtype, (table, name)
                    if reference.nrows() == 0:  # (getcol gives (0,) for an empty array column)
                        assert got.size == expected.size == 0, (table, name)
                    else:
                        np.testing.assert_array_equal(got, expected, err_msg=f"{table} {name}")
                    compared += 1
                elif f"{name}.data" in files:
                    offsets = np.load(io.BytesIO(files[f"{name}.offsets.npy"]))
                    data = files[f"{name}.data"]
                    assert [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])] \
                        == reference.getcol(name), (table, name)
                    compared += 1
    assert compared > 100


def fsspec_tree(fs):
    """What ``tree`` gives of a mount, from the fsspec filesystem."""
    out = {}
    for folder, dirs, files in fs.walk(""):
        prefix = f"{folder}/" if folder else ""
        out.update({prefix + d + "/": b"" for d in dirs})
        out.update({prefix + f: fs.cat_file(prefix + f) for f in files})
    return out


@pytest.mark.parametrize("source", ["directory", "obs.mf"])
def test_fsspec_shows_what_the_mount_shows(mount, ms, source):
    path = ms.directory if source == "directory" else ms.where / source
    for columns in (False, True):
        fs = fsspec.filesystem("ctdsfs", fo=str(path), columns=columns, skip_instance_cache=True)
        m = mount(path, ["columns"] if columns else [])
        shown = tree(m.mountpoint)
        assert fsspec_tree(fs) == shown
        assert ("ANTENNA/columns/POSITION.npy" in shown) == columns
        assert "ANTENNA/table.f0" in shown and "ANTENNA/table.mf" not in shown


@pytest.fixture(scope="module")
def prefix(seaweed, ms):
    """The MS directory under ``opener/mf.ms/`` in the session's SeaweedFS."""
    for path in ms.directory.rglob("*"):
        if path.is_file():
            seaweed.client.put_object(Bucket=BUCKET, Body=path.read_bytes(),
                                      Key=f"opener/mf.ms/{path.relative_to(ms.directory)}")
    seaweed.client.put_object(Bucket=BUCKET, Key="opener/obs.mf",
                              Body=(ms.where / "obs.mf").read_bytes())
    return SimpleNamespace(url=seaweed.url("opener/mf.ms/"), packed=seaweed.url("opener/obs.mf"),
                           endpoint=seaweed.endpoint)


def test_fsspec_on_an_s3_prefix_shows_what_the_mount_shows(mount, prefix):
    options = {"endpoint_url": prefix.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    fs = fsspec.filesystem("ctdsfs", fo=prefix.url, columns=True, target_options=options,
                           skip_instance_cache=True)
    shown = tree(mount(prefix.url, ["columns", f"endpoint_url={prefix.endpoint}"]).mountpoint)
    assert "ANTENNA/columns/POSITION.npy" in shown and "ANTENNA/table.f0" in shown
    assert fsspec_tree(fs) == shown


def test_commands_take_every_source_the_mount_takes(ms, prefix, web, tmp_path):
    shutil.copy(ms.where / "obs.mf", web.root / "opener-obs.mf")
    env = {"AWS_ENDPOINT_URL": prefix.endpoint}
    sources = {"file": ms.where / "obs.mf", "directory": ms.directory, "s3 object": prefix.packed,
               "s3 prefix": prefix.url, "https": web.url("opener-obs.mf")}
    for kind, source in sources.items():
        info = run("ctdsfs", "info", source, env=env)
        assert info.returncode == 0 and "ANTENNA" in info.stdout, (kind, info.stderr)
        listed = run("ctdsfs", "ls", source, "ANTENNA", env=env)
        assert listed.returncode == 0, (kind, listed.stderr)
        assert {"table.dat", "table.f0"} <= set(listed.stdout.split()), (kind, listed.stdout)
        checked = run("ctdsfs", "check", "--quiet", source, env=env)
        assert checked.returncode == 0 and checked.stdout.rstrip().endswith("clean"), \
            (kind, checked.stdout, checked.stderr)


def test_a_table_container_that_does_not_open_leaves_its_table_as_stored(ms, tmp_path, data_dir):
    """Whatever ANTENNA/table.mf holds inside a packed container (not a container, a cut
    header, a MultiHDF5, which a file inside a container cannot be read as), ANTENNA is
    shown as stored, saying why, and the other tables through the view."""
    stored = (ms.directory / "ANTENNA" / "table.mf").read_bytes()
    damages = {"garbage": b"not a container " * 512, "cut": stored[:100],
               "hdf5": (data_dir / "mh5_basic.mfh5").read_bytes()}
    for what, content in damages.items():
        tree = tmp_path / what
        for name in ("ANTENNA", "FEED"):
            shutil.copytree(ms.directory / name, tree / name)
        (tree / "ANTENNA" / "table.mf").write_bytes(content)
        pack(str(tree), str(tmp_path / f"{what}.mf"), quiet=True)
        root = open_source(tmp_path / f"{what}.mf").container
        try:
            antenna, feed = root.nested("ANTENNA"), root.nested("FEED")
            assert "table.mf" in antenna.names() and "table.f0" not in antenna.names(), what
            assert any("not as a table" in p for p in antenna.problems), what
            assert "table.f0" in feed.names() and "table.mf" not in feed.names(), what
            original = open_container(ms.directory / "FEED" / "table.mf")
            assert bytes(feed.read("table.f0", 0, 1 << 20)) == \
                bytes(original.read("table.f0", 0, 1 << 20))
            original.close()
        finally:
            root.close()


def test_a_table_inside_a_container_follows_another_writers_commit(ms, tmp_path):
    """A commit by another writer reaches the view at the next check: the table's files
    are read anew from the container that holds them."""
    path = tmp_path / "obs.mf"
    shutil.copy(ms.where / "obs.mf", path)
    root = open_source(path).container
    try:
        assert bytes(root.nested("ANTENNA").read("table.f0", 0, 4)) == b"\xbe\xbe\xbe\xbe"
        writer = open_container(path, writable=True)
        antenna = writer.nested("ANTENNA")
        table = MultiFile(VirtualFileStore(antenna, "table.mf"), writable=True,
                          lock=writer._lock)
        table.write("table.f0", 0, b"CHANGED!")
        table.commit()
        writer.close()
        assert root.reload_if_changed()
        assert bytes(root.nested("ANTENNA").read("table.f0", 0, 8)) == b"CHANGED!"
    finally:
        root.close()
