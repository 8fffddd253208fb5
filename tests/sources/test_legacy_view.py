"""Directory sources and the legacy table view: casacore 3.5 reads and writes MultiFile tables."""

import json
import os
import subprocess
import sys

import pytest

from ctdsfs.formats import create_container, open_container
from ctdsfs.formats.casacore import tabledat

from ..conftest import DATA, SCRIPTS, make_casacore_table
from ..formats.multifile.test_write import snapshot
from ..test_mount_rw import validate

pytestmark = [pytest.mark.fuse, pytest.mark.tools]

LEGACY_PYTHON = "/usr/bin/python3"  # Debian's python3-casacore: casacore 3.5


def dump(table, python=sys.executable, home=None):
    env = dict(os.environ, HOME=str(home)) if home else None
    result = subprocess.run([python, str(SCRIPTS / "make_sample_table.py"), "--dump", str(table)],
                            capture_output=True, text=True, env=env)
    return result


MAKE_MS = """
import sys, numpy as np, casacore.tables as t
rows = int(sys.argv[1])
ms = t.default_ms("obs.ms")
ms.addcols(t.maketabdesc(t.makearrcoldesc("DATA", 0j, shape=[4, 8])),
           dminfo={"TYPE": "TiledColumnStMan", "NAME": "tiled",
                   "SPEC": {"DEFAULTTILESHAPE": [4, 8, 32]}})
ms.addrows(rows)
ms.putcol("DATA", (np.arange(rows * 32) * (1 - 0.5j)).reshape(rows, 4, 8).astype(np.complex64))
ms.putcol("ANTENNA1", np.arange(rows) % 7)
ms.putcol("TIME", np.arange(rows) * 1.5)
ms.putcol("UVW", np.arange(rows * 3.0).reshape(rows, 3))
ms.putkeyword("OBSERVER", "ctdsfs")
ant = t.table("obs.ms/ANTENNA", ack=False, readonly=False)
ant.addrows(3)
ant.putcol("NAME", ["A0", "A1", "A2"])
ant.close()
ms.close()
"""


def make_ms(tmp_path, rows=120):
    """A python-casacore 3.8 MeasurementSet stored as MultiFile, plus the sample table."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / ".casarc").write_text("table.storage.option: multifile\ntable.storage.blocksize: 4096\n")
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run([sys.executable, "-c", MAKE_MS, str(rows)], check=True, cwd=data,
                   env=dict(os.environ, HOME=str(home)))
    make_casacore_table(data / "sample.tab", block_size=4096, rows=rows)
    return data, home


def test_casacore_3_5_reads_multifile_tables_through_the_view(mount, tmp_path):
    data, home = make_ms(tmp_path)
    expected = dump(data / "sample.tab")
    assert expected.returncode == 0
    # Without the mount, casacore 3.5 cannot read MultiFile v2 at all.
    native = dump(data / "sample.tab", python=LEGACY_PYTHON, home=home)
    assert native.returncode != 0 and "read returned a bad value" in native.stderr
    legacy_info = subprocess.run(["showtableinfo", f"in={data / 'obs.ms'}"], capture_output=True,
                                 text=True)
    assert "read returned a bad value" in legacy_info.stdout + legacy_info.stderr

    m = mount(data)
    view = m.mountpoint / "sample.tab"
    assert "table.mf" not in os.listdir(view)
    assert {"table.f0", "table.f0_TSM0", "table.f1", "table.f1i"} <= set(os.listdir(view))
    through = dump(view, python=LEGACY_PYTHON, home=home)
    assert through.returncode == 0, through.stderr
    assert json.loads(through.stdout) == json.loads(expected.stdout)

    ms_expected = dump(data / "obs.ms")
    assert ms_expected.returncode == 0, ms_expected.stderr
    ms_through = dump(m.mountpoint / "obs.ms", python=LEGACY_PYTHON, home=home)
    assert ms_through.returncode == 0, ms_through.stderr
    assert json.loads(ms_through.stdout) == json.loads(ms_expected.stdout)
    assert len(json.loads(ms_expected.stdout)["main"]["DATA"]) == 120
    info = subprocess.run(["showtableinfo", f"in={m.mountpoint / 'obs.ms'}"], capture_output=True,
                          text=True, check=True).stdout
    assert "SubTables" in info and "ANTENNA" in info
    for sub in ("ANTENNA", "SPECTRAL_WINDOW", "POLARIZATION"):
        assert "table.mf" not in os.listdir(m.mountpoint / "obs.ms" / sub)
    query = subprocess.run(["taql", f"select ANTENNA, NAME, DATA, FLAGS from {view} where ANTENNA=7"],
                           capture_output=True, text=True, check=True).stdout
    assert "antenna-7" in query
    # The view shows table.dat as casacore writes a separate-file table.
    shown = tabledat.decode((view / "table.dat").read_bytes())
    assert shown.storage == "SepFile" and shown.column_set.version == 2


def test_casacore_3_5_writes_through_the_view(mount, tmp_path):
    data, home = make_ms(tmp_path, rows=60)
    m = mount(data, options=["rw"])
    view = m.mountpoint / "sample.tab"
    for query in (f"update {view} set NAME='changed by 3.5', ANTENNA=ANTENNA+1000 where ANTENNA<3",
                  f"insert into {view} (ANTENNA, NAME) values (7777, 'new row')",
                  f"alter table {view} add column NEWCOL I4 dmtype='IncrementalStMan'",
                  f"update {view} set NEWCOL=rownumber()*3"):
        subprocess.run(["taql", query], check=True, capture_output=True)
    assert m.close() == 0
    table = data / "sample.tab"
    assert sorted(os.listdir(table)) == ["ANTENNA", "table.dat", "table.info", "table.lock",
                                         "table.mf"]
    stored = tabledat.decode((table / "table.dat").read_bytes())
    assert stored.storage == "MultiFile" and stored.nrow == 61
    after = json.loads(dump(table).stdout)["main"]  # python-casacore 3.8, natively
    assert after["ANTENNA"][:4] == [1000, 1001, 1002, 3] and after["ANTENNA"][-1] == 7777
    assert after["NAME"][:3] == ["changed by 3.5"] * 3 and after["NAME"][-1] == "new row"
    assert after["FLAGS"][-1] is None
    assert after["NEWCOL"][:4] == [0, 3, 6, 9]  # a new column: its new file went into table.mf
    assert "table.f2" in open_container(table / "table.mf").names()
    validate(table / "table.mf")


def test_directory_source_passthrough_and_containers(mount, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_text("plain file\n")
    (src / "sub").mkdir()
    (src / "inner.mf").write_bytes((DATA / "mf2_nested.mf").read_bytes())
    c = create_container(src / "mine.mf", block_size=512)
    c.create("x")
    c.write("x", 0, b"inside")
    c.close()
    import numpy as np
    import pycauset
    monkeypatch.chdir(tmp_path)  # pycauset makes a scratch folder in the working directory
    pycauset.save(pycauset.matrix(np.eye(3)), str(src / "m.pycauset"))
    m = mount(src, options=["rw"])
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["inner.mf", "m.pycauset", "mine.mf", "notes.txt", "sub"]
    assert np.array_equal(np.load(root / "m.pycauset" / "payload.npy"), np.eye(3))
    assert os.path.isdir(root / "inner.mf") and (root / "inner.mf" / "SUB" / "y").read_bytes() == \
        b"0123456789"
    (root / "sub" / "new.txt").write_text("written through")
    (root / "mine.mf" / "y").write_bytes(b"new virtual file")
    os.rename(root / "notes.txt", root / "sub" / "notes.txt")
    assert m.close() == 0
    assert (src / "sub" / "new.txt").read_text() == "written through"
    assert (src / "sub" / "notes.txt").read_text() == "plain file\n"
    assert snapshot(open_container(src / "mine.mf")) == {"x": b"inside", "y": b"new virtual file"}
    flat = mount(src, options=["norecurse"])
    assert os.path.isfile(flat.mountpoint / "inner.mf")
    assert os.path.isfile(flat.mountpoint / "m.pycauset")


def test_mount_point_inside_the_source_is_hidden(tmp_path):
    src = tmp_path / "src"
    (src / "mnt").mkdir(parents=True)
    (src / "f").write_text("x")
    from ..conftest import Mount
    m = Mount(src, src / "mnt", log=tmp_path / "m.log")
    try:
        assert sorted(os.listdir(src / "mnt")) == ["f"]
    finally:
        m.close()
    refused = subprocess.run(["mount.ctdsfs", str(src / "mnt"), str(src / "mnt")],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "lies under the mount point" in refused.stderr
