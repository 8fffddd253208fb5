"""ctdsfs map: every block's role on casacore-written containers, as text, JSON, PNG and SVG."""

import json
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib

import numpy as np

from ctdsfs.blockmap import (
    BAD_CRC,
    CONFLICT,
    CONTINUATION,
    FREE,
    HEADER,
    METADATA,
    ROLES,
    SPARE,
    block_map,
    render_png,
    render_svg,
    render_text,
)
from ctdsfs.formats import open_container

from .conftest import DATA
from .formats.multifile.test_multifile import build_v2


def roles(path, **kw):
    return block_map(open_container(path, verify_crc=False), **kw).roles


def test_roles_of_casacore_fixtures():
    # mf2_free: a (blocks 1, 2), free [5, 4, 3], c (block 6): see its .txt
    assert roles(DATA / "mf2_free.mf") == [HEADER, 0, 0, FREE, FREE, FREE, 1]
    big = roles(DATA / "mf2_bighdr.mf")
    assert big.count(HEADER) == 1 and big.count(CONTINUATION) == 5 and big.count(SPARE) == 5
    assert sorted(set(big) - {HEADER, CONTINUATION, SPARE}) == list(range(60))
    v1 = roles(DATA / "casacore_test_v1.mf")
    assert v1.count(FREE) == 15 and v1.count(0) == 24 and v1.count(1) == 17
    nested = block_map(open_container(DATA / "mf2_nested.mf"))
    assert [f[0] for f in nested.files] == ["table.dat", "SUB/"]


def test_bad_crc_and_claimed_twice(tmp_path):
    bad = tmp_path / "crc.mf"
    raw = bytearray((DATA / "mf2_crc.mf").read_bytes())
    raw[2 * 4096 + 7] ^= 1
    bad.write_bytes(raw)
    assert roles(bad)[2] == BAD_CRC
    assert roles(bad, verify_crc=False)[2] != BAD_CRC
    shared = build_v2(tmp_path / "shared.mf", [("a", b"a" * 600), ("b", b"b" * 600)],
                      patch=lambda h: setattr(h, "free_blocks", np.array([2])))
    assert roles(shared)[2] == CONFLICT


def test_multihdf5_cells_show_where_chunks_lie():
    bmap = block_map(open_container(DATA / "mh5_basic.mfh5"))
    assert [f[0] for f in bmap.files] == ["empty.bin", "data10000.bin", "hello.txt"]
    # 3 chunks of data10000.bin and 1 of hello.txt, each one block, not aligned to cells
    assert 3 <= bmap.roles.count(1) <= 6 and 1 <= bmap.roles.count(2) <= 2
    assert METADATA in bmap.roles and 0 not in bmap.roles


def test_scaling_keeps_the_most_telling_role(tmp_path):
    files = [(f"f{i}", bytes([i]) * 512 * 30) for i in range(8)]
    path = build_v2(tmp_path / "big.mf", files, block_size=512)
    bmap = block_map(open_container(path))
    per, cells = bmap.cells(max_cells=100)
    assert per == -(-len(bmap.roles) // 100) and len(cells) <= 100
    assert cells[0] == HEADER
    text = render_text(bmap, max_cells=100)
    assert f"one character per {per} blocks" in text
    assert text.splitlines()[-1].startswith(f"{64 * per} ")  # rows numbered in blocks


def test_text_png_svg_and_cli(tmp_path):
    bmap = block_map(open_container(DATA / "mf2_free.mf"))
    text = render_text(bmap)
    assert text.splitlines()[-1] == "0 #AA...B"
    assert "'.'  free: 3" in text and "'A'  a: 5000 bytes, 2 blocks" in text
    png = render_png(bmap, cell=8)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (7 * 8, 8)
    idat_len = struct.unpack(">I", png[33:37])[0]
    pixels = zlib.decompress(png[41:41 + idat_len])
    row = pixels[1:1 + width * 3]  # first scan line, after its filter byte
    assert tuple(row[0:3]) == ROLES[HEADER][1] and tuple(row[3 * 8 * 3:3 * 8 * 3 + 3]) == ROLES[FREE][1]
    svg = ET.fromstring(render_svg(bmap))
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert any("a: 5000 bytes" in t for t in texts)
    out = subprocess.run(["ctdsfs", "map", str(DATA / "mf2_free.mf"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    assert data["map"] == [HEADER, 0, 0, FREE, FREE, FREE, 1] and data["roles"]["free"] == 3
    for image in ("m.png", "m.svg"):
        subprocess.run(["ctdsfs", "map", str(DATA / "mf2_bighdr.mf"), "-o", str(tmp_path / image)],
                       check=True, capture_output=True)
        assert (tmp_path / image).stat().st_size > 100
    info = subprocess.run(["ctdsfs", "info", "--map", str(DATA / "mf2_free.mf")],
                          capture_output=True, text=True, check=True).stdout
    assert "free blocks      3" in info and "0 #AA...B" in info
    wrong = subprocess.run(["ctdsfs", "map", str(DATA / "mf2_free.mf"), "-o", str(tmp_path / "x.gif")],
                           capture_output=True, text=True)
    assert wrong.returncode == 1 and ".png or .svg" in wrong.stderr


def test_hostile_names_do_not_reach_the_terminal_raw(tmp_path):
    path = build_v2(tmp_path / "esc.mf", [("evil\x1b[2Jname", b"x")])
    text = render_text(block_map(open_container(path)))
    assert "\x1b" not in text and "evil\\x1b[2Jname" in text
