"""ctdsfs check: clean on every casacore-written fixture, finds every injected corruption."""

import json
import subprocess

import numpy as np
import pytest

from ctdsfs.sources.checking import check_path

from .conftest import DATA
from .formats.multifile.test_multifile import build_v2

CLEAN = ["mf2_basic.mf", "mf2_crc.mf", "mf2_free.mf", "mf2_nested.mf", "mf2_bighdr.mf",
         "casacore_test_v1.mf", "t_mf.tab/table.mf", "mh5_basic.mfh5"]


@pytest.mark.parametrize("name", CLEAN)
def test_clean_fixtures_pass(name):
    problems, notes = check_path(DATA / name)
    assert problems == []


def test_stale_continuation_set_is_no_problem():
    problems, notes = check_path(DATA / "mf2_bighdr.mf")
    assert problems == [] and notes == []  # set 1 is listed in the header: not lost


def patched(tmp_path, source, offset, data):
    raw = bytearray((DATA / source).read_bytes())
    raw[offset:offset + len(data)] = data
    path = tmp_path / "bad.mf"
    path.write_bytes(raw)
    return path


def test_each_corruption_class_is_found(tmp_path):
    cases = {}
    (tmp_path / "a").mkdir()
    cases["fails its CRC check"] = patched(tmp_path / "a", "mf2_crc.mf", 2 * 4096 + 7, b"\x00")
    (tmp_path / "b").mkdir()
    cases["header CRC mismatch"] = patched(tmp_path / "b", "mf2_crc.mf", 115, b"0")
    short = tmp_path / "short.mf"
    short.write_bytes((DATA / "mf2_basic.mf").read_bytes()[:4 * 4096 + 100])
    cases["bytes, its 5 blocks need"] = short

    def layout(name, patch):
        path = tmp_path / f"{name}.mf"
        build_v2(path, [("a", b"a" * 600), ("b", b"b" * 600)], patch=patch)
        return path
    cases["in the free list and used by a file"] = layout(
        "free", lambda h: setattr(h, "free_blocks", np.array([2])))
    cases["appears 2 times in the free list"] = layout(
        "dupfree", lambda h: (setattr(h, "nblocks", 7), setattr(h, "free_blocks", np.array([6, 6]))))
    cases["continuation sets and used by a file"] = layout(
        "cont", lambda h: setattr(h, "cont_sets", (np.array([3]), np.zeros(0, np.int64))))
    cases["uses a block that an earlier entry"] = layout(
        "shared", lambda h: setattr(h.entries[1], "blocks", np.array([1, 2])))
    cases["block number outside the container"] = layout(
        "outside", lambda h: setattr(h.entries[1], "blocks", np.array([3, 40])))
    cases["holds 2 blocks, its 10 bytes need 1"] = layout(
        "extra", lambda h: setattr(h.entries[0], "size", 10))
    for expected, path in cases.items():
        problems, _ = check_path(path)
        assert any(expected in p for p in problems), (expected, problems)


def test_nested_containers_are_checked(tmp_path):
    path = build_v2(tmp_path / "outer.mf", [("SUB", bytes((DATA / "mf2_free.mf").read_bytes()))],
                    block_size=4096)
    problems, notes = check_path(path)
    assert problems == []
    data = bytearray(path.read_bytes())
    data[4096 + 64 + 40:4096 + 64 + 44] = b"\xff\xff\xff\xff"  # garble the child's entries
    path.write_bytes(data)
    problems, _ = check_path(path)
    assert problems and all("outer.mf" in p for p in problems)


def test_cli_exit_status_and_json(tmp_path):
    ok = subprocess.run(["ctdsfs", "check", str(DATA / "mf2_crc.mf")], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "clean" in ok.stdout
    (tmp_path / "x").mkdir()
    bad = patched(tmp_path / "x", "mf2_crc.mf", 3 * 4096, b"\x01\x02")
    result = subprocess.run(["ctdsfs", "check", "--json", str(bad)], capture_output=True,
                            text=True)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["clean"] is False
    assert any("f1: block 2 (container block 3) fails its CRC check" in p
               for p in report["problems"])


HOSTILE_NAMES = {  # same byte length as the casacore-written names they replace
    b"hello.txt": b"he\xff\x1b[2J\nx",  # an undecodable byte, a terminal escape, a newline
    b"data10000.bin": b"\xe2\x80\xaeev\xc2\x9b1000.b",  # a bidi override, a C1 control
    b"empty.bin": b"\x07\r\t\x7fy.b\\n",  # bell, carriage return, tab, DEL, a backslash
}


def hostile_container(tmp_path):
    raw = (DATA / "mf2_basic.mf").read_bytes()
    for old, new in HOSTILE_NAMES.items():
        assert len(old) == len(new) and raw.count(old) == 1
        raw = raw.replace(old, new)
    path = tmp_path / "hostile.mf"
    path.write_bytes(raw)
    return path


def assert_terminal_safe(result):
    assert result.returncode in (0, 1), result
    assert b"Traceback" not in result.stderr and b"internal error" not in result.stderr and b"Error" not in result.stderr, result.stderr
    for stream in (result.stdout, result.stderr):
        text = stream.decode("utf-8")  # strict: nothing undecodable
        assert not any(ord(ch) < 32 and ch != "\n" or 0x7f <= ord(ch) < 0xa0 or ch == "\u202e"
                       for ch in text), text


@pytest.mark.parametrize("command", [
    ["info"], ["info", "--map"], ["ls"], ["ls", "-l"], ["check"], ["map"], ["map", "-o", "m.svg"],
    ["info", "--json"], ["ls", "--json"], ["check", "--json"], ["map", "--json"]])
def test_hostile_names_reach_no_terminal_raw(tmp_path, command):
    """Names go through one escaping helper; --json keeps undecodable bytes as \\udcXX."""
    import os

    path = hostile_container(tmp_path)
    env = dict(os.environ, LC_ALL="C.UTF-8", PYTHONIOENCODING="")
    result = subprocess.run(["ctdsfs", command[0], str(path), *command[1:]], capture_output=True,
                            env=env, cwd=tmp_path)
    assert_terminal_safe(result)
    assert result.returncode == 0
    if "--json" in command:
        text = result.stdout.decode()
        # the byte 0xFF, as Python's surrogateescape keeps it (a clean check names no file)
        assert command[0] == "check" or "\\udcff" in text
        if command[0] == "ls":
            names = [r["name"].encode("utf-8", "surrogateescape") for r in json.loads(text)]
            assert sorted(names) == sorted(HOSTILE_NAMES.values())
    elif command[-1].endswith(".svg"):
        svg = (tmp_path / "m.svg").read_text()
        assert "he\\xff\\x1b[2J\\x0ax" in svg
    elif command[0] != "check":
        assert "he\\xff\\x1b[2J\\x0ax" in result.stdout.decode()
        assert "\\x07\\x0d\\x09\\x7fy.b\\\\n" in result.stdout.decode()


def test_hostile_names_in_errors_and_log_lines(tmp_path):
    """A hidden entry's warning and a failing command's one-line error stay printable."""
    import os

    path = hostile_container(tmp_path)
    short = tmp_path / "short\x1b]0;x\x07.mf"
    short.write_bytes(path.read_bytes()[:3 * 4096])  # the last two files' blocks are gone
    env = dict(os.environ, LC_ALL="C.UTF-8")
    for args in (["info", str(short)], ["ls", str(short), "he\xff\x1b[2J\nx".encode(
            "utf-8", "surrogateescape")]):
        result = subprocess.run(["ctdsfs", *args], capture_output=True, env=env)
        assert_terminal_safe(result)
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1
    assert b"short\\x1b]0;x\\x07.mf" in result.stderr
