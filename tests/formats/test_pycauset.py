""".pycauset files (written by pycauset itself) as directories: payload, numpy view, metadata."""

import errno
import json
import math
import os
import random
import struct
import zlib

import numpy as np
import pycauset  # noqa: E402  (a test extra: the ground truth writer and reader)
import pytest
from pycauset._internal.persistence import read_typed_metadata  # noqa: E402

from ctdsfs.errors import FormatError
from ctdsfs.formats import open_container
from ctdsfs.formats.pycauset import (
    Pycauset,
    decode_typed,
    encode_typed,
    from_json,
    metadata_block,
    to_json,
)
from ctdsfs.io.store import FileStore

from ..conftest import Mount, require_fuse

MATRICES = {
    "float64": np.arange(12, dtype=np.float64).reshape(3, 4),
    "float32": np.arange(6, dtype=np.float32).reshape(3, 2) / 7,
    "int32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "int8": np.arange(16, dtype=np.int8).reshape(4, 4),
    "uint64": np.arange(4, dtype=np.uint64).reshape(2, 2) * 2 ** 40,
    "complex128": (np.arange(4) + 1j * np.arange(4)[::-1]).reshape(2, 2),
    "float16": np.arange(9, dtype=np.float16).reshape(3, 3),
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pycauset makes a .pycauset/ scratch folder in the cwd
    return tmp_path


def save(obj, path, properties=None):
    if properties:
        for key, value in properties.items():
            obj.properties[key] = value
    pycauset.save(obj, str(path))
    return path


def slot_bytes(path):
    data = open(path, "rb").read()
    return data


@pytest.mark.parametrize("kind", sorted(MATRICES))
def test_matrices_mount_as_numpy(workdir, mount, kind):
    array = MATRICES[kind]
    path = save(pycauset.matrix(array), workdir / f"{kind}.pycauset")
    m = mount(path)
    loaded = np.load(m.mountpoint / "payload.npy", mmap_mode="r")
    assert loaded.dtype == array.dtype and loaded.shape == array.shape
    assert np.array_equal(loaded, np.asarray(pycauset.load(str(path))))
    # payload: exactly the bytes at the active slot's payload offset
    raw = open(path, "rb").read()
    a = struct.unpack("<7Q", raw[16:72])
    b = struct.unpack("<7Q", raw[144:200])
    active = max((a, "A"), (b, "B"), key=lambda s: (s[0][0], s[1]))[0]
    assert (m.mountpoint / "payload").read_bytes() == raw[active[1]:active[1] + active[2]]
    meta = json.loads((m.mountpoint / "metadata.json").read_text())
    assert meta == to_json(decode_typed(encode_typed(from_json(meta))))
    assert meta["rows"] == array.shape[0] and meta["cols"] == array.shape[1]


def test_vector_and_properties(workdir, mount):
    path = save(pycauset.vector(np.arange(5.0)), workdir / "v.pycauset",
                {"is_identity": False})
    m = mount(path)
    assert np.load(m.mountpoint / "payload.npy").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert json.loads((m.mountpoint / "metadata.json").read_text()) == json.loads(
        json.dumps(to_json(from_json(read_typed_metadata(str(path))))))


def test_non_dense_layouts_have_no_npy(workdir, mount):
    path = save(pycauset.TriangularFloatMatrix(4), workdir / "tri.pycauset")
    bits = save(pycauset.matrix(np.eye(3, dtype=bool)), workdir / "bits.pycauset")
    assert sorted(os.listdir(mount(path).mountpoint)) == ["header.json", "metadata.json",
                                                          "payload"]
    assert "payload.npy" not in os.listdir(mount(bits).mountpoint)


def test_typed_metadata_round_trips_exactly(workdir):
    for kind, array in MATRICES.items():
        path = save(pycauset.matrix(array), workdir / f"{kind}.pycauset", {"is_diagonal": False})
        c = Pycauset(FileStore(path))
        raw = open(path, "rb").read()
        block = raw[c.active.metadata_offset:c.active.metadata_offset + c.active.metadata_length]
        assert encode_typed(c.metadata) == block[32:]  # byte-exact
        assert encode_typed(from_json(json.loads(c.read("metadata.json", 0, 1 << 20)))) == \
            block[32:]


def test_json_mapping_is_lossless_for_every_tag():
    value = ("map", [
        ("b", ("bool", True)), ("neg", ("i64", -5)), ("i64pos", ("i64", 7)), ("u", ("u64", 2 ** 64 - 1)),
        ("f", ("f64", 1.0)), ("nan", ("f64", math.nan)), ("inf", ("f64", -math.inf)),
        ("s", ("str", "naïve")), ("bytes", ("bytes", b"\x00\xff")),
        ("arr", ("array", [("u64", 1), ("array", []), ("map", [])])),
        ("dollar", ("map", [("$weird", ("u64", 1))])),
    ])
    text = json.dumps(to_json(value), allow_nan=False)
    back = from_json(json.loads(text))
    assert encode_typed(back) == encode_typed(value)
    for bad in (None, [1, None], {"x": 2 ** 64}, {"$nope": 1}, -(2 ** 63) - 1):
        with pytest.raises(ValueError):
            from_json(bad)


def commit_generation(path):
    raw = open(path, "rb").read(4096)
    return max(struct.unpack("<Q", raw[16:24])[0], struct.unpack("<Q", raw[144:152])[0])


def test_metadata_edit_commits_by_slot_flip(workdir, mount):
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "e.pycauset")
    before = open(path, "rb").read()
    old_meta = read_typed_metadata(str(path))
    generation = commit_generation(path)
    m = mount(path, options=["rw"])
    doc = json.loads((m.mountpoint / "metadata.json").read_text())
    doc.setdefault("properties", {})["is_symmetric"] = False
    doc["properties"]["note"] = "edited through ctdsfs"
    with open(m.mountpoint / "metadata.json", "w") as f:
        json.dump(doc, f)
    header = json.loads((m.mountpoint / "header.json").read_text())
    assert header["slots"][header["active_slot"]]["generation"] == generation + 1
    assert m.close() == 0
    after = open(path, "rb").read()
    assert after[:len(before)][4096:] == before[4096:]  # payload and old block untouched
    assert commit_generation(path) == generation + 1
    loaded = pycauset.load(str(path))
    assert loaded.properties["note"] == "edited through ctdsfs"
    assert np.array_equal(np.asarray(loaded), MATRICES["float64"])
    old_block = before[before.index(b"PCMB"):]
    assert old_block in after  # the previous metadata block is still there
    assert read_typed_metadata(str(path))["rows"] == old_meta["rows"]


def test_invalid_metadata_changes_nothing(workdir, mount):
    path = save(pycauset.matrix(MATRICES["int32"]), workdir / "i.pycauset")
    before = open(path, "rb").read()
    m = mount(path, options=["rw"])
    for bad in ("{not json", "[1, 2]", '{"x": null}', '{"x": 18446744073709551616}', "",
                '{"x": ' + "[" * 100000 + "]" * 100000 + "}"):
        with pytest.raises(OSError) as exc:
            with open(m.mountpoint / "metadata.json", "w") as f:
                f.write(bad)
        assert exc.value.errno == errno.EINVAL, bad
    assert open(path, "rb").read() == before


def test_payload_writes_in_place_and_fixed_size(workdir, mount):
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "p.pycauset")
    m = mount(path, options=["rw"])
    with open(m.mountpoint / "payload", "r+b") as f:
        f.write(np.float64(42.0).tobytes())
    header_len = len(open(m.mountpoint / "payload.npy", "rb").read()) - 96
    with open(m.mountpoint / "payload.npy", "r+b") as f:
        f.seek(header_len + 8)
        f.write(np.float64(-1.0).tobytes())
    def write(name, mode, data):
        with open(m.mountpoint / name, mode) as f:
            f.write(data)

    for attempt in (lambda: write("payload", "ab", b"x"),
                    lambda: os.truncate(m.mountpoint / "payload", 10),
                    lambda: write("payload.npy", "r+b", b"garbage"),
                    lambda: write("header.json", "r+b", b"{")):
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno in (errno.EPERM, errno.EACCES)
    assert m.close() == 0
    expected = MATRICES["float64"].copy()
    expected[0, 0], expected[0, 1] = 42.0, -1.0
    assert np.array_equal(np.asarray(pycauset.load(str(path))), expected)


def corrupt(path, offset, data):
    raw = bytearray(open(path, "rb").read())
    raw[offset:offset + len(data)] = data
    open(path, "wb").write(raw)


def reslot(path, name, **changes):
    """Rewrite slot ``name`` with changed fields and a correct CRC."""
    raw = bytearray(open(path, "rb").read())
    at = 16 if name == "A" else 144
    fields = list(struct.unpack("<7Q", raw[at:at + 56]))
    keys = ["generation", "payload_offset", "payload_length", "metadata_offset",
            "metadata_length", "hot_offset", "hot_length"]
    for key, value in changes.items():
        fields[keys.index(key)] = value
    head = struct.pack("<7Q", *fields)
    raw[at:at + 60] = head + struct.pack("<I", zlib.crc32(head))
    open(path, "wb").write(raw)


@pytest.mark.parametrize("damage,message", [
    (lambda p: corrupt(p, 0, b"NOTCAUSE"), "not a container ctdsfs knows"),
    (lambda p: corrupt(p, 8, struct.pack("<I", 2)), "format version 2"),
    (lambda p: corrupt(p, 12, b"\x02"), "endian"),
    (lambda p: corrupt(p, 13, struct.pack("<H", 8192)), "header size"),
    (lambda p: corrupt(p, 15, b"\x01"), "reserved"),
    (lambda p: (corrupt(p, 20, b"\xff"), corrupt(p, 148, b"\xff")), "slot CRC mismatch"),
    (lambda p: (reslot(p, "A", payload_offset=100), reslot(p, "B", payload_offset=100)),
     "not aligned to 4096"),
    (lambda p: (reslot(p, "A", metadata_offset=4097), reslot(p, "B", metadata_offset=4097)),
     "not aligned to 16"),
    (lambda p: (reslot(p, "A", payload_length=2 ** 62), reslot(p, "B", payload_length=2 ** 62)),
     "past the end"),
    (lambda p: open(p, "r+b").truncate(1000), "truncated header"),
])
def test_damaged_headers_are_refused_with_the_reason(workdir, damage, message):
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "d.pycauset")
    damage(path)
    with pytest.raises(FormatError if "casacore" not in message else Exception, match=message):
        open_container(path)


def _block_at(path):
    c = Pycauset(FileStore(path))
    return c.active.metadata_offset, c.active.metadata_length


@pytest.mark.parametrize("damage,message", [
    (lambda raw, at, n: raw.__setitem__(slice(at, at + 4), b"XXXX"), "magic mismatch"),
    (lambda raw, at, n: raw.__setitem__(slice(at + 4, at + 8), struct.pack("<I", 9)), "version"),
    (lambda raw, at, n: raw.__setitem__(slice(at + 12, at + 16), b"\x01\0\0\0"), "reserved"),
    (lambda raw, at, n: raw.__setitem__(slice(at + 16, at + 24), struct.pack("<Q", 2 ** 60)),
     "length mismatch"),
    (lambda raw, at, n: raw.__setitem__(at + n - 1, raw[at + n - 1] ^ 1), "CRC mismatch"),
])
def test_damaged_metadata_blocks_are_refused(workdir, damage, message):
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "b.pycauset")
    at, n = _block_at(path)
    raw = bytearray(open(path, "rb").read())
    damage(raw, at, n)
    open(path, "wb").write(raw)
    with pytest.raises(FormatError, match=message):
        open_container(path)


@pytest.mark.parametrize("payload,message", [
    (b"\x08\x01\x00\x00\x00\x01\x00k\x99", "unknown metadata tag"),
    (b"\x08\x00\x00\x00\x00junk", "trailing bytes"),
    (b"\x08\xff\xff\xff\xff", "count exceeds"),
    (b"\x07\x00\x00\x00\x00", "not a map"),
    (b"\x08\x01\x00\x00\x00\x01\x00k\x05\xff\xff\xff\x7f", "truncated"),
])
def test_metadata_that_does_not_decode(workdir, payload, message):
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "m.pycauset")
    raw = bytearray(open(path, "rb").read())
    end = (len(raw) + 15) & ~15
    raw += bytes(end - len(raw)) + metadata_block(payload)
    open(path, "wb").write(raw)
    reslot(path, "B", generation=99, metadata_offset=end, metadata_length=32 + len(payload))
    with pytest.raises(FormatError, match=message):
        open_container(path)


def test_mount_refuses_a_file_without_valid_slot(workdir, tmp_path):
    import subprocess
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "x.pycauset")
    corrupt(path, 20, b"\xff")
    corrupt(path, 148, b"\xff")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(["mount.ctdsfs", str(path), str(mnt)], capture_output=True,
                            text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr \
        and "internal error" not in result.stderr
    assert "no valid header slot (slot A: slot CRC mismatch; slot B: slot CRC mismatch)" \
        in result.stderr


class RecordingStore(FileStore):
    def __init__(self, path):
        super().__init__(path, writable=True)
        self.log = []

    def pwrite(self, offset, data):
        self.log.append((offset, bytes(data)))
        super().pwrite(offset, data)


def test_commit_replay_every_prefix_loads(workdir):
    path = save(pycauset.matrix(MATRICES["float32"]), workdir / "r.pycauset")
    for round_ in range(3):
        before = open(path, "rb").read()
        old = read_typed_metadata(str(path))
        store = RecordingStore(path)
        c = Pycauset(store)
        doc = json.loads(c.read("metadata.json", 0, 1 << 20))
        doc.setdefault("properties", {})["round"] = round_
        c.truncate("metadata.json", 0)
        c.write("metadata.json", 0, json.dumps(doc).encode())
        c.commit()
        c.close()
        new = read_typed_metadata(str(path))
        image = bytearray(before)
        for offset, data in store.log:
            # every byte-prefix of each write, not only whole writes
            for cut in sorted({0, 1, len(data) // 2, len(data) - 1, len(data)}):
                trial = bytearray(image)
                end = offset + cut
                if len(trial) < end:
                    trial.extend(bytes(end - len(trial)))
                trial[offset:end] = data[:cut]
                (workdir / "crashed.pycauset").write_bytes(trial)
                assert read_typed_metadata(str(workdir / "crashed.pycauset")) in (old, new)
            if len(image) < offset + len(data):
                image.extend(bytes(offset + len(data) - len(image)))
            image[offset:offset + len(data)] = data
        assert bytes(image) == open(path, "rb").read()


def test_kill_9_during_metadata_commits(workdir, tmp_path):
    require_fuse()
    rng = random.Random(3)
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "k.pycauset")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    acked = None
    outcomes = {"old": 0, "new": 0}
    for point in range(30):
        m = Mount(path, mnt, options=["rw"], log=tmp_path / "kill.log")
        m.kill_after(rng.uniform(0.0, 0.2))
        counter = acked if acked is not None else 0
        try:
            while True:
                counter += 1
                doc = json.loads((mnt / "metadata.json").read_text())
                doc.setdefault("properties", {})["counter"] = counter
                doc["properties"]["padding"] = "x" * rng.randrange(0, 3000)
                with open(mnt / "metadata.json", "w") as f:
                    json.dump(doc, f)
                acked = counter
        except OSError:
            pass
        m.reap_killed()
        loaded = pycauset.load(str(path))  # pycauset itself always loads the file
        got = loaded.properties.get("counter") if "counter" in loaded.properties else None
        assert got in (acked, counter), (point, got, acked, counter)
        outcomes["old" if got == acked else "new"] += 1
        acked = got
        assert np.array_equal(np.asarray(loaded), MATRICES["float64"])
    assert outcomes["old"] > 0


def with_metadata(path, out, **changes):
    """A copy of ``path`` whose metadata (committed the spec's way) has ``changes``."""
    import shutil

    shutil.copy(path, out)
    c = Pycauset(FileStore(out, writable=True))
    meta = to_json(c.metadata)
    meta.update(changes)
    c.commit_metadata(from_json(meta))
    c.store.close()
    return out


@pytest.mark.parametrize("key", ["payload_layout", "view", "data_type", "rows"])
@pytest.mark.parametrize("value", ["raw_dense", ["raw_dense"], 7, {"kind": 7}])
def test_wrong_typed_metadata_values_are_no_crash(workdir, key, value):
    """Every consumer of metadata values checks their type: no .npy view, no traceback."""
    import subprocess

    base = save(pycauset.matrix(MATRICES["float64"]), workdir / "base.pycauset")
    path = with_metadata(base, workdir / "odd.pycauset", **{key: value})
    c = open_container(path)
    assert ("payload.npy" in c.names()) == (key == "view")  # a view not a map: untransposed
    assert c.entry_size("payload") == 96
    assert json.loads(c.read("metadata.json", 0, 1 << 20))[key] == value
    for command in (["info"], ["ls", "-l"], ["info", "--json"]):
        result = subprocess.run(["ctdsfs", *command, str(path)], capture_output=True, text=True)
        assert result.returncode == 0 and result.stderr == "", result.stderr


REFUSED_METADATA = {  # pycauset.load fails on each of these (checked below)
    "rows as a word": {"rows": "three"},
    "rows*cols beyond the payload": {"rows": 1000, "cols": 1000},
    "an unknown data_type": {"data_type": "FLOAT128"},
    "a data_type the matrix type does not take": {"data_type": "INT32"},
    "an unknown matrix_type": {"matrix_type": "NOPE"},
    "negative rows": {"rows": -3},
    "no payload_uuid": {"payload_uuid": ""},
    "a word as scalar": {"view": {"scalar": "a"}},
    "a word as seed": {"seed": "x"},
}


def test_metadata_pycauset_cannot_load_is_refused(workdir, mount):
    base = save(pycauset.matrix(MATRICES["float64"]), workdir / "base.pycauset")
    for why, change in REFUSED_METADATA.items():  # the ground truth: pycauset refuses them
        with pytest.raises(Exception):
            pycauset.load(str(with_metadata(base, workdir / "truth.pycauset", **change)))
    path = save(pycauset.matrix(MATRICES["float64"]), workdir / "m.pycauset")
    before = open(path, "rb").read()
    m = mount(path, options=["rw"])
    doc = json.loads((m.mountpoint / "metadata.json").read_text())
    for why, change in REFUSED_METADATA.items():
        with pytest.raises(OSError) as exc:
            with open(m.mountpoint / "metadata.json", "w") as f:
                json.dump({**doc, **change}, f)
        assert exc.value.errno == errno.EINVAL, why
        assert open(path, "rb").read() == before, why
    accepted = {**doc, "view": {**doc["view"], "is_transposed": True},
                "properties": {"note": "kept"}}
    with open(m.mountpoint / "metadata.json", "w") as f:
        json.dump(accepted, f)
    assert m.close() == 0
    loaded = pycauset.load(str(path))
    assert loaded.properties["note"] == "kept"
    assert np.array_equal(np.asarray(loaded), MATRICES["float64"].T)
