"""Fuzzing bcolz rootdirs and bloscpack files: hostile input never crashes, hangs, exhausts
memory, serves a byte from outside the source, or writes outside it (issue 24).

Seeds are a carray and a ctable bcolz wrote and a bloscpack file built from its format
(tests/formats/bcolz/test_bcolz.py). Each case copies one seed and mutates it: byte flips or a
truncation of a file inside it, hostile JSON values in ``meta/sizes``, ``meta/storage``,
``__attrs__`` or ``__rootdirs__``, special values in a superchunk's or a Blosc chunk's
header fields, or links: a folder (``data``, ``meta``, a column) or a superchunk replaced
by a symbolic link to a copy outside the source, a superchunk or a temporary's name made a
hard link to a file outside. The copy outside holds a marker value no seed holds. Every
case runs open, walk (read every file), describe, info and check read-only, and some a
read-write overwrite and append, in a child with an address-space and a time limit. Only
ctdsfs's own errors may come out, no read may return the marker, and the outside files
keep their bytes. A sample goes through the real CLI (``info``, ``formats.check``).
``python3 -m tests.formats.bcolz.test_fuzz_bcolz SEED CASE`` replays one case.
"""

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from ..test_fuzz import limit_fuzz_child, limit_memory, run_case

SEED = int(os.environ.get("CTDSFS_FUZZ_SEED", "20261125"))
CASES = int(os.environ.get("CTDSFS_FUZZ_BCOLZ_CASES", "90"))
SPECIALS = (0, -1, 2 ** 31, 2 ** 62, 2 ** 63 - 1, 2 ** 31 - 1)
MARKER = struct.pack("<d", 987654321.125)  # what the outside copies hold, and no seed
CLI_SAMPLE = 2


# ---------------------------------------------------------------- seeds

def make_seeds(workdir):
    """A carray, a ctable (bcolz writes them), a bloscpack file, and their outside twins."""
    import bcolz
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parents[3]))
    from tests.formats.bcolz.test_bcolz import bloscpack_file

    workdir = Path(workdir)
    seeds = workdir / "seeds"
    outside = workdir / "outside"
    for base, value in ((seeds, None), (outside, 987654321.125)):
        base.mkdir()

        def values(n, dtype=np.float64):
            return np.full(n, value, dtype) if value is not None else np.arange(n, dtype=dtype)
        carray = bcolz.carray(values(1050), rootdir=str(base / "carray"), mode="w",
                              chunklen=100, cparams=bcolz.cparams(cname="lz4"))
        carray.attrs["note"] = "fuzz seed"
        carray.flush()
        bcolz.ctable([values(300), values(300), np.arange(300, dtype=np.int32)],
                     names=["a", "b", "n"], rootdir=str(base / "ctable"), mode="w").flush()
        data = values(2000).tobytes()
        bloscpack_file(base / "packed.blp", data, chunk_size=4096, checksum=1,
                       metadata={"dtype": "'<f8'", "shape": [2000], "order": "C",
                                 "container": "numpy"})
    (outside / "secret").write_bytes(MARKER * 64)
    return seeds, outside


# ---------------------------------------------------------------- mutations

def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _json_mutation(path, rng):
    """A hostile value for one key of a JSON file (or the whole file)."""
    try:
        value = json.loads(path.read_text())
    except ValueError:
        value = {}
    hostile = [-1, 2 ** 63, 2 ** 64 + 1, 1e308, None, "x" * 1000, [], {}, [[[]]],
               [2 ** 40, 2 ** 40], "<f8", "|O", "V0", "(3,)f8", "[" * 50000, True]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        sub = value[key]
        if isinstance(sub, dict) and sub:
            sub[rng.choice(sorted(sub))] = rng.choice(hostile)
        elif isinstance(sub, list) and sub and rng.random() < 0.5:
            sub[rng.randrange(len(sub))] = rng.choice(hostile)
        else:
            value[key] = rng.choice(hostile)
        text = json.dumps(value)
    else:
        text = json.dumps(rng.choice(hostile)) if rng.random() < 0.5 else "{" * 100000
    path.write_text(text)
    return f"{path.name}: {text[:80]}"


def _header_mutation(path, rng):
    """A special value in the 16-byte superchunk header or the Blosc chunk header after it."""
    data = bytearray(path.read_bytes())
    offset, width = rng.choice([(4, 1), (8, 8), (16, 1), (17, 1), (18, 1), (19, 1), (20, 4),
                                (24, 4), (28, 4)])
    value = rng.choice(SPECIALS)
    if offset + width <= len(data):
        data[offset:offset + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
    path.write_bytes(bytes(data))
    return f"{path.name}: field at {offset} = {value}"


def _bytes_mutation(path, rng):
    data = bytearray(path.read_bytes())
    if data and rng.random() < 0.3:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"{path.name}: truncated to {cut}"
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{path.name}: bytes flipped"


def _link_mutation(target, twin, outside, rng):
    """A folder or file inside ``target`` replaced by a link to ``twin``'s (outside)."""
    inner = [p for p in sorted(target.rglob("*")) if not p.is_symlink()]
    path = rng.choice(inner)
    rel = path.relative_to(target)
    kind = rng.random()
    if kind < 0.2:  # the temporaries a write makes, planted as hard links to a file outside
        folder = rng.choice([p for p in inner if p.name == "data" and p.is_dir()])
        last = max((p for p in folder.glob("__*.blp")), key=lambda p: int(p.stem[2:]))
        for planted in (last.parent / f".{last.name}.ctdsfs-new",
                        folder.parent / "meta" / ".sizes.ctdsfs-new"):
            os.link(outside / "secret", planted)
        return f"{folder.relative_to(target)}: temporaries hard links to a file outside"
    if path.is_file() and kind < 0.4 and (twin / rel).exists():
        path.unlink()
        os.link(twin / rel, path)
        return f"{rel}: hard link to the outside copy (a file of the source now)"
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    os.symlink(twin / rel if (twin / rel).exists() else outside / "secret", path)
    return f"{rel}: symbolic link outside"


def mutate(seed_dir, outside, name, target, rng):
    """Copy seed ``name`` to ``target`` and mutate it; the mutation, said in a line."""
    source, twin = seed_dir / name, outside / name
    if source.is_dir():
        shutil.copytree(source, target)
        files = _files(target)
    else:
        shutil.copy(source, target)
        files = [target]
    choice = rng.random()
    if source.is_dir() and choice < 0.3:
        return _link_mutation(target, twin, outside, rng), True
    path = rng.choice(files)
    if path.name in ("sizes", "storage", "__attrs__", "__rootdirs__") and choice < 0.7:
        return _json_mutation(path, rng), False
    if path.name.endswith(".blp") and choice < 0.7:
        return _header_mutation(path, rng), False
    return _bytes_mutation(path, rng), False


# ---------------------------------------------------------------- the operations

def walk(container, seen):
    """Read every file (links are not files: a mount shows them as links). ``seen``:
    whether the marker may be read (a hard link makes an outside file one of the source)."""
    from ctdsfs.errors import BlockError

    for name in container.names():
        if container.symlink_target(name) is not None:
            continue
        child = container.nested(name)
        if child is not None:
            walk(child, seen)
            continue
        size = container.entry_size(name)
        try:
            for offset in range(0, size, 1 << 20):
                data = container.read(name, offset, 1 << 20)
                assert seen or MARKER not in bytes(data), f"{name}: a byte from outside the source"
        except BlockError:
            pass  # one bad chunk: EIO for that read


def exercise(path, writes, hard_linked):
    from ctdsfs.formats import open_container
    from ctdsfs.sources.checking import check_path

    c = open_container(path)
    try:
        walk(c, hard_linked)
        info = c.describe()
        json.dumps(info)
        c.info_lines(info)
    finally:
        c.close()
    check_path(path)
    if writes and path.is_dir():
        c = open_container(path, writable=True)
        try:
            name = next(n for n in c.names() if n.endswith(".npy") and n != "table.npy")
            size = c.entry_size(name)
            c.write(name, size - 8, struct.pack("<d", 1.5))
            c.write(name, size, struct.pack("<d", 2.5))
        except StopIteration:
            pass
        finally:
            c.close()


# ---------------------------------------------------------------- the child process

def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in _files(folder) if p.name == "secret" or p.suffix == ".blp"}


def run_cases(seed, workdir, cases, only=None):
    """In the child: every case; one JSON line per failure."""
    limit_fuzz_child()
    workdir = Path(workdir)
    seeds, outside = workdir / "seeds", workdir / "outside"
    before = _digest(outside)
    names = sorted(p.name for p in seeds.iterdir())
    for case in range(cases) if only is None else [only]:
        rng = random.Random(f"{seed}/{case}")
        name = names[case % len(names)]
        target = workdir / "cases" / f"{case}-{name}"
        target.parent.mkdir(exist_ok=True)
        print(json.dumps({"started": case}), flush=True)

        def exercise_case(note, name=name, target=target, rng=rng):
            what, linked = mutate(seeds, outside, name, target, rng)
            note(what)
            exercise(target, writes=linked or rng.random() < 0.3,
                     hard_linked="hard link" in what)
            assert _digest(outside) == before, "a file outside the source was written"

        run_case(case, exercise_case)
        if case % max(1, cases // CLI_SAMPLE) == 0:
            continue  # kept for the CLI sample
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def run_child(seed, workdir, cases, only=None):
    args = json.dumps({"seed": seed, "workdir": str(workdir), "cases": cases, "only": only})
    proc = subprocess.run([sys.executable, "-m", "tests.formats.bcolz.test_fuzz_bcolz", "--child", args],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[3],
                          env=dict(os.environ, PYTHONHASHSEED="0"))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return ([line for line in lines if "failed" in line],
            [line["started"] for line in lines if "started" in line],
            proc.returncode, proc.stderr)


# ---------------------------------------------------------------- the test

def test_mutated_rootdirs_fail_cleanly(tmp_path):
    make_seeds(tmp_path)
    failures, started, status, stderr = run_child(SEED, tmp_path, CASES)
    assert status == 0, (f"fuzz child died (status {status}) in case {started[-1:]} of seed "
                         f"{SEED}: {stderr[-2000:]}")
    report = [f"seed {SEED} case {f['failed']} ({f['mutation']}):\n{f['error']}"
              for f in failures]
    assert not failures, "\n".join(report[:5])
    assert len(started) == CASES
    sample = sorted((tmp_path / "cases").iterdir())
    assert len(sample) >= CLI_SAMPLE
    env = dict(os.environ, LC_ALL="C.UTF-8")
    for path in sample:
        for command in (["info"], ["check"]):
            args = ["ctdsfs", command[0], str(path), *command[1:]]
            result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60,
                                    preexec_fn=limit_memory)
            where = f"seed {SEED}: {' '.join(args)}"
            assert result.returncode in (0, 1), (where, result.returncode, result.stderr)
            assert not any(bad in result.stderr for bad in
                           ("Traceback", "internal error", "MemoryError")), (where, result.stderr)
            assert MARKER.decode("latin-1") not in result.stdout
            if result.returncode == 1:
                assert result.stderr.count("\n") <= 1, (where, result.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        options = json.loads(sys.argv[2])
        run_cases(options["seed"], options["workdir"], options["cases"], options["only"])
    else:  # replay one case: SEED CASE
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            make_seeds(work)
            run_cases(int(sys.argv[1]), work, int(sys.argv[2]) + 1, only=int(sys.argv[2]))
