"""Containers on S3 (a real SeaweedFS) and HTTP (a real nginx), mounted and read as files.

Both servers run on loopback ports for the whole session (``servers.py``: started
and stopped by PID, SIGKILL after a short grace); the fault tests stop
(SIGSTOP) or kill them in the middle of reads.
"""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctdsfs.formats import open_container
from ctdsfs.formats.multihdf5 import probe
from ctdsfs.remote.store import FAILED_SECONDS, RemoteError, RemoteOptions, RemoteStore
from ctdsfs.toolbox import pack

from ..conftest import BUCKET, DATA, evicted, make_casacore_table
from ..formats.multifile.test_write import snapshot
from ..servers import CREDENTIALS, wait_until
from ..test_toolbox import dump_values
from .test_hostile_http import concurrent_users

FLOOR = Path(__file__).resolve().parents[2] / "scripts" / "pyfuse3_floor.py"
CONTAINERS = ["casacore_test_v1.mf", "mf2_nested.mf", "mf2_crc.mf", "mh5_basic.mfh5",
              "m.pycauset"]
FAST_FAILURE = "timeout=1,retries=1,chunk_size=4096,readahead=1"  # faults fail in seconds
# what a read(2) of a mount with FAST_FAILURE may take, as docs/remote.md promises it
# ((retries + 1) x timeout and about a second, with a margin for a loaded machine), and
# what one of a chunk that failed a moment ago may take (less than one attempt's timeout)
BOUND, FAST = 2 * 1 + 1.5, 1.0


def tree(root):
    """Every file under a mount point: {'dir/name': bytes}, directories as 'dir/': b''."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        out.update({prefix + d + "/": b"" for d in dirs})
        for f in files:
            out[prefix + f] = Path(dirpath, f).read_bytes()
    return out


def run(*cmd, env=None, timeout=60):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.fuse
@pytest.mark.parametrize("scheme", ["s3", "http"])
@pytest.mark.parametrize("name", CONTAINERS)
def test_remote_mount_shows_the_local_container(seaweed, web, objects, mount, scheme, name):
    server = seaweed if scheme == "s3" else web
    options = [seaweed.options] if scheme == "s3" else []
    m = mount(server.url(name), options)
    local = open_container(objects / name)
    try:
        assert tree(m.mountpoint) == snapshot(local)
    finally:
        local.close()
    with pytest.raises(OSError) as exc:
        (m.mountpoint / "new").write_bytes(b"x")
    assert exc.value.errno == errno.EROFS


@pytest.mark.fuse
def test_https_source_with_the_systems_trust_settings(web, objects, mount, tmp_path,
                                                       monkeypatch):
    (tmp_path / "mnt").mkdir()
    refused = run("mount.ctdsfs", web.tls_url("mf2_crc.mf"), tmp_path / "mnt")
    assert refused.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    monkeypatch.setenv("SSL_CERT_FILE", str(web.certificate))  # OpenSSL's own convention
    m = mount(web.tls_url("mf2_crc.mf"))
    assert tree(m.mountpoint) == snapshot(open_container(objects / "mf2_crc.mf"))


def test_remote_sources_refuse_rw_and_credentials(seaweed, tmp_path):
    (tmp_path / "mnt").mkdir()
    for options, said in (("rw", "read-only"), ("create", "read-only"),
                          (f"{seaweed.options},secret=abc", "never from the command line"),
                          ("endpoint_url=http://x", "s3:// or http(s):// source only")):
        source = DATA / "mf2_basic.mf" if "endpoint_url=http://x" == options \
            else seaweed.url("mf2_crc.mf")
        result = run("mount.ctdsfs", source, tmp_path / "mnt", "-o", options)
        assert result.returncode == 1 and said in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_commands_accept_urls(seaweed, web, objects, tmp_path, scheme):
    server = seaweed if scheme == "s3" else web
    env = {"AWS_ENDPOINT_URL": seaweed.endpoint}  # the CLI takes the AWS configuration
    info = run("ctdsfs", "info", server.url("casacore_test_v1.mf"), env=env)
    assert info.returncode == 0 and "MultiFile version 1" in info.stdout, info.stderr
    check = run("ctdsfs", "check", server.url("mf2_crc.mf"), env=env)
    assert check.returncode == 0 and "clean" in check.stdout, check.stderr
    listing = run("ctdsfs", "ls", server.url("mh5_basic.mfh5"), env=env)
    assert listing.stdout.split() == ["empty.bin", "data10000.bin", "hello.txt"]
    unpacked = tmp_path / "out"
    assert run("ctdsfs", "unpack", server.url("mf2_nested.mf"), unpacked, env=env).returncode == 0
    assert tree(unpacked) == snapshot(open_container(objects / "mf2_nested.mf"))
    for missing in ("nothing.mf", "mf2_nested.mf_hdrext"):
        result = run("ctdsfs", "info", server.url(missing), env=env)
        assert result.returncode == 1 and "no such object" in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.fuse
@pytest.mark.tools
def test_casacore_3_5_and_3_8_read_a_measurement_set_from_s3(seaweed, mount, tmp_path):
    table = make_casacore_table(tmp_path / "obs.ms", rows=60, multifile=False)
    values = dump_values(table)
    pack(str(table), str(tmp_path / "obs.mf"), block_size=65536, use_crc=True, quiet=True)
    seaweed.client.put_object(Bucket=BUCKET, Key="archive/obs.mf",
                              Body=(tmp_path / "obs.mf").read_bytes())
    m = mount(seaweed.url("archive/obs.mf"), [seaweed.options])
    assert dump_values(m.mountpoint) == values  # python-casacore 3.8
    assert dump_values(m.mountpoint, python="/usr/bin/python3") == values  # casacore 3.5
    taql = run("taql", f"select NAME from {m.mountpoint} where ANTENNA=7")
    assert taql.returncode == 0 and "antenna-7" in taql.stdout, taql.stderr


def replace_object(server, name, data, objects):
    """Put new content under ``name`` (nginx: a new mtime too, so a new ETag)."""
    if hasattr(server, "client"):
        server.client.put_object(Bucket=BUCKET, Key=name, Body=data)
    else:
        path = objects / name
        when = path.stat().st_mtime + 10 if path.exists() else time.time()
        path.write_bytes(data)
        os.utime(path, (when, when))


@pytest.mark.parametrize("scheme,served", [("s3", ""), ("http", ""), ("http", "no-etag/")])
def test_no_read_mixes_two_versions(seaweed, web, objects, scheme, served):
    """Pinned by the ETag, or by Last-Modified and size where the server sends no ETag
    (the two versions have the same size)."""
    server = seaweed if scheme == "s3" else web
    name = f"versions-{scheme}-{served.strip('/')}.bin"
    first, second = bytes(range(256)) * 64, bytes(reversed(range(256))) * 64
    replace_object(server, name, first, objects)
    options = RemoteOptions(endpoint_url=seaweed.endpoint, chunk_size=4096, readahead=1,
                            retries=0, revalidate=3600)
    store = RemoteStore(server.url(served + name), options)
    try:
        assert store.pread(0, 100) == first[:100]
        replace_object(server, name, second, objects)
        assert store.pread(10, 100) == first[10:110]  # cached: the version opened
        with pytest.raises(RemoteError, match="replaced on the server"):
            store.pread(8192, 8192)  # not cached: pinned to the old ETag, refused
        wait_until(store.replaced, 10, "the new version")  # asked at once after a stale read
        assert store.pread(0, len(second)) == second
    finally:
        store.close()


def test_reads_answered_from_memory_are_told_apart(seaweed):
    """A mount serves a read on its loop, without a thread's hop, only when every chunk
    it needs is in memory: not before its GET, not for a chunk never fetched, and never
    a CRC-checked one (that CPU work stays in threads)."""
    options = RemoteOptions(endpoint_url=seaweed.endpoint, chunk_size=4096, readahead=0)
    container = open_container(seaweed.url("two.mf"), remote=options)
    crc = open_container(seaweed.url("mf2_crc.mf"), remote=options)
    try:
        block = 3 * 4096  # in the middle of the 16 blocks of "second"
        assert not container.cached("second", block, 4096)
        assert container.read("second", block, 4096) == b"\2" * 4096
        assert container.cached("second", block, 4096)
        assert container.cached("second", block + 100, 200)
        assert not container.cached("second", block, 8192)  # the next block too: not fetched
        assert not container.cached("first", block, 4096)
        assert container.cached("second", 65536, 100)  # past the end: b"" at once
        name = crc.names()[0]
        assert crc.header.use_crc and crc.read(name, 0, 100)
        assert not crc.cached(name, 0, 100)
    finally:
        container.close()
        crc.close()


def test_reads_inside_a_chunk_are_views_of_it_not_copies(seaweed):
    """A mount hands the kernel a read-only view of the fetched chunk (a copy of each
    reply's piece cost a tenth of a cold read's time); parsers still get bytes."""
    options = RemoteOptions(endpoint_url=seaweed.endpoint, chunk_size=16384, readahead=0)
    container = open_container(seaweed.url("two.mf"), remote=options)
    try:
        container.read("second", 0, 4096)  # a jump: its own bytes; a read carrying on: chunks
        first = container.read("second", 4096, 4096)
        again = container.read("second", 4096 + 100, 200)
        assert isinstance(first, memoryview) and first.readonly and first == b"\2" * 4096
        assert first.obj is again.obj  # one chunk, viewed twice, never copied
        across = container.read("second", 8192, 20480)  # more than a chunk: joined once
        assert isinstance(across, bytes) and across == b"\2" * 20480
        assert type(container.store.pread(0, 100)) is bytes
    finally:
        container.close()


def test_opening_and_listing_a_large_container_fetches_only_its_header(seaweed, tmp_path,
                                                                      monkeypatch):
    """Opening a 64 MiB container and listing it (as a mount's ``ls`` does) costs the
    GET of its first chunk (the header), no readahead: many nodes opening one archive
    multiply every byte."""
    from ctdsfs.formats import open_from_store
    from ctdsfs.remote.store import open_remote
    from ctdsfs.vfs import ROOT_INO, ContainerFS

    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "large", "wb") as f:
        f.truncate(64 << 20)
    (tree / "tiny").write_bytes(b"t" * 10)
    pack(str(tree), str(tmp_path / "large.mf"), block_size=65536, quiet=True)
    seaweed.client.put_object(Bucket=BUCKET, Key="large.mf",
                              Body=(tmp_path / "large.mf").read_bytes())
    asked = []
    get = RemoteStore._get
    monkeypatch.setattr(RemoteStore, "_get", lambda self, start, end, version: (
        asked.append((start, end)), get(self, start, end, version))[1])
    options = RemoteOptions(endpoint_url=seaweed.endpoint)
    store = open_remote(seaweed.url("large.mf"), options)
    fs = ContainerFS(open_from_store(store), seaweed.url("large.mf"), source_stat=store.stat,
                     stat_reads=False)
    try:
        assert [name for name, _, _ in fs.readdir(fs.opendir(ROOT_INO))] == \
            [".", "..", "large", "tiny"]
        time.sleep(1)  # (readahead, if any, has begun)
        assert asked == [(0, options.chunk_size)]
    finally:
        fs.root.close()


@pytest.mark.fuse
@pytest.mark.parametrize("library", ["botocore", "obstore", "memory"])
def test_benchmark_floor_serves_the_object_byte_for_byte(seaweed, mount, library):
    """The benchmark's remote floor (scripts/pyfuse3_floor.py) is only a floor if it
    serves the object's own bytes: read whole, across its 8 MiB chunks, at the end."""
    data = os.urandom(9 << 20 | 12345)
    seaweed.client.put_object(Bucket=BUCKET, Key="floor.bin", Body=data)
    m = mount(None, command=lambda mountpoint: [
        sys.executable, str(FLOOR), "s3", library, seaweed.endpoint, BUCKET, "floor.bin",
        str(mountpoint)])
    path = m.mountpoint / "object"
    assert path.read_bytes() == data
    with open(path, "rb") as f:
        f.seek((8 << 20) - 100)
        assert f.read(300) == data[(8 << 20) - 100:(8 << 20) + 200]
        f.seek(len(data) - 10)
        assert f.read(100) == data[-10:] and f.read(100) == b""


def test_failing_server_gets_bounded_retries_then_one_line(web, tmp_path):
    store = RemoteStore(web.url("always-503"), RemoteOptions(retries=2))
    with pytest.raises(RemoteError, match=r"HEAD failed 3 times \(HTTP 503\)"):
        store.version()
    (tmp_path / "mnt").mkdir()
    result = run("mount.ctdsfs", web.url("always-503"), tmp_path / "mnt", "-o", "retries=1")
    assert result.returncode == 1 and "HEAD failed 2 times (HTTP 503)" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_server_without_etag_or_date_is_refused_in_one_line(web):
    info = run("ctdsfs", "info", web.url("no-version/two.mf"))
    assert info.returncode == 1 and "neither ETag nor Last-Modified" in info.stderr
    assert len(info.stderr.splitlines()) == 1, info.stderr


def test_server_ignoring_ranges_is_never_trusted(web, objects):
    """A whole object answered to a ranged GET is refused, and no more of it is read
    than the range asked for."""
    data = (objects / "two.mf").read_bytes()
    store = RemoteStore(web.url("no-ranges/two.mf"),
                        RemoteOptions(chunk_size=4096, readahead=1, retries=0))
    for offset in (8192, 0):
        with pytest.raises(RemoteError, match="instead of the range asked for"):
            store.pread(offset, 100)
    whole = RemoteStore(web.url("no-ranges/two.mf"), RemoteOptions(retries=0))
    assert whole.pread(0, len(data)) == data  # one chunk, the whole object: a 200 is right
    store.close()
    whole.close()


@pytest.mark.fuse
@pytest.mark.parametrize("first,second", [("mf2_nested.mf", "two.mf"),
                                          ("mh5_basic.mfh5", "two.mfh5"),
                                          ("m.pycauset", "m2.pycauset")])
def test_replaced_object_is_reloaded_by_the_mount(seaweed, objects, mount, first, second):
    name = f"replaced-{second}"
    seaweed.client.put_object(Bucket=BUCKET, Key=name, Body=(objects / first).read_bytes())
    m = mount(seaweed.url(name), [seaweed.options])
    old, new = (snapshot(open_container(objects / n)) for n in (first, second))
    assert tree(m.mountpoint) == old
    seaweed.client.put_object(Bucket=BUCKET, Key=name, Body=(objects / second).read_bytes())
    def reloaded():
        try:
            return tree(m.mountpoint) == new
        except OSError:  # a read between the replacement and the reload: EIO, never mixed
            return False
    wait_until(reloaded, 20, "reload")
    assert "replaced on the server" in m.log_text()


def read_tail(path):
    """The last 4 KiB of ``path`` in a child with a time limit (a hang fails the test)."""
    return run("tail", "-c", "4096", path, timeout=60)


def fault_check(m, during_fault, recover, inside=""):
    """One file read before the fault; the other fails with EIO during it, within the
    bound docs/remote.md promises a read(2) (BOUND) and at once when read again, with a
    log line, while the listing and the file read before are served; the mount stays up
    and serves it once the server is back. (The listing before the fault has the other's
    first bytes read, which tell whether it is a nested container: a readahead still in
    flight at the fault would not.)"""
    directory = m.mountpoint / inside
    assert (directory / "first").read_bytes() == b"\1" * 65536
    assert "second" in run("ls", "-l", directory).stdout
    during_fault()
    try:
        for bound in (BOUND, FAST):  # (the second time: the chunk failed a moment ago)
            began = time.monotonic()
            failed = read_tail(directory / "second")
            assert failed.returncode != 0 and "Input/output error" in failed.stderr
            assert time.monotonic() - began <= bound
        listing = run("ls", "-l", directory, timeout=60)
        assert listing.returncode == 0 and "second" in listing.stdout, m.log_text()
        assert run("cat", evicted(directory / "first")).stdout == "\1" * 65536
    finally:
        recover()
    time.sleep(FAILED_SECONDS)
    assert read_tail(directory / "second").stdout == "\2" * 4096
    assert any("second" in line and "failed 2 times" in line
               for line in m.log_text().splitlines())
    assert m.proc.poll() is None


@pytest.mark.fuse
def test_stopped_s3_server_costs_one_eio_and_the_mount_recovers(seaweed, mount):
    m = mount(seaweed.url("two.mf"), [seaweed.options, FAST_FAILURE])
    fault_check(m, lambda: os.kill(seaweed.proc.pid, signal.SIGSTOP),
                lambda: os.kill(seaweed.proc.pid, signal.SIGCONT))


@pytest.mark.fuse
def test_stopped_s3_server_under_a_prefix_costs_one_eio_and_the_mount_recovers(seaweed,
                                                                              mount):
    """The same through a prefix, whose listing is asked for again meanwhile."""
    m = mount(f"s3://{BUCKET}/", [seaweed.options, FAST_FAILURE])
    fault_check(m, lambda: os.kill(seaweed.proc.pid, signal.SIGSTOP),
                lambda: os.kill(seaweed.proc.pid, signal.SIGCONT), inside="two.mf")


@pytest.mark.fuse
def test_first_looks_under_a_stopped_s3_prefix_each_end_within_their_bound(seaweed, objects,
                                                                          mount):
    """While the server is stopped, a first look at a container object (its header GET)
    and one in another directory at a sub-prefix (its LIST), asked at once, each end in
    EIO within its own bound, and a stat of the mount answers at once (before, the LIST
    waited for the GET, and then for the server itself: twice the bound)."""
    for key in ("firstlook/two.mf", "firstlook/sub/inner/two.mf"):
        seaweed.client.put_object(Bucket=BUCKET, Key=key, Body=(objects / "two.mf").read_bytes())
    m = mount(f"s3://{BUCKET}/firstlook/", [seaweed.options, FAST_FAILURE])
    assert os.listdir(m.mountpoint / "sub") == ["inner"]
    os.kill(seaweed.proc.pid, signal.SIGSTOP)
    try:
        seen = concurrent_users(m.mountpoint, [("object", 0, "list", "two.mf"),
                                               ("inner", 0.3, "list", "sub/inner"),
                                               ("mount", 0.3, "stat", "")])
    finally:
        os.kill(seaweed.proc.pid, signal.SIGCONT)
    assert seen["object"][0] == seen["inner"][0] == "Input/output error", seen
    assert max(seen["object"][1], seen["inner"][1]) <= BOUND and seen["mount"][1] <= FAST, seen
    time.sleep(FAILED_SECONDS)
    assert sorted(os.listdir(m.mountpoint / "two.mf")) == ["first", "second"]
    assert os.listdir(m.mountpoint / "sub" / "inner") == ["two.mf"]


@pytest.mark.fuse
def test_stopped_https_server_costs_one_eio_and_the_mount_recovers(web, mount, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(web.certificate))
    m = mount(web.tls_url("two.mf"), [FAST_FAILURE])
    fault_check(m, lambda: os.kill(web.proc.pid, signal.SIGSTOP),
                lambda: os.kill(web.proc.pid, signal.SIGCONT))


@pytest.mark.fuse
def test_killed_http_server_costs_one_eio_and_the_mount_recovers(web, mount):
    m = mount(web.url("two.mf"), [FAST_FAILURE])
    fault_check(m, web.kill, web.start)


@pytest.fixture
def ctdsfs_protocol():
    """fsspec, which finds the ``ctdsfs`` protocol through the package's ``fsspec.specs``
    entry point (made by ``pip install -e .``, as scripts/setup.sh runs it)."""
    import importlib.metadata

    import fsspec

    points = importlib.metadata.entry_points(group="fsspec.specs")
    assert any(p.name == "ctdsfs" and p.value == "ctdsfs.fsspec:CtdsfsFileSystem"
               for p in points), "no fsspec.specs entry point: run pip install -e . again"
    return fsspec


def fsspec_tree(fs, path=""):
    out = {}
    for entry in fs.ls(path):
        if entry["type"] == "directory":
            out[entry["name"] + "/"] = b""
            out.update(fsspec_tree(fs, entry["name"]))
        else:
            out[entry["name"]] = fs.cat_file(entry["name"])
    return out


def _assert_the_multihdf5_object_opens(seaweed):
    """``mh5_basic.mfh5`` from SeaweedFS opens (its HDF5 check passes) and lists its files."""
    container = open_container(seaweed.url("mh5_basic.mfh5"),
                               remote=RemoteOptions(endpoint_url=seaweed.endpoint))
    try:
        assert container.names() == ["empty.bin", "data10000.bin", "hello.txt"]
    finally:
        container.close()


def test_a_multihdf5_check_reads_with_the_credentials_of_the_moment(seaweed, objects,
                                                                     monkeypatch):
    """The HDF5 check of a remote object runs with the caller's environment when it is
    asked for, not the one its server process started with (credentials a library user
    set, or mended, later)."""
    probe._server.forget()  # (a server of this process's own, started below)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    assert probe.probe(DATA / "mh5_basic.mfh5") == []  # (the server starts with these)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["AWS_ACCESS_KEY_ID"])
    _assert_the_multihdf5_object_opens(seaweed)


def test_a_multihdf5_check_answered_too_late_fails_as_the_server_did(seaweed, objects,
                                                                     monkeypatch):
    """A remote object's HDF5 check whose answer does not come within the request's time
    (its server process stopped here; on a loaded machine it may still be starting) is
    a read that failed (EIO at the next look tried again), not a damaged file: that
    showed the object as a plain file (ENOTDIR) for the rest of the mount."""
    probe._server.forget()  # (a server of this process's own, started below)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["AWS_ACCESS_KEY_ID"])
    assert probe.probe(DATA / "mh5_basic.mfh5") == []
    server = probe._server.process
    os.kill(server.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(RemoteError, match="not read whole within the request's"):
            open_container(seaweed.url("mh5_basic.mfh5"),
                           remote=RemoteOptions(endpoint_url=seaweed.endpoint, timeout=2,
                                                retries=1)).close()
        assert time.monotonic() - began < 15  # (the request's 4.x s, and the wait's 1 s)
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        probe._server.forget()
    _assert_the_multihdf5_object_opens(seaweed)


def test_fsspec_reads_containers_without_fuse(seaweed, web, objects, ctdsfs_protocol):
    fsspec = ctdsfs_protocol
    s3 = {"endpoint_url": seaweed.endpoint}
    expected = snapshot(open_container(objects / "mf2_nested.mf"))
    sources = [fsspec.filesystem("ctdsfs", fo=str(objects / "mf2_nested.mf")),
               fsspec.filesystem("ctdsfs", fo=seaweed.url("mf2_nested.mf"), target_options=s3),
               fsspec.filesystem("ctdsfs", fo=web.url("mf2_nested.mf")),
               fsspec.core.url_to_fs(f"ctdsfs::{seaweed.url('mf2_nested.mf')}", s3=s3)[0]]
    for fs in sources:
        assert fsspec_tree(fs) == expected
        assert fs.info("SUB")["type"] == "directory"
        assert fs.cat_file("SUB/x", 100, 150) == expected["SUB/x"][100:150]
        with fs.open("SUB/x") as f:
            f.seek(4000)
            assert f.read(2000) == expected["SUB/x"][4000:]
        with pytest.raises(OSError):
            fs.open("table.dat", "wb")
        with pytest.raises(FileNotFoundError):
            fs.info("SUB/missing")
    with fsspec.open(f"ctdsfs://SUB/y::{seaweed.url('mf2_nested.mf')}", s3=s3) as f:
        assert f.read() == expected["SUB/y"]
    with fsspec.open("ctdsfs://hello.txt", fo=seaweed.url("mh5_basic.mfh5"),
                     target_options=s3) as f:
        assert f.read() == snapshot(open_container(objects / "mh5_basic.mfh5"))["hello.txt"]
    memory = fsspec.filesystem("memory")  # any other fsspec source, through its ranged reads
    memory.pipe("/ctdsfs-test/crc.mf", (objects / "mf2_crc.mf").read_bytes())
    fs = fsspec.filesystem("ctdsfs", fo="memory://ctdsfs-test/crc.mf")
    assert fsspec_tree(fs) == snapshot(open_container(objects / "mf2_crc.mf"))


def test_fsspec_takes_s3fs_storage_options_with_credentials_in_process(
        seaweed, objects, ctdsfs_protocol, monkeypatch, tmp_path):
    """Code written for s3fs hands credentials over in-process; the AWS environment and
    config files hold none here. The filesystem still pickles."""
    import pickle

    fsspec = ctdsfs_protocol
    for name in (*CREDENTIALS, "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    url = seaweed.url("mf2_nested.mf")
    expected = snapshot(open_container(objects / "mf2_nested.mf"))
    credentials = {"key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                   "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    for refused in ({"endpoint_url": seaweed.endpoint},  # no credentials at all
                    {"endpoint_url": seaweed.endpoint, "anon": True}):
        with pytest.raises(OSError):
            fsspec.filesystem("ctdsfs", fo=url, target_options=refused, skip_instance_cache=True)
    with fsspec.open("ctdsfs://SUB/x", fo=url,
                     target_options={**credentials, "endpoint_url": seaweed.endpoint}) as f:
        assert f.read() == expected["SUB/x"]
    s3fs_style = {"client_kwargs": {"endpoint_url": seaweed.endpoint, "region_name": "us-east-1"},
                  "config_kwargs": {"connect_timeout": 5, "read_timeout": 5}, **credentials}
    fs = fsspec.filesystem("ctdsfs", fo=url, target_options=s3fs_style)
    assert fsspec_tree(fs) == expected
    assert fsspec_tree(pickle.loads(pickle.dumps(fs))) == expected
    with fsspec.open(f"ctdsfs://SUB/y::{url}",
                     s3={**credentials, "endpoint_url": seaweed.endpoint}) as f:
        assert f.read() == expected["SUB/y"]
    with pytest.raises(ValueError, match=r"use_ssl.*not understood"):
        fsspec.filesystem("ctdsfs", fo=url, target_options={**credentials, "use_ssl": False},
                          skip_instance_cache=True)


def test_fsspec_s3fs_options_in_every_form_pickled_to_another_process_never_shown(
        seaweed, objects, ctdsfs_protocol, monkeypatch, tmp_path, caplog):
    """The forms code written for s3fs uses (``target_protocol``; a chained URL's options
    scoped or not, where fsspec hands unscoped ones to the outer filesystem; the
    filesystem's own keywords, as pandas' ``storage_options``) all reach the S3 client,
    never dropped unread; a pickled filesystem reads in a process that has no
    credentials of its own; no secret shows in a repr, a str or a log line."""
    import logging
    import pickle

    fsspec = ctdsfs_protocol
    for name in (*CREDENTIALS, "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    caplog.set_level(logging.DEBUG)
    url = seaweed.url("mf2_nested.mf")
    expected = snapshot(open_container(objects / "mf2_nested.mf"))
    secret = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    options = {"key": CREDENTIALS["AWS_ACCESS_KEY_ID"], "secret": secret,
               "endpoint_url": seaweed.endpoint}
    fresh = {"skip_instance_cache": True}
    systems = [fsspec.filesystem("ctdsfs", fo=url, target_protocol="s3", target_options=options,
                                 **fresh),
               fsspec.filesystem("ctdsfs", fo=url.removeprefix("s3://"), target_protocol="s3",
                                 target_options=options, **fresh),
               fsspec.filesystem("ctdsfs", fo=url, **options, **fresh),
               fsspec.core.url_to_fs(f"ctdsfs::{url}", **options, **fresh)[0]]
    for fs in systems:
        assert fsspec_tree(fs) == expected
    for opened in (fsspec.open(f"ctdsfs://SUB/y::{url}", **options),
                   fsspec.open(f"ctdsfs://SUB/y::{url}", s3=options),
                   fsspec.open("ctdsfs://SUB/y", fo=url, target_options=options)):
        with opened as f:
            assert f.read() == expected["SUB/y"]
        assert secret not in repr(opened) + str(opened)
    with pytest.raises(ValueError, match="given twice"):
        fsspec.filesystem("ctdsfs", fo=url, target_options=options, key="other", **fresh)
    unpickle_and_read = ("import pickle, sys; fs = pickle.loads(sys.stdin.buffer.read()); "
                         "sys.stdout.buffer.write(pickle.dumps(fs.cat_file('SUB/x')))")
    child = subprocess.run(
        [sys.executable, "-c", unpickle_and_read],
        input=pickle.dumps(systems[2]), capture_output=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr.decode()[-2000:]
    assert pickle.loads(child.stdout) == expected["SUB/x"]
    for fs in systems:
        shown = repr(fs) + str(fs) + repr(fs.container) + repr(fs.container.store)
        assert "ctdsfs" in shown and secret not in shown
    assert caplog.records and not any(secret in r.getMessage() for r in caplog.records)


def test_cache_dir_survives_the_store_is_shared_and_bounded(seaweed, objects, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def options(directory, limit):  # (attempts of 1 s: a stopped server costs a read 3 s;
        # 3 of them: a loaded machine's server may take a second for one)
        return RemoteOptions(endpoint_url=seaweed.endpoint, chunk_size=4096, readahead=1,
                             timeout=1, retries=2, cache_dir=str(directory),
                             cache_dir_size=limit)
    cache = tmp_path / "chunks"
    data = (objects / "two.mf").read_bytes()  # 35 chunks of 4096 bytes
    url = seaweed.url("two.mf")
    stores = [RemoteStore(url, options(cache, 1 << 20)) for _ in range(2)]  # two mounts
    with ThreadPoolExecutor(2) as pool:  # reading at once, sharing the directory
        assert list(pool.map(lambda s: s.pread(0, len(data)), stores)) == [data, data]
    assert len(os.listdir(cache)) == -(-len(data) // 4096)
    damaged = next(cache.glob("*-3"))
    damaged.write_bytes(damaged.read_bytes()[:100])  # a chunk of the wrong length is a miss
    later = RemoteStore(url, options(cache, 1 << 20))  # a later mount: it asks for the version,
    later.version()
    os.kill(seaweed.proc.pid, signal.SIGSTOP)  # ... then reads chunks without the server
    try:
        assert later.pread(0, 3 * 4096) == data[:3 * 4096]
        with pytest.raises(RemoteError):
            later.pread(3 * 4096, 10)
    finally:
        os.kill(seaweed.proc.pid, signal.SIGCONT)
    time.sleep(FAILED_SECONDS)  # (a chunk that failed this recently fails again at once)
    assert later.pread(3 * 4096, 10) == data[3 * 4096:3 * 4096 + 10]
    bounded = RemoteStore(url, options(tmp_path / "small", 5 * 4096))
    assert bounded.pread(0, len(data)) == data
    held = [p.stat().st_size for p in (tmp_path / "small").iterdir()]
    assert held and sum(held) <= 5 * 4096
    for store in stores + [later, bounded]:
        store.close()


@pytest.mark.fuse
@pytest.mark.tools
def test_s3_prefix_is_a_directory_source_with_the_table_view(seaweed, objects, mount,
                                                               tmp_path):
    table = make_casacore_table(tmp_path / "obs.ms", rows=40, multifile=True)
    values = dump_values(table)
    for path in table.rglob("*"):
        if path.is_file():
            seaweed.client.put_object(Bucket=BUCKET, Key=f"prefix/{path.relative_to(tmp_path)}",
                                      Body=path.read_bytes())
    extra = {"prefix/nested.mf": (objects / "mf2_nested.mf").read_bytes(),
             "prefix/notes.txt": b"plain object\n"}
    for key, body in extra.items():
        seaweed.client.put_object(Bucket=BUCKET, Key=key, Body=body)
    m = mount(f"s3://{BUCKET}/prefix/", [seaweed.options])
    assert sorted(os.listdir(m.mountpoint)) == ["nested.mf", "notes.txt", "obs.ms"]
    assert (m.mountpoint / "notes.txt").read_bytes() == b"plain object\n"
    assert tree(m.mountpoint / "nested.mf") == snapshot(open_container(objects / "mf2_nested.mf"))
    assert "table.mf" not in os.listdir(m.mountpoint / "obs.ms")  # the view: separate files
    assert dump_values(m.mountpoint / "obs.ms") == values  # python-casacore 3.8
    assert dump_values(m.mountpoint / "obs.ms", python="/usr/bin/python3") == values  # 3.5


@pytest.mark.fuse
def test_aws_profile_and_anonymous_access(seaweed, objects, mount, tmp_path, monkeypatch):
    """Endpoint and credentials from a profile of the AWS config files; without any, one
    line says where credentials come from; ``anon`` signs nothing (this bucket is not
    public: 403)."""
    (tmp_path / "config").write_text(f"[profile archive]\nendpoint_url = {seaweed.endpoint}\n"
                                     "region = eu-west-1\n")
    (tmp_path / "credentials").write_text("[archive]\naws_access_key_id = ctdsfs\n"
                                          "aws_secret_access_key = ctdsfs-secret\n")
    for key in CREDENTIALS:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    expected = snapshot(open_container(objects / "mf2_crc.mf"))
    assert tree(mount(seaweed.url("mf2_crc.mf"), ["profile=archive"]).mountpoint) == expected
    (tmp_path / "mnt").mkdir()
    for options, said in ((seaweed.options, "AWS_ACCESS_KEY_ID"),
                          (f"{seaweed.options},anon", "403")):
        refused = run("mount.ctdsfs", seaweed.url("mf2_crc.mf"), tmp_path / "mnt", "-o",
                      options, env={"AWS_CONFIG_FILE": os.devnull,
                                    "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr


@pytest.mark.fuse
def test_s3_prefix_follows_new_removed_and_replaced_objects(seaweed, objects, mount, tmp_path):
    """A prefix is listed again every ``revalidate`` seconds in the background: new objects
    appear, removed ones go, a replaced one shows its new size and content (never bytes of
    both versions: a read gives one version whole, or EIO), a replaced container object is
    reopened, a sub-prefix a table was put into becomes the table view, and ``ls`` answers
    while the server is stopped."""
    def put(key, body):
        seaweed.client.put_object(Bucket=BUCKET, Key=f"live/{key}", Body=body)
    old, new = b"o" * 10000, b"N" * 13000  # 3 and 4 chunks of 4096 bytes
    put("plain.bin", old)
    put("box.mf", (objects / "mf2_nested.mf").read_bytes())
    put("sub/first.txt", b"first\n")
    put("tab/readme.txt", b"a table comes\n")
    m = mount(f"s3://{BUCKET}/live/", [seaweed.options, "revalidate=0.2,chunk_size=4096"])
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["box.mf", "plain.bin", "sub", "tab"]
    assert os.listdir(root / "tab") == ["readme.txt"]
    assert os.listdir(root / "sub") == ["first.txt"]
    assert (root / "plain.bin").read_bytes() == old
    assert tree(root / "box.mf") == snapshot(open_container(objects / "mf2_nested.mf"))
    put("plain.bin", new)
    put("added.txt", b"added\n")
    put("sub/second.txt", b"second\n")
    put("box.mf", (objects / "two.mf").read_bytes())
    seaweed.client.delete_object(Bucket=BUCKET, Key="live/sub/first.txt")
    table = make_casacore_table(tmp_path / "tab", rows=10, multifile=True)
    for path in table.rglob("*"):
        if path.is_file():
            put(f"tab/{path.relative_to(table)}", path.read_bytes())

    def plain_is_new():
        try:
            data = (root / "plain.bin").read_bytes()
        except OSError as exc:  # a read between the replacement and the re-list: EIO
            assert exc.errno == errno.EIO
            return False
        assert len(set(data)) == 1  # never bytes of both versions (the kernel may keep
        # the old size for its attribute timeout: a cut read is no mix)
        return data == new and os.stat(root / "plain.bin").st_size == len(new)
    wait_until(plain_is_new, 20, "the replaced object")
    wait_until(lambda: sorted(os.listdir(root)) == ["added.txt", "box.mf", "plain.bin", "sub",
                                                    "tab"], 20, "the new object")
    assert (root / "added.txt").read_bytes() == b"added\n"
    wait_until(lambda: os.listdir(root / "sub") == ["second.txt"], 20, "the changed prefix")
    wait_until(lambda: sorted(os.listdir(root / "box.mf")) == ["first", "second"], 20,
               "the replaced container")
    assert tree(root / "box.mf") == snapshot(open_container(objects / "two.mf"))
    wait_until(lambda: "table.f0" in os.listdir(root / "tab"), 20, "the table view")
    assert "table.mf" not in os.listdir(root / "tab")
    assert dump_values(root / "tab") == dump_values(table)
    os.kill(seaweed.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(2):  # re-lists are due, the server does not answer: ls does not wait
            listing = run("ls", root, root / "sub", timeout=30)
            assert listing.returncode == 0 and "added.txt" in listing.stdout
    finally:
        os.kill(seaweed.proc.pid, signal.SIGCONT)
    assert (root / "sub" / "second.txt").read_bytes() == b"second\n"


@pytest.mark.fuse
def test_s3_prefix_mounted_root_becomes_the_table_view_and_back(seaweed, mount, tmp_path):
    """The mounted prefix itself follows its kind as a sub-prefix does: a table put into
    it while mounted shows as the table view, and a plain prefix again once the table's
    objects are gone."""
    def put(key, body):
        seaweed.client.put_object(Bucket=BUCKET, Key=f"grows/{key}", Body=body)
    put("readme.txt", b"a table comes\n")
    m = mount(f"s3://{BUCKET}/grows/", [seaweed.options, "revalidate=0.2"])
    root = m.mountpoint
    assert os.listdir(root) == ["readme.txt"]
    table = make_casacore_table(tmp_path / "tab", rows=10, multifile=True)
    keys = [str(path.relative_to(table)) for path in table.rglob("*") if path.is_file()]
    for key in keys:
        put(key, (table / key).read_bytes())
    wait_until(lambda: "table.f0" in os.listdir(root), 20, "the table view of the root")
    assert "table.mf" not in os.listdir(root)
    assert (root / "readme.txt").read_bytes() == b"a table comes\n"
    assert dump_values(root) == dump_values(table)
    for key in keys:
        seaweed.client.delete_object(Bucket=BUCKET, Key=f"grows/{key}")
    # (SeaweedFS keeps the emptied sub-prefix ANTENNA/ as a directory)
    wait_until(lambda: set(os.listdir(root)) - {"ANTENNA"} == {"readme.txt"}, 20,
               "the plain prefix again")


def test_fsspec_walks_a_path_once(objects, ctdsfs_protocol, monkeypatch):
    """``cat_file`` finds its file once (not once for the size and again to read it), and
    an open file keeps what it found: its reads walk no path."""
    fs = ctdsfs_protocol.filesystem("ctdsfs", fo=str(objects / "mf2_nested.mf"),
                                    skip_instance_cache=True)
    expected = snapshot(open_container(objects / "mf2_nested.mf"))["SUB/x"]
    looked_up, contains = [], fs.container.contains
    monkeypatch.setattr(fs.container, "contains",
                        lambda name: looked_up.append(name) or contains(name))
    assert fs.cat_file("SUB/x", 100, 150) == expected[100:150]
    assert looked_up == ["SUB"]
    looked_up.clear()
    with fs.open("SUB/x", block_size=1000, cache_type="none") as f:
        assert [f.read(1500) for _ in range(3)] == [expected[i:i + 1500] for i in (0, 1500, 3000)]
    assert looked_up == ["SUB"]
