"""Shared fixtures: test data, real-tool generators and real FUSE mounts.

Mounts run ``mount.ctdsfs -f`` as a child process (so the test owns its PID)
and are always unmounted in a finalizer: ``fusermount3 -u``, then ``-uz``,
then the child is ended by PID if it is still there.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ctdsfs.toolbox import pack

from .servers import CREDENTIALS, Nginx, Seaweed, stop

DATA = Path(__file__).parent / "data"
SCRIPTS = Path(__file__).parent.parent / "scripts"
# Under pytest-xdist: where the controller's image build says how it went (set before the
# workers start, so they inherit it; see test_container_image).
BUILD_STATUS = "CTDSFS_TEST_IMAGE_BUILD_STATUS"


@pytest.fixture(autouse=True, scope="session")
def _session_cache_home(tmp_path_factory):
    """Mounts keep their index of a MultiFile's plain files under ``XDG_CACHE_HOME``:
    the session gets a cache of its own, so no test meets an index an earlier run left
    and none is left in the user's cache."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))


@pytest.fixture
def data_dir():
    return DATA


def pattern(size, mul, add, mod=256):
    """The content formulas of the casacore-written fixtures (see tests/data/README.md)."""
    return bytes((i * mul + add) % mod for i in range(size))


def evicted(path):
    """``path`` with its pages dropped from the page cache (written back first)."""
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return path


def make_casacore_table(path, *, block_size=None, rows=50, multifile=True):
    """python-casacore writes the sample table; MultiFile storage unless ``multifile`` is False."""
    home = Path(path).parent / f".home-{Path(path).name}"
    home.mkdir(parents=True, exist_ok=True)
    lines = []
    if multifile:
        lines.append("table.storage.option: multifile")
        if block_size:
            lines.append(f"table.storage.blocksize: {block_size}")
    (home / ".casarc").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, HOME=str(home))
    subprocess.run([sys.executable, str(SCRIPTS / "make_sample_table.py"), str(path), str(rows)],
                   check=True, env=env, cwd=Path(path).parent)
    return Path(path)


def run_tomf(inputs, out, block_size):
    """Debian casacore 3.5 ``tomf``: a version-1 MultiFile of ``inputs``."""
    subprocess.run(["tomf", "-b", str(block_size), *map(str, inputs), str(out)], check=True,
                   stdout=subprocess.DEVNULL, cwd=Path(inputs[0]).parent)
    return Path(out)


def is_mounted(path):
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real for line in f)


def mounted_device(path):
    """``major:minor`` of the file system mounted at ``path`` (from this namespace's
    mountinfo: nothing asks the file system itself, which may hang), or None."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return next((line.split()[2] for line in f if line.split()[4] == real), None)


def _processes():
    """(pid, its command line) of every process that can be looked at."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        yield pid, command[:120]


def holders(path):
    """What keeps the mount at ``path`` busy: each process's files, memory maps, working
    or root directory under it (one line each)."""
    real = os.path.realpath(path)
    found = []
    for pid, command in _processes():
        uses = set()
        try:
            for link in ("cwd", "root", *(f"fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd"))):
                try:
                    target = os.readlink(f"/proc/{pid}/{link}")
                except OSError:
                    continue
                if target == real or target.startswith(real + "/"):
                    uses.add(f"{link} {target}")
            with open(f"/proc/{pid}/maps") as f:
                uses.update(f"map {line.split(maxsplit=5)[5].strip()}" for line in f
                            if f" {real}/" in line)
        except OSError:
            continue
        found += [f"pid {pid} ({command}): {use}" for use in sorted(uses)]
    return found


def namespaces_holding(device):
    """Processes in whose mount namespace the file system ``device`` (``major:minor``) is
    still mounted: a namespace made while it was mounted keeps a copy, and the daemon
    serves until that namespace ends."""
    found = {}
    for pid, command in _processes():
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            with open(f"/proc/{pid}/mountinfo") as f:
                if any(line.split()[2] == device for line in f):
                    found.setdefault(namespace, f"pid {pid} ({command})")
        except OSError:
            continue
    return sorted(found.values())


def unmount(path):
    """``fusermount3 -u``, then ``-uz`` if it is still mounted. Returns what kept it busy
    (``holders``, seen before the lazy unmount) if the plain unmount failed, else []."""
    busy = []
    for args in (["fusermount3", "-u"], ["fusermount3", "-uz"]):
        if not is_mounted(path):
            break
        done = subprocess.run(args + [str(path)], stderr=subprocess.PIPE, text=True)
        if done.returncode and not busy and is_mounted(path):
            busy = [done.stderr.strip(), *holders(path)]
    return busy


def require_fuse():
    """FUSE tests need /dev/fuse and fusermount3; without them they fail (never skip):
    scripts/setup.sh installs fuse3."""
    assert os.path.exists("/dev/fuse") and shutil.which("fusermount3"), \
        "FUSE is not available (/dev/fuse, fusermount3): run scripts/setup.sh"


class Mount:
    """A foreground ``mount.ctdsfs`` child process and its mount point (or another file
    system's: ``command`` serving at ``mountpoint`` in the foreground)."""

    def __init__(self, source, mountpoint, options=(), log=None, command=None):
        self.mountpoint = Path(mountpoint)
        self.log = Path(log) if log else self.mountpoint.with_suffix(".log")
        cmd = command or ["mount.ctdsfs", "-f", str(source), str(mountpoint)]
        if options:
            cmd += ["-o", ",".join(options)]
        self.logfile = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.logfile, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"mount.ctdsfs exited: {self.log.read_text()}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("mount did not appear within 30 s")
            time.sleep(0.02)

    def log_text(self):
        self.logfile.flush()
        return self.log.read_text()

    def kill_after(self, seconds):
        """SIGKILL the daemon ``seconds`` from now: a crash test's kill point."""
        self._killer = threading.Timer(seconds, self.proc.send_signal, [signal.SIGKILL])
        self._killer.start()

    def reap_killed(self):
        """After ``kill_after``: wait for the kill, then clear away the dead mount."""
        self._killer.join()
        self.proc.wait(timeout=20)
        unmount(self.mountpoint)
        self.logfile.close()

    def close(self):
        """Unmount, wait for the daemon to end, and return its exit status. A mount that
        was busy (a file, map or directory of a process still in it: a leak of the test)
        or a daemon still serving after its unmount fails the test, once all is undone."""
        device = mounted_device(self.mountpoint)
        problems = unmount(self.mountpoint)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lingering = namespaces_holding(device) if device else []
            problems.append("the daemon still served 20 s after the unmount; the mount is "
                            f"still in the mount namespaces of: {lingering or 'nothing'}")
            self.proc.kill()
            self.proc.wait()
        unmount(self.mountpoint)  # (a slow start may have mounted after the first try)
        self.logfile.close()
        if problems:
            raise AssertionError(f"{self.mountpoint} was not released at unmount: "
                                 + "; ".join(problems))
        return self.proc.returncode


@pytest.fixture
def mount(tmp_path):
    """``mount(source, options=()) -> Mount``; every mount is undone at teardown.
    ``command(mountpoint)`` gives another file system's foreground command instead."""
    require_fuse()
    mounts = []

    def make(source, options=(), name=None, command=None):
        mountpoint = tmp_path / (name or f"mnt{len(mounts)}")
        mountpoint.mkdir()
        m = Mount(source, mountpoint, options, command=command and command(mountpoint))
        mounts.append(m)
        return m

    yield make
    failures = []
    for m in mounts:
        try:
            m.close()
        except AssertionError as exc:  # (the other mounts are undone first)
            failures.append(str(exc))
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 8 MiB of its own, for full-disk tests (unmounted in the finalizer)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], check=True)
    yield disk
    for args in (["umount"], ["umount", "-l"]):
        if not is_mounted(disk):
            break
        subprocess.run(args + [str(disk)], stderr=subprocess.DEVNULL)

# ---------------------------------------------------------------- the session's servers
# Here, not in a test module, so that every file using them shares one of each per worker
# (a fixture imported into a module is that module's own: each would start its own
# SeaweedFS, about ten seconds each).
BUCKET = "ctdsfs-test"
FIXTURES = ["casacore_test_v1.mf", "casacore_test_v1.mf_hdrext", "mf2_nested.mf", "mf2_crc.mf",
            "mh5_basic.mfh5"]


@pytest.fixture(scope="session")
def objects(tmp_path_factory):
    """The files every server holds: casacore-written fixtures and a pycauset matrix."""
    import numpy as np
    import pycauset

    directory = tmp_path_factory.mktemp("objects")
    for name in FIXTURES:
        shutil.copy(DATA / name, directory / name)
    cwd = os.getcwd()
    os.chdir(directory)  # pycauset makes a scratch folder in the cwd
    try:
        pycauset.save(pycauset.matrix(np.arange(12.0).reshape(3, 4)), str(directory / "m.pycauset"))
        pycauset.save(pycauset.matrix(np.arange(6.0).reshape(2, 3)), str(directory / "m2.pycauset"))
    finally:
        os.chdir(cwd)
    shutil.rmtree(directory / ".pycauset", ignore_errors=True)
    tree = directory / "two"
    tree.mkdir()
    for name, fill in (("first", 1), ("second", 2)):
        (tree / name).write_bytes(bytes([fill]) * 65536)
    pack(str(tree), str(directory / "two.mf"), block_size=4096, quiet=True)
    pack(str(tree), str(directory / "two.mfh5"), format="hdf5", block_size=4096, quiet=True)
    return directory


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory, objects):
    """A SeaweedFS S3 endpoint on loopback holding ``objects`` in BUCKET."""
    server = Seaweed(tmp_path_factory.mktemp("seaweed"))  # (no weed: an error, never a skip)
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)  # for the mounts and commands the tests start
    try:
        client = server.make_bucket(BUCKET)
        for path in objects.iterdir():
            if path.is_file():
                client.put_object(Bucket=BUCKET, Key=path.name, Body=path.read_bytes())
        yield SimpleNamespace(endpoint=server.endpoint, client=client, proc=server.proc,
                              url=lambda name: f"s3://{BUCKET}/{name}",
                              options=f"endpoint_url={server.endpoint}")
    finally:
        server.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def web(tmp_path_factory, objects):
    assert shutil.which("nginx"), "nginx is not installed: run scripts/setup.sh"
    server = Nginx(objects, tmp_path_factory.mktemp("nginx"))
    yield server
    stop(server.proc)


def run_on_terminal(cmd, columns=100):
    """Run ``cmd`` with a pseudo-terminal (of ``columns``) as its stdin, stdout and stderr;
    returns (exit status, everything it printed)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode("utf-8", "replace")


def pytest_configure(config):
    """SIGTERM (a CI time limit, ``timeout``) ends the run as Ctrl-C does: finalizers run,
    so the servers and mounts tests started are stopped, not left behind. The controller
    of a pytest-xdist run names where its image build will say how it went (the workers
    it starts next inherit the name)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        status = Path(tempfile.mkdtemp(prefix="ctdsfs-image-build-")) / "status"
        os.environ[BUILD_STATUS] = str(status)


def _runs_container_tests(ids):
    return any(i.startswith("tests/test_container_image.py") for i in ids)


def pytest_collection_modifyitems(session, config, items):
    """The container image's build starts now, beside the other tests, if its tests run
    (under pytest-xdist the controller starts it: see below)."""
    if not hasattr(config, "workerinput") and \
            _runs_container_tests([item.nodeid for item in items]):
        from .test_container_image import start_image_build
        start_image_build()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """pytest-xdist's controller: the first worker has collected; the build starts here."""
    if _runs_container_tests(ids):
        from .test_container_image import start_image_build
        start_image_build(controller=True)


def pytest_sessionfinish(session, exitstatus):
    if "tests.test_container_image" in sys.modules:
        sys.modules["tests.test_container_image"].remove_image_build()
    status = os.environ.get(BUILD_STATUS)
    if status and not hasattr(session.config, "workerinput"):
        shutil.rmtree(Path(status).parent, ignore_errors=True)
