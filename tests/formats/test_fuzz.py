"""Fuzzing: mutated real containers never crash, hang or exhaust memory.

Seeds are files the real writers made: casacore's MultiFile v1 (with
``_hdrext``) and v2 fixtures (plain, CRC, nested, multi-block header, free
list), a ``.pycauset`` file pycauset itself wrote, and casacore table.dat files.
Each case mutates one seed (random byte flips, a truncation, or a targeted
header field (or two) set to 0, -1, 2**31, 2**62 or 2**63-1; checksums are then
recomputed for half the cases, so the mutation reaches past them) and runs
every library operation on it in a child process with an address-space limit
and a time limit per case: open, list, read every file, walk nested
containers, describe, check and block map (a table.dat: decode, describe,
encode). Only ctdsfs's own errors may come out. A sample of the mutated
files then goes through the real CLI (``info``, ``ls -l``, ``formats.check``,
``map --json``): exit status 0 or 1, no traceback, one line of stderr on
failure.

The RNG is seeded (``CTDSFS_FUZZ_SEED``, default below; ``CTDSFS_FUZZ_CASES``
cases per seed file, ``CTDSFS_FUZZ_CLI_SAMPLE`` of them through the CLI), and a failure names the seed, the case and the
mutation, so ``python3 tests/formats/test_fuzz.py SEED FILE CASE`` replays it.
"""

import functools
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"
SEED = int(os.environ.get("CTDSFS_FUZZ_SEED", "20261123"))
CASES = int(os.environ.get("CTDSFS_FUZZ_CASES", "150"))  # per seed file
CASE_SECONDS = 10
ADDRESS_SPACE = 2 << 30
SPECIALS = (0, -1, 2 ** 31, 2 ** 62, 2 ** 63 - 1)
MULTIFILES = ["casacore_test_v1.mf", "mf2_basic.mf", "mf2_crc.mf", "mf2_nested.mf",
              "mf2_bighdr.mf", "mf2_free.mf"]
TABLE_DATS = ["t_mf.tab/table.dat", "t_mh5.tab/table.dat"]
CLI_COMMANDS = (["info"], ["ls", "-l"], ["check"], ["map", "--json"])  # tableinfo: table.dat
# mutated files per seed file that also go through the CLI (each command a process: the
# most of this test's time)
CLI_SAMPLE = int(os.environ.get("CTDSFS_FUZZ_CLI_SAMPLE", "1"))


# ---------------------------------------------------------------- mutations

def _put(data, offset, width, value, order):
    """Write ``value`` (wrapped to ``width`` bytes, two's complement) at ``offset``."""
    if 0 <= offset and offset + width <= len(data):
        data[offset:offset + width] = (value % (1 << 8 * width)).to_bytes(width, order)


@functools.lru_cache(maxsize=None)
def _multifile_fields(path, raw):
    """(offset, width) of the header fields of a MultiFile and of the containers nested in
    it, found by reading the pristine file: fixed fields, name lengths, continuation
    pointers. The Int64 words between them (counts, indexes, lengths) are picked at random."""
    from ctdsfs.formats import open_container

    fields, regions = [], []
    c = open_container(path, verify_crc=False)
    try:
        def visit(container, base):
            h = container.header
            if h.version == 1:
                fields.extend((base + o, 8) for o in (0, 8, 16))
            else:
                fields.extend((base + o, w) for o, w in ((8, 8), (16, 8), (24, 4), (32, 8),
                                                         (40, 8), (48, 8), (56, 1)))
                fields.extend((base + b * h.block_size, 8) for s in h.cont_sets for b in s)
            head = raw[base:base + min(h.header_size, h.block_size)]
            regions.append((base, base + len(head)))
            for e in h.entries:
                at = head.find(e.name.encode("utf-8", "surrogateescape")) if e.name else -1
                if at >= 4:
                    fields.append((base + at - 4, 4))
            for name in container.names():
                child = container.nested(name)
                if child is not None and base == 0:  # one level: its first block
                    visit(child, int(container._entry(name).blocks[0]) * h.block_size)
        visit(c, 0)
    finally:
        c.close()
    return fields, regions


def _refresh_multifile_crc(data):
    """Recompute a v2 header CRC (block 0 part only: enough for single-block headers)."""
    from ctdsfs.io.crc import crc32_bzip2

    if data[:8] == bytes(8) and len(data) >= 64 and data[56] == 1:
        size = int.from_bytes(data[32:40], "big")
        if 64 <= size <= int.from_bytes(data[40:48], "big") and size <= len(data):
            head = bytearray(data[:size])
            head[28:32] = bytes(4)
            data[28:32] = crc32_bzip2(bytes(head)).to_bytes(4, "big")


def _refresh_pycauset_crcs(data):
    """Recompute both slot CRCs and the metadata block CRC each slot points at."""
    for at in (16, 144):
        slot = data[at:at + 56]
        data[at + 56:at + 60] = struct.pack("<I", zlib.crc32(slot))
        offset, length = struct.unpack("<QQ", slot[24:40])
        if 32 <= length <= len(data) and offset + length <= len(data):
            data[offset + 24:offset + 28] = struct.pack("<I", zlib.crc32(
                data[offset + 32:offset + length]))


def _pycauset_fields(raw):
    fields = [(8, 4), (12, 1), (13, 2), (15, 1)]
    for at in (16, 144):
        fields += [(at + 8 * k, 8) for k in range(7)]
        offset, length = struct.unpack("<QQ", raw[at + 24:at + 40])
        fields += [(offset + o, w) for o, w in ((4, 4), (8, 4), (12, 4), (16, 8), (28, 4))]
        fields += [(o, 4) for o in range(offset + 33, offset + length - 4, 7)]  # typed counts
    return fields


def mutate(kind, path, raw, rng):
    """A mutated copy of ``raw`` and a description of the mutation."""
    data = bytearray(raw)
    choice = rng.random()
    order = "little" if kind == "pycauset" else "big"
    if choice < 0.2:
        end = rng.randrange(len(raw))
        return bytes(data[:end]), f"truncated to {end} bytes"
    if choice < 0.45:
        offsets = [rng.randrange(min(len(raw), 8192)) for _ in range(rng.randint(1, 8))]
        for o in offsets:
            data[o] = rng.randrange(256)
        what = f"bytes at {offsets} randomised"
    else:
        if kind == "multifile":
            fields, regions = _multifile_fields(str(path), raw)
            start, end = rng.choice(regions)
            fields = fields + [(rng.randrange(start, max(start + 1, end - 8)), rng.choice((4, 8)))]
        elif kind == "pycauset":
            fields = _pycauset_fields(raw)
        else:
            fields = [(rng.randrange(len(raw) - 8), rng.choice((4, 8)))]
        changes = []
        for _ in range(rng.choice((1, 1, 2))):  # sometimes two fields that must agree
            offset, width = rng.choice(fields)
            value = rng.choice(SPECIALS)
            _put(data, offset, width, value, order)
            changes.append(f"{width}-byte field at {offset} set to {value}")
        what = " and ".join(changes)
    if rng.random() < 0.5:
        if kind == "multifile":
            _refresh_multifile_crc(data)
        elif kind == "pycauset":
            _refresh_pycauset_crcs(data)
        what += ", checksums recomputed"
    return bytes(data), what


# ---------------------------------------------------------------- the operations

def exercise_container(path):
    """Everything a user can ask of a container file, read-only."""
    from ctdsfs.blockmap import block_map, render_text
    from ctdsfs.formats import open_container
    from ctdsfs.formats.multifile.container import MultiFile
    from ctdsfs.sources.checking import check_path

    for verify in (True, False):
        c = open_container(path, verify_crc=verify)
        try:
            walk(c)
            json.dumps(c.describe())
            if isinstance(c, MultiFile):
                bmap = block_map(c, verify_crc=verify)
                render_text(bmap)
                json.dumps(bmap.to_json())
        finally:
            c.close()
    check_path(path)


def walk(container, depth=0):
    from ctdsfs.errors import BlockError

    for name in container.names():
        size = container.entry_size(name)
        container.entry_blocks(name)
        try:
            for offset in range(0, size, 1 << 20):
                container.read(name, offset, 1 << 20)
        except BlockError:
            pass  # one bad block: EIO for that read, the rest stays readable
        child = container.nested(name)
        if child is not None:
            walk(child, depth + 1)


def exercise_table_dat(path):
    from ctdsfs.formats.casacore import tabledat

    table = tabledat.decode(Path(path).read_bytes(), str(path))
    json.dumps(tabledat.describe(table))
    table.encode()
    table.with_storage("SepFile").encode()


# ---------------------------------------------------------------- the child process

class CaseTimeout(BaseException):
    """A case used more than CASE_SECONDS of CPU (BaseException: no handler swallows it)."""


def _alarm(signum, frame):
    raise CaseTimeout()


def limit_fuzz_child():
    """In a fuzz child: ADDRESS_SPACE of memory, and SIGPROF ends a case (CPU time: a
    loaded machine is no timeout)."""
    import signal
    limit_memory()
    signal.signal(signal.SIGPROF, _alarm)


def run_case(key, case):
    """One case within CASE_SECONDS of CPU: ``case(note)`` mutates and exercises, telling
    ``note`` what it changed. ctdsfs's own errors are a clean end; anything else,
    a timeout included, is printed as one JSON failure line."""
    import signal
    import traceback

    from ctdsfs.errors import CtdsfsError

    what = []
    signal.setitimer(signal.ITIMER_PROF, CASE_SECONDS)
    try:
        case(what.append)
    except CtdsfsError:
        pass
    except (Exception, CaseTimeout) as exc:
        print(json.dumps({"failed": key, "mutation": "; ".join(what),
                          "error": "".join(traceback.format_exception(exc))[-3000:]}),
              flush=True)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def run_cases(seed, seed_files, cases, workdir, only=None):
    """In the child: every case of every seed file; one JSON line per failure."""
    limit_fuzz_child()
    workdir = Path(workdir)
    for source, kind in seed_files:
        raw = Path(source).read_bytes()
        hdrext = Path(source + "_hdrext")
        name = Path(source).name if kind != "table.dat" else Path(source).parent.name + ".dat"
        for case in range(cases) if only is None else [only]:
            rng = random.Random(f"{seed}/{name}/{case}")
            target = workdir / f"{case}-{name}"
            if hdrext.exists():  # v1: mutate the _hdrext file in some cases instead
                shutil.copy(hdrext, str(target) + "_hdrext")
            print(json.dumps({"started": [name, case]}), flush=True)

            def exercise(note, kind=kind, source=source, raw=raw, hdrext=hdrext,
                         target=target, rng=rng):
                if hdrext.exists() and rng.random() < 0.3:
                    data, what = mutate("table.dat", source, hdrext.read_bytes(), rng)
                    note("_hdrext: " + what)
                    Path(str(target) + "_hdrext").write_bytes(data)
                    target.write_bytes(raw)
                else:
                    data, what = mutate(kind, source, raw, rng)
                    note(what)
                    target.write_bytes(data)
                if kind == "table.dat":
                    exercise_table_dat(target)
                else:
                    exercise_container(target)

            run_case([name, case], exercise)
            if case % max(1, cases // CLI_SAMPLE) == 0:  # kept for the CLI sample
                keep = workdir / "cli" / f"{case}-{name}"
                if kind == "table.dat":  # a table directory holding it
                    keep.mkdir(parents=True)
                    keep = keep / "table.dat"
                keep.parent.mkdir(exist_ok=True)
                shutil.copy(target, keep)
                if Path(str(target) + "_hdrext").exists():
                    shutil.copy(str(target) + "_hdrext", str(keep) + "_hdrext")
            for leftover in (target, Path(str(target) + "_hdrext")):
                if leftover.exists():
                    leftover.unlink()


def seed_files(workdir):
    """(path, kind) of every seed: the casacore fixtures and a file pycauset writes now."""
    workdir = Path(workdir)
    seeds = [(str(DATA / name), "multifile") for name in MULTIFILES]
    seeds += [(str(DATA / name), "table.dat") for name in TABLE_DATS]
    made = workdir / "matrix.pycauset"
    subprocess.run([sys.executable, "-c",
                    "import numpy, pycauset; m = pycauset.matrix(numpy.arange(12.0)"
                    ".reshape(3, 4)); m.properties['note'] = 'fuzz seed'; "
                    f"pycauset.save(m, {str(made)!r})"], check=True, cwd=workdir)
    return seeds + [(str(made), "pycauset")]


def run_child(seed, seeds, cases, workdir, only=None):
    """Run the cases in a child process; (failures, cases started, exit status, stderr)."""
    args = json.dumps({"seed": seed, "seeds": seeds, "cases": cases, "workdir": str(workdir),
                       "only": only})
    proc = subprocess.run([sys.executable, __file__, "--child", args], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONHASHSEED="0"))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failures = [line for line in lines if "failed" in line]
    started = [line["started"] for line in lines if "started" in line]
    return failures, started, proc.returncode, proc.stderr


# ---------------------------------------------------------------- the tests

def test_mutated_containers_fail_cleanly(tmp_path):
    seeds = seed_files(tmp_path)
    failures, started, status, stderr = run_child(SEED, seeds, CASES, tmp_path)
    assert status == 0, (f"fuzz child died (status {status}) in case {started[-1:]} of seed "
                         f"{SEED}: {stderr[-2000:]}")
    report = [f"seed {SEED} file {f['failed'][0]} case {f['failed'][1]} ({f['mutation']}):\n"
              f"{f['error']}" for f in failures]
    assert not failures, "\n".join(report[:5])
    assert len(started) == len(seeds) * CASES  # every case ran
    sample = sorted((tmp_path / "cli").iterdir())
    assert len(sample) >= len(seeds) * CLI_SAMPLE
    _run_cli_sample([p for p in sample if not p.name.endswith("_hdrext")])


def peak_rss():
    """This process's peak resident memory in bytes since it started its program: VmHWM,
    not ru_maxrss, which a child keeps from the parent it was forked from across exec
    (a test child would report pytest's own memory)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def limit_memory():
    """In a child: at most ADDRESS_SPACE of memory."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _run_cli_sample(paths):
    env = dict(os.environ, LC_ALL="C.UTF-8")
    for path in paths:
        for command in CLI_COMMANDS if path.is_file() else (["tableinfo"],):
            args = ["ctdsfs", command[0], str(path), *command[1:]]
            result = subprocess.run(args, capture_output=True, text=True, env=env,
                                    timeout=60, preexec_fn=limit_memory)
            where = f"seed {SEED}: {' '.join(args)}"
            assert result.returncode in (0, 1), (where, result.returncode, result.stderr)
            assert not any(bad in result.stderr for bad in
                           ("Traceback", "internal error", "MemoryError")), (where, result.stderr)
            if result.returncode == 1:
                assert result.stderr.count("\n") <= 1, (where, result.stderr)


# ---------------------------------------------------------------- TileDB arrays
# Arrays tiledb-py writes here, mutated in ways aimed at a directory format: bytes of any
# file flipped or cut, folders and files replaced by links to another array outside
# (whose cells and metadata carry a marker that must never be read), decompression
# bombs, hostile chunk sizes, and hostile values in the decoded schema (filter
# pipelines). Every operation runs in a child with an address-space and a time limit;
# only ctdsfs's own errors may come out, no marker may appear in anything read, and the
# child's peak memory stays bounded.

TILEDB_CASES = int(os.environ.get("CTDSFS_FUZZ_TILEDB_CASES", "30"))  # per seed array
TILEDB_MAX_RSS = 512 << 20  # the child's peak resident memory: its tile cache (128 MiB), the
# tiles decoded ahead in threads beside it (420 MB seen once); a bomb inflates to 1 GiB
OUTSIDE_MARKER = b"OUTSIDE-MARKER"
OUTSIDE_INT = 0x0BADC0DE0BADC0DE  # every cell of the outside array's int64 attribute
BOMB_BYTES = 256 << 20  # what a bomb part inflates to
TILEDB_MUTATIONS = ("flip", "truncate", "link folder", "link file", "bomb", "chunk sizes",
                    "schema", "pipeline")
HOSTILE_FILTERS = (  # (type, options) put in place of a ZSTD filter of the schema
    (15, struct.pack("<ddQ", 1.0, 0.0, 3)),  # SCALE_FLOAT of byte width 3
    (15, struct.pack("<dd", 1.0, 0.0)),  # SCALE_FLOAT, options cut short
    (19, struct.pack("<BiB", 19, 1, 250)),  # DELTA reinterpreting as an unknown type
    (7, struct.pack("<I", 0)),  # BIT_WIDTH_REDUCTION, window 0
    (99, b""),  # an unknown filter
    (2, struct.pack("<B", 2)),  # ZSTD, options cut short
)


def write_tiledb_seeds(workdir):
    """Two arrays (sparse with many filters, dense) and the outside twin of each."""
    import numpy as np
    import tiledb

    def sparse(uri, marker):
        dom = tiledb.Domain(tiledb.Dim("x", domain=(0, 999), tile=100, dtype=np.int64))
        filters = {"a": [], "g": [tiledb.GzipFilter()], "z": [tiledb.ZstdFilter()],
                   "l": [tiledb.LZ4Filter()], "b": [tiledb.Bzip2Filter()],
                   "d": [tiledb.DoubleDeltaFilter(), tiledb.ChecksumMD5Filter()],
                   "r": [tiledb.RleFilter()], "s": [tiledb.FloatScaleFilter(0.5, 1.0, 2)]}
        attrs = [tiledb.Attr(n, dtype=np.float64 if n == "s" else np.int64,
                             filters=tiledb.FilterList(f)) for n, f in filters.items()]
        attrs += [tiledb.Attr("text", dtype=str, var=True),
                  tiledb.Attr("m", dtype=np.int32, nullable=True,
                              filters=tiledb.FilterList([tiledb.ZstdFilter()]))]
        zstd = tiledb.FilterList([tiledb.ZstdFilter()])
        tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, sparse=True, attrs=attrs,
                                                    capacity=64, offsets_filters=zstd,
                                                    validity_filters=zstd))
        for t in (1, 2):
            n = 150
            values = np.full(n, OUTSIDE_INT, np.int64) if marker else \
                np.arange(n, dtype=np.int64) * t
            data = {name: values for name in filters}
            data["s"] = np.arange(n, dtype=np.float64)
            data["text"] = np.array([OUTSIDE_MARKER.decode() if marker else f"in{i}"
                                     for i in range(n)], dtype=object)
            data["m"] = np.ma.masked_array(np.arange(n, dtype=np.int32),
                                           mask=np.arange(n) % 4 == 0)
            with tiledb.open(uri, "w", timestamp=t) as A:
                A[np.arange(n) * 3 + t] = data
                A.meta["outside_key" if marker else "key"] = \
                    OUTSIDE_MARKER.decode() if marker else "inside"

    def dense(uri, marker):
        dom = tiledb.Domain(tiledb.Dim("r", domain=(0, 19), tile=5, dtype=np.int64))
        tiledb.Array.create(uri, tiledb.ArraySchema(domain=dom, attrs=[
            tiledb.Attr("a", dtype=np.int64, filters=tiledb.FilterList([tiledb.ZstdFilter()])),
            tiledb.Attr("text", dtype=str, var=True)]))
        with tiledb.open(uri, "w", timestamp=1) as A:
            A[0:20] = {"a": np.full(20, OUTSIDE_INT if marker else 5, np.int64),
                       "text": np.array([OUTSIDE_MARKER.decode() if marker else "in"] * 20,
                                        dtype=object)}
            A.meta["outside_key" if marker else "key"] = 1

    workdir = Path(workdir)
    seeds = []
    for name, writer in (("sparse", sparse), ("dense", dense)):
        writer(str(workdir / name), False)
        writer(str(workdir / f"outside-{name}"), True)
        seeds.append(str(workdir / name))
    return seeds


def _tiledb_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@functools.lru_cache(maxsize=None)
def _bomb_payload(ftype):
    """BOMB_BYTES of zeros compressed by GZIP (1) or ZSTD (2, declaring its content
    size), made once."""
    if ftype == 1:
        z = zlib.compressobj(9)
        block = bytes(1 << 20)
        return b"".join([z.compress(block) for _ in range(BOMB_BYTES >> 20)] + [z.flush()])
    import zstandard
    return zstandard.ZstdCompressor(write_content_size=True).compress(bytes(BOMB_BYTES))


def _bomb_tile(rng):
    """A tile of one chunk whose one compressed part inflates far past what it declares:
    GZIP declaring nothing, or a ZSTD frame declaring its real (huge) content size."""
    ftype = rng.choice((1, 2))
    declared = 0 if ftype == 1 else rng.choice((0, 800, 1 << 20))
    payload = _bomb_payload(ftype)
    meta = struct.pack("<IIII", 0, 1, declared, len(payload))
    chunk = struct.pack("<QIII", 1, declared, len(payload), len(meta)) + meta + payload
    return ftype, declared, chunk


def mutate_tiledb(array, outside, rng):
    """Mutate the array folder ``array`` in place; what was done."""
    kind = rng.choice(TILEDB_MUTATIONS)
    files = _tiledb_files(array)
    if kind in ("flip", "truncate"):
        rel = rng.choice(files)
        data = bytearray((array / rel).read_bytes())
        if kind == "truncate" or not data:
            del data[rng.randrange(len(data) + 1):]
        else:
            for _ in range(rng.choice((1, 2, 8))):
                data[rng.randrange(len(data))] = rng.randrange(256)
        (array / rel).write_bytes(bytes(data))
        return f"{kind} {rel}"
    if kind == "link folder":
        folders = sorted({str(Path(f).parent) for f in files} - {"."})
        rel = rng.choice(folders)
        twin = outside / rel
        if not twin.exists():  # a fragment folder: the outside array's, with its commit
            name = rng.choice(sorted(os.listdir(outside / "__fragments")))
            twin = outside / "__fragments" / name
            shutil.copy(outside / "__commits" / f"{name}.wrt", array / "__commits")
            rel = str(Path(rel).parent / name) if rng.random() < 0.5 else rel
        if (array / rel).exists():
            shutil.rmtree(array / rel)
        (array / rel).symlink_to(twin)
        return f"{kind} {rel} -> {twin}"
    if kind == "link file":
        rel = rng.choice(files)
        twins = [f for f in _tiledb_files(outside) if Path(f).parent == Path(rel).parent
                 or Path(f).name == Path(rel).name] or _tiledb_files(outside)
        twin = outside / rng.choice(twins)
        (array / rel).unlink()
        (array / rel).symlink_to(twin)
        return f"{kind} {rel} -> {twin}"
    if kind == "bomb":  # a generic tile (a whole file) or a data tile (cut to its file)
        tiles = [f for f in files if f.startswith(("__meta/", "__schema/"))]
        rel = rng.choice(tiles if rng.random() < 0.7 else
                         [f for f in files if f.endswith(".tdb")])
        ftype, declared, chunk = _bomb_tile(rng)
        path = array / rel
        if rel.startswith(("__meta/", "__schema/")):
            version = struct.unpack("<I", path.read_bytes()[:4])[0]
            pipeline = struct.pack("<IIBIBi", 0, 1, ftype, 5, ftype, 1)
            path.write_bytes(struct.pack("<IQQBQBI", version, len(chunk), declared, 6, 1, 0,
                                         len(pipeline)) + pipeline + chunk)
        else:  # a data tile, padded to the size the fragment metadata declares
            size = path.stat().st_size
            path.write_bytes(chunk[:max(size, 0)] + bytes(max(0, size - len(chunk))))
        return f"bomb {rel} ({'GZIP' if ftype == 1 else 'ZSTD'}, declaring {declared})"
    if kind == "chunk sizes":
        rel = rng.choice([f for f in files if f.endswith(".tdb")
                          and "__fragment_metadata" not in f] or files)
        data = bytearray((array / rel).read_bytes())
        at = rng.choice((0, 8, 12, 16))
        _put(data, at, 8 if at == 0 else 4, rng.choice(SPECIALS), "little")
        (array / rel).write_bytes(bytes(data))
        return f"chunk sizes {rel} at {at}"
    from ctdsfs.formats.tiledb.array import read_generic_tile  # hostile values in the schema
    rel = next(f for f in files if f.startswith("__schema/") and f.count("/") == 1)
    body = bytearray(read_generic_tile((array / rel).read_bytes(), 0, "schema")[0])
    zstd = struct.pack("<BIB", 2, 5, 2)  # a ZSTD filter (its level follows)
    found = [i for i in range(len(body)) if body.startswith(zstd, i)]
    if kind == "pipeline" and found:
        at = rng.choice(found)
        ftype, options = rng.choice(HOSTILE_FILTERS)
        body[at:at + len(zstd) + 4] = struct.pack("<BI", ftype, len(options)) + options
        kind = f"pipeline: filter {ftype} at {at}"
    for _ in range(rng.choice((1, 2, 4)) if kind == "schema" else 0):
        if rng.random() < 0.5:
            body[rng.randrange(len(body))] = rng.randrange(256)
        else:
            _put(body, rng.randrange(len(body)), 4, rng.choice(SPECIALS), "little")
    chunks = struct.pack("<QIII", 1, len(body), len(body), 0) + bytes(body)
    pipeline = struct.pack("<II", 0, 0)
    (array / rel).write_bytes(struct.pack("<IQQBQBI", 22, len(chunks), len(body), 6, 1, 0,
                                          len(pipeline)) + pipeline + chunks)
    return f"{kind} {rel}"


def _walk_read_all(container, seen):
    """Every byte of every file (links in raw/ not followed), into ``seen``'s checks."""
    from ctdsfs.errors import BlockError

    for name in container.names():
        link = getattr(container, "symlink_target", lambda n: None)(name)
        if link is not None:
            continue
        child = container.nested(name)
        if child is not None:
            _walk_read_all(child, seen)
            continue
        size = container.entry_size(name)
        for offset in range(0, size, 1 << 20):
            try:
                seen(bytes(container.read(name, offset, 1 << 20)))
            except BlockError:
                pass


def _assert_no_outside_byte(data):
    marker = struct.pack("<q", OUTSIDE_INT)
    assert OUTSIDE_MARKER not in data and marker not in data and b"outside_key" not in data, \
        "a byte from outside the array"


def run_tiledb_cases(seed, seeds, cases, workdir):
    """In the child: every case of every seed array; one JSON line per failure, then the
    peak memory."""
    from ctdsfs.formats import open_container

    limit_fuzz_child()
    workdir = Path(workdir)
    for ftype in (1, 2):  # (made before the cases: their time limit is for ctdsfs)
        _bomb_payload(ftype)
    for source in map(Path, seeds):
        outside = source.parent / f"outside-{source.name}"
        for case in range(cases):
            rng = random.Random(f"{seed}/tiledb-{source.name}/{case}")
            target = workdir / f"{case}-{source.name}"
            shutil.copytree(source, target, symlinks=True)
            print(json.dumps({"started": [source.name, case]}), flush=True)

            def exercise(note, target=target, outside=outside, rng=rng):
                note(mutate_tiledb(target, outside, rng))
                array = open_container(str(target))
                _walk_read_all(array, _assert_no_outside_byte)
                _assert_no_outside_byte(json.dumps(array.describe()).encode())
                problems, notes = array.check()
                _assert_no_outside_byte("\n".join(problems + notes).encode())

            run_case([source.name, case], exercise)
            if case % max(1, cases // CLI_SAMPLE) == 0:
                shutil.copytree(target, workdir / "cli" / target.name, symlinks=True)
            shutil.rmtree(target)
    print(json.dumps({"peak_rss": peak_rss()}), flush=True)


def test_mutated_tiledb_arrays_fail_cleanly(tmp_path):
    seeds = write_tiledb_seeds(tmp_path)
    args = json.dumps([SEED, seeds, TILEDB_CASES, str(tmp_path)])
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from tests.formats.test_fuzz import run_tiledb_cases; "
            "run_tiledb_cases(*json.loads(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[2]), args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONHASHSEED="0"))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    started = [line["started"] for line in lines if "started" in line]
    assert proc.returncode == 0, (f"TileDB fuzz child died (status {proc.returncode}) in "
                                  f"case {started[-1:]} of seed {SEED}: {proc.stderr[-2000:]}")
    failures = [line for line in lines if "failed" in line]
    report = [f"seed {SEED} array {f['failed'][0]} case {f['failed'][1]} ({f['mutation']}):\n"
              f"{f['error']}" for f in failures]
    assert not failures, "\n".join(report[:5])
    assert len(started) == len(seeds) * TILEDB_CASES
    peak = next(line["peak_rss"] for line in lines if "peak_rss" in line)
    assert peak < TILEDB_MAX_RSS, peak
    env = dict(os.environ, LC_ALL="C.UTF-8")
    for index, path in enumerate(sorted((tmp_path / "cli").iterdir())):
        for command in (("info", "check")[index % 2],):
            args = ["ctdsfs", command, str(path)]
            result = subprocess.run(args, capture_output=True, text=True, env=env,
                                    timeout=60, preexec_fn=limit_memory)
            where = f"seed {SEED}: {' '.join(args)}"
            assert result.returncode in (0, 1), (where, result.returncode, result.stderr)
            assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr, \
                (where, result.stderr)
            _assert_no_outside_byte((result.stdout + result.stderr).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        options = json.loads(sys.argv[2])
        run_cases(options["seed"], options["seeds"], options["cases"], options["workdir"],
                  options["only"])
    else:  # replay one case: SEED FILE CASE (FILE as named in the failure)
        import tempfile

        seed, file_name, case = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
        with tempfile.TemporaryDirectory() as work:
            chosen = [s for s in seed_files(work) if Path(s[0]).name == file_name or
                      Path(s[0]).parent.name + ".dat" == file_name]
            run_cases(seed, chosen, case + 1, work, only=case)
