"""Read-only mounts served by several worker processes (``-o workers=N``), on real mounts:
every worker gives the same answers (inode numbers, handles), a worker's death never
leaves a reader hanging, and the mount ends with every worker."""

import fcntl
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import trio

from ctdsfs import fuse_workers
from ctdsfs import mount as mount_module
from ctdsfs.io.shared_arena import SharedArena
from ctdsfs.toolbox import pack

from .conftest import is_mounted, unmount

WALKER = r"""
import hashlib, json, os, random, sys
root, seed = sys.argv[1], int(sys.argv[2])
paths = []
for folder, dirs, files in os.walk(root):
    paths += [os.path.join(folder, name) for name in dirs + files]
random.Random(seed).shuffle(paths)
seen = {}
for path in paths:
    st = os.lstat(path)
    digest = None
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            digest = hashlib.md5(f.read()).hexdigest()
    seen[os.path.relpath(path, root)] = [st.st_ino, digest]
print(json.dumps(seen))
"""


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return set(map(int, f.read().split()))
    except FileNotFoundError:
        return set()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def _workers(m, count):
    """The ``count`` worker processes of mount ``m`` (once all have started)."""
    _wait_for(lambda: len(_children(m.proc.pid)) == count)
    return _children(m.proc.pid)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A directory of files in folders, and a MultiFile of folders inside it; returns the
    directory and ``{relative path: md5}`` of every file the mount shows."""
    root = tmp_path_factory.mktemp("workers") / "tree"
    packed = root.parent / "packed"
    digests = {}
    for top, base in ((root, ""), (packed, "packed.mf/")):
        for d in range(6):
            for f in range(25):
                data = bytes([d, f]) * (97 * f + d) + os.urandom(f)
                path = top / f"d{d}" / f"f{f}.bin"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                digests[f"{base}d{d}/f{f}.bin"] = hashlib.md5(data).hexdigest()
    pack(str(packed), str(root / "packed.mf"), block_size=4096, quiet=True)
    return root, digests


def _walk_in_parallel(mountpoint, count):
    walkers = [subprocess.Popen([sys.executable, "-c", WALKER, str(mountpoint), str(seed)],
                                stdout=subprocess.PIPE) for seed in range(count)]
    return [json.loads(w.communicate(timeout=120)[0]) for w in walkers]


@pytest.mark.fuse
def test_parallel_walkers_see_the_same_inodes_and_bytes(tree, mount):
    """Walkers in parallel, each in its own order, stat and read every file: each path has
    one inode number whichever worker looked it up first, numbers are unique, the bytes
    are the source's; after the kernel forgot the directory source's names (1 s), the
    lookups anew, by any worker, give the same numbers."""
    root, digests = tree
    m = mount(root, ["workers=4"])
    assert len(_workers(m, 4)) == 4
    first = _walk_in_parallel(m.mountpoint, 6)
    time.sleep(1.2)
    again = _walk_in_parallel(m.mountpoint, 3)
    for seen in first + again:
        assert seen == first[0]
    assert {path: digest for path, (_, digest) in first[0].items() if digest} == digests
    inos = [ino for ino, _ in first[0].values()]
    assert len(set(inos)) == len(inos)
    assert not _blocked_in_a_read(_workers(m, 4))


def _blocked_in_a_read(pids, samples=20):
    """The workers whose loop sits in read(2) (of /dev/fuse, with nothing there: woken
    for a request another read first) in any of ``samples`` looks; an idle worker waits
    in epoll_wait, and a read with the GIL held would stall its threads."""
    stuck = set()
    for _ in range(samples):
        for pid in pids:
            with open(f"/proc/{pid}/syscall") as f:
                if f.read().split()[0] == "0":  # (x86-64: read)
                    stuck.add(pid)
        time.sleep(0.025)
    return stuck


@pytest.mark.fuse
def test_inodes_and_handles_outlive_the_workers_that_made_them(tree, mount):
    """Every worker is killed while a file is open and the kernel holds inode numbers
    only they looked up: the workers started in their place read the open handle, answer
    for those numbers, and number the names the kernel looks up again as before."""
    root, digests = tree
    m = mount(root / "packed.mf", ["workers=2"])
    before = json.loads(subprocess.run([sys.executable, "-c", WALKER, str(m.mountpoint), "1"],
                                       capture_output=True, check=True).stdout)
    opened = open(m.mountpoint / "d3" / "f24.bin", "rb")
    try:
        head = opened.read(100)
        old = _workers(m, 2)
        for pid in old:
            os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: len(_children(m.proc.pid) - old) == 2)
        rest = opened.read()  # (the page cache was not kept: read by a new worker)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")  # (the kernel forgets names and inodes: lookups anew)
        after = json.loads(subprocess.run([sys.executable, "-c", WALKER, str(m.mountpoint), "2"],
                                          capture_output=True, check=True).stdout)
    finally:
        opened.close()
    assert hashlib.md5(head + rest).hexdigest() == digests["packed.mf/d3/f24.bin"]
    assert after == before
    assert m.log_text().count("died (signal SIGKILL)") == 2


@pytest.mark.fuse
def test_a_worker_killed_mid_read_fails_only_that_read(tmp_path, mount):
    """A read is held under way in a worker (its source is a directory of another mount,
    whose daemon is stopped); every worker is killed (and the other daemon carries on):
    the read ends at once (the kernel's request failed with ECONNABORTED; the page the
    reader waits for is then asked for again, of the workers started in their place),
    the log says why, and the mount carries on."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "first").write_bytes(bytes(range(256)) * 256)
    (tree / "second").write_bytes(bytes(reversed(range(256))) * 256)
    held = mount(tree, ["workers=1"])
    m = mount(held.mountpoint, ["workers=2"])
    workers = _workers(m, 2)
    os.kill(held.proc.pid, signal.SIGSTOP)
    try:
        reader = subprocess.Popen(["tail", "-c", "4096", str(m.mountpoint / "second")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.5)  # (the read is under way, held by the stopped daemon)
        assert reader.poll() is None
        killed = time.monotonic()
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(held.proc.pid, signal.SIGCONT)
    out, err = reader.communicate(timeout=10)
    assert time.monotonic() - killed < 5
    assert (reader.returncode, out) == (0, bytes(reversed(range(256))) * 16) \
        or (reader.returncode != 0 and out == b"")
    _wait_for(lambda: len(_children(m.proc.pid) - workers) == 2)
    assert sorted(os.listdir(m.mountpoint)) == ["first", "second"]
    assert m.proc.poll() is None
    assert "died (signal SIGKILL), the requests it was answering failed" in m.log_text()


@pytest.mark.fuse
def test_workers_that_keep_dying_end_the_mount(tree, mount):
    """More deaths than two per worker within a minute: the daemon unmounts and ends,
    and no worker is left."""
    root, _ = tree
    m = mount(root, ["workers=2"])
    killed = set()
    while m.proc.poll() is None and len(killed) < 10:
        for pid in _children(m.proc.pid) - killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.1)
    m.proc.wait(timeout=20)
    assert len(killed) in (5, 6) and not is_mounted(m.mountpoint)  # (the 5th ends it)
    assert "ending the mount" in m.log_text()
    assert not any(_alive(pid) for pid in killed)


@pytest.mark.fuse
@pytest.mark.parametrize("how", ["fusermount", "SIGTERM", "worker SIGTERM"])
def test_the_mount_ends_with_every_worker(tree, mount, how):
    """``fusermount3 -u``, SIGTERM to the daemon or to a worker: unmounted, and the
    daemon and every worker end."""
    root, digests = tree
    m = mount(root, ["workers=3"])
    workers = _workers(m, 3)
    assert hashlib.md5((m.mountpoint / "d1" / "f7.bin").read_bytes()).hexdigest() \
        == digests["d1/f7.bin"]
    if how == "fusermount":
        subprocess.run(["fusermount3", "-u", str(m.mountpoint)], check=True)
    else:
        os.kill(m.proc.pid if how == "SIGTERM" else min(workers), signal.SIGTERM)
    assert m.proc.wait(timeout=20) == 0
    assert not is_mounted(m.mountpoint)
    _wait_for(lambda: not any(_alive(pid) for pid in workers))


@pytest.mark.fuse
def test_the_command_returns_once_the_mount_is_live(tree, tmp_path):
    """Without -f, mount.ctdsfs returns once the mount answers: the workers serve the
    first listing; unmounting ends them all."""
    root, _ = tree
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    subprocess.run(["mount.ctdsfs", "-o", "workers=2", str(root), str(mountpoint)], check=True)
    try:
        assert sorted(os.listdir(mountpoint))[:2] == ["d0", "d1"]
        daemons = [int(p) for p in os.listdir("/proc") if p.isdigit() and str(mountpoint)
                   in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")]
        assert len(daemons) == 3  # (the daemon and its two workers)
    finally:
        unmount(mountpoint)
    _wait_for(lambda: not any(_alive(pid) for pid in daemons))


def _mounted_and_read(tree, mount, options):
    root, digests = tree
    m = mount(root, options)
    assert hashlib.md5((m.mountpoint / "d0" / "f3.bin").read_bytes()).hexdigest() \
        == digests["d0/f3.bin"]
    return m


@pytest.mark.fuse
def test_one_worker_is_the_one_process_of_before(tree, mount):
    m = _mounted_and_read(tree, mount, ["workers=1"])
    assert _children(m.proc.pid) == set()


@pytest.mark.fuse
def test_a_mount_of_plain_files_starts_without_numpy(tree, mount):
    """NumPy is loaded by the formats that decode, not by the mount's machinery: its
    import was about a third of a mount's start."""
    m = _mounted_and_read(tree, mount, ["workers=2"])
    for pid in {m.proc.pid} | _workers(m, 2):
        with open(f"/proc/{pid}/maps") as f:
            assert "numpy" not in f.read(), pid


def test_the_workers_option():
    assert mount_module.parse_options("workers=3").workers == 3
    for text, why in (("workers=0", "positive"), ("workers=x", "number"),
                      ("workers=65", "at most 64")):
        with pytest.raises(mount_module.UsageError, match=why):
            mount_module.parse_options(text)
    assert mount_module.default_workers(remote=True) == 1
    assert mount_module.default_workers(remote=False, decoded=True) == 1
    assert 2 <= mount_module.default_workers(remote=False) <= mount_module.DEFAULT_WORKERS_MAX



def test_pyfuse3s_lock_around_a_workers_wait_does_not_schedule():
    """pyfuse3 takes a lock around each wait for a request; in a worker (one task) that
    lock lets no other task of the loop run: a pass through trio's scheduler at every
    request kept the worker that had answered from waiting when a lone reader's next
    request came, and another worker was woken for it."""
    ran = []

    async def other():
        ran.append(True)

    async def take_the_lock():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            async with fuse_workers._TrioWaitingWith(None).Lock():
                pass
            assert not ran
    trio.run(take_the_lock)
    assert ran


def _thread_state_and_cpu(tid):
    """A thread's state letter (R running, S asleep) and CPU seconds so far."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def gate_on_a_pipe():
    """A worker's Gate on a pipe, which polls as /dev/fuse does, and another worker's
    opening of the claim: ``(gate, device_read, device_write, others_claim, own_claim)``."""
    device_read, device_write = os.pipe()  # (a descriptor that polls as /dev/fuse does)
    claim_file = os.memfd_create("claim")
    others_claim, own_claim = (os.open(f"/proc/self/fd/{claim_file}", os.O_RDONLY)
                               for _ in range(2))
    arena = SharedArena(1 << 20)
    arena.attach()
    gate = fuse_workers.Gate(device_read, own_claim, arena)
    yield gate, device_read, device_write, others_claim, own_claim
    for fd in (device_read, device_write, claim_file, others_claim, own_claim):
        os.close(fd)


@pytest.mark.parametrize("spin", ["awake", "asleep once the claimer is slow"])
def test_a_worker_finding_the_read_claimed_waits_awake_for_a_while(monkeypatch, spin,
                                                                  gate_on_a_pipe):
    """Woken for a request that another worker has claimed (it holds the claim until it
    has read the request), a worker waits again awake, not asleep on the claim (a sleep
    and a wake that most requests of a lone reader cost), and then takes the next; but
    a claimer that keeps the claim (stopped, or off the cores) is slept on, not spun
    for: the waiting worker costs no CPU meanwhile."""
    if spin == "awake":
        monkeypatch.setattr(fuse_workers, "SPIN_SECONDS", 60.0)
    gate, device_read, device_write, others_claim, own_claim = gate_on_a_pipe
    fcntl.flock(others_claim, fcntl.LOCK_EX)
    os.write(device_write, b"claimed by the other worker")
    waiting = []

    def wait():
        waiting.append(threading.get_native_id())
        trio.run(gate.wait_readable, device_read)
    worker = threading.Thread(target=wait, daemon=True)
    worker.start()
    time.sleep(0.2)
    _, cpu_before = _thread_state_and_cpu(waiting[0])
    states = {_thread_state_and_cpu(waiting[0])[0] for _ in range(50)}
    time.sleep(0.5)
    cpu = _thread_state_and_cpu(waiting[0])[1] - cpu_before
    os.read(device_read, 100)  # (the other worker reads its request, and lets go)
    fcntl.flock(others_claim, fcntl.LOCK_UN)
    os.write(device_write, b"the next")
    worker.join(10)
    assert not worker.is_alive() and gate._claimed
    if spin == "awake":
        assert "R" in states, states
    else:
        assert states == {"S"} and cpu < 0.1, (states, cpu)
    gate.read_done()


def test_a_worker_done_with_a_quick_request_takes_the_next_waiting(monkeypatch,
                                                                  gate_on_a_pipe):
    """A request answered without letting go of the read claim (a close of a directory,
    which the kernel sends beside the walker's next request) leaves its worker holding
    the claim: it takes the request that waits, so a lone walker's next request is not
    handed to a worker that has not seen the directories it walked; with none waiting,
    the claim is let go."""
    gate, device_read, device_write, others_claim, own_claim = gate_on_a_pipe

    def others_may_claim():
        try:
            fcntl.flock(others_claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(others_claim, fcntl.LOCK_UN)
        return True
    own_flocks = []
    real_flock = fcntl.flock
    monkeypatch.setattr(fcntl, "flock", lambda fd, operation: (
        own_flocks.append(operation) if fd == own_claim else None, real_flock(fd, operation))[1])
    os.write(device_write, b"releasedir")
    trio.run(gate.wait_readable, device_read)
    assert gate._claimed and not others_may_claim()
    os.read(device_read, 100)  # (read, and answered without a read_done)
    os.write(device_write, b"opendir")
    own_flocks.clear()
    trio.run(gate.wait_readable, device_read)
    assert gate._claimed and not others_may_claim() and own_flocks == []
    os.read(device_read, 100)
    ended = []

    def wait_until_closed():
        try:
            trio.run(gate.wait_readable, device_read)
        except trio.ClosedResourceError as exc:  # (how a closed gate ends pyfuse3's loop)
            ended.append(exc)
    worker = threading.Thread(target=wait_until_closed, daemon=True)
    worker.start()  # (nothing waits: the claim is let go, and the worker waits)
    deadline = time.monotonic() + 10
    while not others_may_claim() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert others_may_claim() and not gate._claimed
    gate.close()
    worker.join(10)
    assert not worker.is_alive() and ended


@pytest.mark.fuse
@pytest.mark.parametrize("options", [[], ["workers=2"]])
def test_a_tiledb_array_has_one_process_unless_asked(tmp_path, mount, options):
    """Its files are decoded views: several workers would each decode the same tiles."""
    import numpy as np
    import tiledb

    uri = str(tmp_path / "array")
    schema = tiledb.ArraySchema(domain=tiledb.Domain(tiledb.Dim(name="i", domain=(0, 99), tile=10,
                                                                      dtype=np.int64)),
                                attrs=[tiledb.Attr("v", np.float64)])
    tiledb.Array.create(uri, schema)
    with tiledb.open(uri, "w") as a:
        a[:] = np.arange(100.0)
    m = mount(uri, options)
    assert np.array_equal(np.load(m.mountpoint / "dense" / "v.npy"), np.arange(100.0))
    time.sleep(0.3)
    assert len(_children(m.proc.pid)) == (2 if options else 0)


def test_a_read_write_mount_has_one_process(tmp_path):
    source, mountpoint = tmp_path / "new.mf", tmp_path / "m"
    mountpoint.mkdir()
    result = subprocess.run(["mount.ctdsfs", "-f", "-o", "create,workers=2", str(source),
                             str(mountpoint)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "'workers' is for read-only mounts" in result.stderr
    assert not source.exists() and not is_mounted(mountpoint)


@pytest.mark.parametrize("source", ["https://127.0.0.1:9/obs.mf", "s3://bucket/obs.mf",
                                    "s3://bucket/"])
def test_a_remote_source_has_one_process(tmp_path, source):
    """Each worker would know only what it fetched itself: what one fetched would not stay
    served by the others while the server fails. Refused in one line, before any request."""
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    result = subprocess.run(["mount.ctdsfs", "-f", "-o", "workers=2", source, str(mountpoint)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "'workers' is for local sources" in result.stderr
    assert result.stderr.count("\n") == 1 and not is_mounted(mountpoint)


def _bytes_read(pids):
    """Bytes the processes ``pids`` read so far (rchar: files and /dev/fuse)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/io") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    return total


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """A MultiFile of 60 folders of 40 small files each (block size 512)."""
    tree = tmp_path_factory.mktemp("small") / "tree"
    for d in range(60):
        for f in range(40):
            path = tree / f"d{d}" / f"f{f}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(1000 + 50 * f))
    source = tree.parent / "small.mf"
    pack(str(tree), str(source), block_size=512, quiet=True)
    return source


@pytest.mark.fuse
def test_a_listing_walk_reads_each_first_block_once_however_many_workers(small_files, mount):
    """Listing a MultiFile reads the first bytes of every file (nested container or
    plain?), without the index (``no_index``: as at a first mount) all of a container
    of small files. A walk's requests land on any worker (a listing's batches, each
    directory's own listing, the lookups); what one worker found plain serves the
    others, so together they read the container about once, as one process does, not
    once for each worker a directory's requests reached."""
    m = mount(small_files, ["workers=4", "no_index"])
    workers = _workers(m, 4)
    before = _bytes_read(workers)
    listed = sum(len(files) for _, _, files in os.walk(m.mountpoint))
    assert listed == 60 * 40
    assert _bytes_read(workers) - before < 1.1 * os.path.getsize(small_files)


@pytest.mark.fuse
def test_the_workers_start_with_the_root_learnt(small_files, mount):
    """The kernel's first request (the root's attributes: its 60 nested containers
    opened to count them) is answered before the fork: once the mount is live and has
    answered it, no worker has read the container (only requests, from /dev/fuse)."""
    m = mount(small_files, ["workers=4", "no_index"])
    os.stat(m.mountpoint)
    assert _bytes_read(_workers(m, 4)) < 60 * 512


SHARE_READER = r"""
import hashlib, os, sys
path, part, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
start, end = size * part // parts, size * (part + 1) // parts
digest = hashlib.md5()
while start < end:
    got = os.pread(fd, min(1 << 20, end - start), start)
    assert got, "cut short"
    digest.update(got)
    start += len(got)
sys.stdout.write(digest.hexdigest())
"""


def _read_in_parallel(path, readers):
    """The md5 of each share of ``path``, read by ``readers`` processes at once."""
    procs = [subprocess.Popen([sys.executable, "-c", SHARE_READER, str(path), str(i),
                               str(readers)], stdout=subprocess.PIPE) for i in range(readers)]
    return [p.communicate(timeout=120)[0].decode() for p in procs]


def _decoded_pieces(log):
    """Pieces decoded for the mount, from the daemon's last line about the arena."""
    found = re.findall(r"decoded pieces the workers shared: (\d+) decoded", log)
    assert found, log
    return int(found[-1])


def _decoded_view(tmp_path, kind, values, pieces):
    """(source, path of the view in the mount) of ``values`` in ``pieces`` tiles or chunks."""
    import numpy as np

    if kind == "bcolz":
        import bcolz

        bcolz.carray(values, rootdir=str(tmp_path / "carray"), mode="w",
                     chunklen=len(values) // pieces).flush()
        return tmp_path / "carray", "array.npy"
    import tiledb

    uri = str(tmp_path / "dense")
    tiledb.Array.create(uri, tiledb.ArraySchema(
        domain=tiledb.Domain(tiledb.Dim("i", domain=(0, len(values) - 1),
                                        tile=len(values) // pieces, dtype=np.int64)),
        attrs=[tiledb.Attr("v", dtype=np.float64,
                           filters=tiledb.FilterList([tiledb.ZstdFilter(level=1)]))]))
    with tiledb.open(uri, "w") as array:
        array[:] = values
    return uri, "dense/v.npy"


@pytest.mark.fuse
@pytest.mark.parametrize("kind", ["tiledb", "bcolz"])
def test_the_workers_decode_each_piece_of_a_decoded_view_once(tmp_path, mount, kind):
    """A view of 16 tiles (chunks) read whole by one reader, then by two at once, each its
    half, by four, and by two again after every worker was killed (the page cache dropped
    each time): every reader gets the view's bytes, and each piece was decoded once for
    the mount, whichever worker a reader's requests reached (the workers started in the
    killed ones' place serve what those decoded)."""
    import numpy as np

    values = np.round(np.sin(np.arange(16 << 17) * 1e-3) * 1000, 3)
    source, inside = _decoded_view(tmp_path, kind, values, 16)
    m = mount(source, ["workers=2"])
    view = m.mountpoint / inside
    shown = view.read_bytes()
    assert np.array_equal(np.load(io.BytesIO(shown)), values)
    size = len(shown)

    def expected(readers):
        return [hashlib.md5(shown[size * i // readers:size * (i + 1) // readers]).hexdigest()
                for i in range(readers)]
    for readers in (2, 4):
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        assert _read_in_parallel(view, readers) == expected(readers)
    old = _workers(m, 2)
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: len(_children(m.proc.pid) - old) == 2)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")
    assert _read_in_parallel(view, 2) == expected(2)
    m.close()
    assert _decoded_pieces(m.log.read_text()) == 16
