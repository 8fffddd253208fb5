"""table.dat: decoded and encoded byte for byte, for tables casacore 3.8 and 3.5 wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats.casacore import tabledat

from ...conftest import DATA, make_casacore_table

HERE = Path(__file__).parent
LEGACY_PYTHON = "/usr/bin/python3"  # Debian's python3-casacore (casacore 3.5)

pytestmark = pytest.mark.tools


def write_keyword_table(path, python=sys.executable, multifile=False):
    home = path.parent / f".home-{path.name}"
    home.mkdir(exist_ok=True)
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "\n")
    subprocess.run([python, str(HERE / "make_keyword_table.py"), str(path)], check=True,
                   env=dict(os.environ, HOME=str(home)), cwd=path.parent)
    return path


def all_table_dats(root):
    return sorted(Path(root).rglob("table.dat"))


def assert_round_trip(root):
    files = all_table_dats(root)
    assert files
    for f in files:
        data = f.read_bytes()
        assert tabledat.decode(data, str(f)).encode() == data, f
    return files


def test_round_trip_python_casacore_3_8(tmp_path):
    assert_round_trip(write_keyword_table(tmp_path / "kw.tab"))
    assert_round_trip(write_keyword_table(tmp_path / "kwmf.tab", multifile=True))
    assert_round_trip(make_casacore_table(tmp_path / "sample.tab", block_size=4096))
    assert_round_trip(DATA / "t_mf.tab")


def test_round_trip_casacore_3_5(tmp_path):
    assert_round_trip(write_keyword_table(tmp_path / "legacy.tab", python=LEGACY_PYTHON))


def test_round_trip_measurement_set(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".casarc").write_text("table.storage.option: multifile\n")
    script = "import casacore.tables as t; t.default_ms('ms.ms').close()"
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path,
                   env=dict(os.environ, HOME=str(home)))
    files = assert_round_trip(tmp_path / "ms.ms")
    assert len(files) == 13  # the main table and its 12 subtables
    assert all(tabledat.decode(f.read_bytes()).storage == "MultiFile" for f in files)


def test_storage_change_matches_what_casacore_writes(tmp_path):
    packed = make_casacore_table(tmp_path / "mf.tab", block_size=512)
    separate = make_casacore_table(tmp_path / "sep.tab", multifile=False)
    for name in ("table.dat", "ANTENNA/table.dat"):
        mf = tabledat.decode((packed / name).read_bytes())
        sep = tabledat.decode((separate / name).read_bytes())
        assert (mf.storage, sep.storage) == ("MultiFile", "SepFile")
        assert mf.with_storage("SepFile").encode() == (separate / name).read_bytes()
        assert sep.with_storage("MultiFile", 512).encode() == (packed / name).read_bytes()


def test_keyword_values_decoded(tmp_path):
    table = tabledat.decode((write_keyword_table(tmp_path / "kw.tab") / "table.dat").read_bytes())
    keywords = tabledat.record_dict(table.desc.keywords)
    assert keywords["b"] is True and keywords["i"] == -5 and keywords["c"] == [1.0, 2.0]
    assert keywords["i64"] == 2 ** 40
    assert keywords["ab"]["values"] == [True, False, True, True, False, False, False, False, True]
    assert keywords["ai"] == {"shape": [3, 2], "values": [0, 1, 2, 3, 4, 5]}
    assert keywords["rec"] == {"nested": {"deep": 1, "arr": {"shape": [2], "values": [0.0, 1.0]}},
                               "x": "y"}
    assert keywords["empty"] == {} and keywords["SUB"] == "Table: ././SUB"
    columns = {c.name: c for c in table.desc.columns}
    assert tabledat.record_dict(columns["A"].keywords)["MEASINFO"] == {"type": "epoch",
                                                                      "Ref": "UTC"}


@pytest.mark.parametrize("mutate,message", [
    (lambda t: setattr(t.column_set, "version", 4), "ColumnSet version 4"),
    (lambda t: setattr(t, "table_type", "RefTable"), "table type 'RefTable'"),
])
def test_unknown_versions_are_refused(mutate, message):
    table = tabledat.decode((DATA / "t_mf.tab" / "table.dat").read_bytes())
    mutate(table)
    with pytest.raises(FormatError, match=message):
        tabledat.decode(table.encode())


def test_unknown_table_version_is_refused():
    data = bytearray((DATA / "t_mf.tab" / "table.dat").read_bytes())
    assert data[12:17] == b"Table"
    data[17:21] = (7).to_bytes(4, "big")  # the version after magic, length and "Table"
    with pytest.raises(FormatError, match="Table version 7"):
        tabledat.decode(bytes(data))


def test_damaged_table_dat(tmp_path):
    data = (DATA / "t_mf.tab" / "table.dat").read_bytes()
    for damaged in (data[:100], data + b"extra", b"\xbe\xbe\xbe\xbe" + b"\xff" * 40, b""):
        with pytest.raises(FormatError):
            tabledat.decode(damaged)


def test_tableinfo_command(tmp_path):
    table = make_casacore_table(tmp_path / "t.tab", block_size=4096)
    out = subprocess.run(["ctdsfs", "tableinfo", "--json", str(table)], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)
    assert info["storage_option"] == "MultiFile" and info["block_size"] == 4096
    assert info["rows"] == 50
    tiled = next(dm for dm in info["data_managers"] if dm["type"] == "TiledColumnStMan")
    assert tiled["columns"] == ["DATA"] and "table.f0_TSM0" in tiled["files"]
    assert info["keywords"]["ANTENNA"] == "Table: ././ANTENNA"
    text = subprocess.run(["ctdsfs", "tableinfo", str(table)], check=True,
                          capture_output=True, text=True).stdout
    assert "storage MultiFile, block size 4096" in text
    bad = subprocess.run(["ctdsfs", "tableinfo", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "not a casacore table" in bad.stderr


def with_table_keywords(data, keywords):
    """``data`` (a table.dat) with its table keywords replaced by the raw ``keywords`` bytes;
    the lengths of the enclosing Table and TableDesc objects are patched to match."""
    from ctdsfs.formats.casacore.aipsio import AipsReader

    r = AipsReader(data)
    r.start("Table", outer=True)
    r.u32(), r.u32(), r.string()  # rows, endianness, table type
    desc_at = r.pos
    r.start("TableDesc")
    r.string(), r.string(), r.string()
    start = r.pos
    tabledat._read_record(r)
    delta = len(keywords) - (r.pos - start)
    out = bytearray(data[:start] + keywords + data[r.pos:])
    for at in (4, desc_at):
        out[at:at + 4] = (int.from_bytes(out[at:at + 4], "big") + delta).to_bytes(4, "big")
    return bytes(out)


def nested_keywords(depth):
    """A TableRecord whose only field is a record nested ``depth`` deep (built iteratively)."""
    from ctdsfs.formats.casacore.aipsio import AipsWriter

    w = AipsWriter()
    w.start("TableRecord", 1)
    for _ in range(depth):
        w.start("RecordDesc", 2)
        w.i32(1)
        w.string("r")
        w.i32(tabledat.TP_RECORD)
    w.start("RecordDesc", 2)
    w.i32(0)
    w.end()
    for _ in range(depth):
        w.string("")  # the field's comment
        w.end()
    w.i32(0)
    w.start("TableRecord", 1)  # the innermost (empty) record stores itself
    w.start("RecordDesc", 2)
    w.i32(0)
    w.end()
    w.i32(0)
    w.end()
    w.end()
    return w.getvalue()


def test_keyword_nesting_is_bounded():
    data = (DATA / "t_mf.tab" / "table.dat").read_bytes()
    shallow = tabledat.decode(with_table_keywords(data, nested_keywords(10)))
    assert tabledat.record_dict(shallow.desc.keywords)["r"]["r"]["r"] is not None
    with pytest.raises(FormatError, match=r"^x/table.dat: AipsIO objects nested more than 64"):
        tabledat.decode(with_table_keywords(data, nested_keywords(1000)), "x/table.dat")


def test_damaged_table_dat_in_a_mounted_directory(tmp_path, mount):
    """The table view shows a table.dat it cannot decode as it is; the rest stays listable."""
    import shutil

    table = tmp_path / "src" / "t.tab"
    shutil.copytree(DATA / "t_mf.tab", table)
    raw = with_table_keywords((table / "table.dat").read_bytes(), nested_keywords(1000))
    (table / "table.dat").write_bytes(raw)
    m = mount(tmp_path / "src", ["workers=1"])  # (each worker process logs it once)
    view = m.mountpoint / "t.tab"
    names = sorted(os.listdir(view))
    assert "table.dat" in names and "table.f0" in names and "table.mf" not in names
    assert all((view / n).stat().st_size >= 0 for n in names)
    assert (view / "table.dat").read_bytes() == raw
    log = m.log_text()
    assert "internal error" not in log and "Traceback" not in log
    assert log.count("table.dat shown as it is") == 1


def test_tableinfo_escapes_keyword_names(tmp_path):
    from ctdsfs.formats.casacore.aipsio import AipsWriter

    w = AipsWriter()
    w.start("TableRecord", 1)
    w.start("RecordDesc", 2)
    w.i32(1)
    w.string(b"evil\x1b]0;owned\x07\xff")  # a terminal title escape and a byte that is not UTF-8
    w.i32(5)  # Int
    w.string("")
    w.end()
    w.i32(0)
    w.i32(42)
    w.end()
    table = tmp_path / "t.tab"
    table.mkdir()
    (table / "table.dat").write_bytes(with_table_keywords(
        (DATA / "t_mf.tab" / "table.dat").read_bytes(), w.getvalue()))
    result = subprocess.run(["ctdsfs", "tableinfo", str(table)], capture_output=True,
                            env=dict(os.environ, LC_ALL="C.UTF-8"))
    assert result.returncode == 0 and result.stderr == b""
    assert b"    evil\\x1b]0;owned\\x07\\xff = 42\n" in result.stdout
