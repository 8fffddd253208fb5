"""The image in docker/, built and run with podman the way clusters deploy ctdsfs.

No image registry is reachable here, so the Debian base is made with debootstrap
from the mirror apt already uses and imported into a podman store that lives in
the test's temporary directory (with runc and cgroupfs, which work on this kind
of machine where crun does not). The image builds with the host network and the
host CA bundle as a build secret; containers run with no network. The mount is
shown to the host through an rshared bind mount and read there, byte for byte
against ``ctdsfs unpack`` of the same container. If the engine cannot build or
start, the test fails with the reason: it never skips.
"""

import datetime
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from .conftest import BUILD_STATUS, Mount, is_mounted, make_casacore_table, pattern, unmount
from .test_mount import tree

pytestmark = pytest.mark.container

REPO = Path(__file__).parent.parent
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_IMAGE = "localhost/debian:bookworm"
IMAGE = "localhost/ctdsfs:test"
# podman's default limits exceed what these machines permit.
RUN_LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
# The build runs beside the other tests' mounts, and a mount namespace made while one of them
# is mounted (podman's, each RUN step's) keeps a copy of it: its daemon then serves on after
# its unmount, until that namespace ends (a teardown waited for a build step). So the build
# runs in a private namespace of its own with the FUSE mounts of that moment taken out.
APART_FROM_THE_MOUNTS = [
    "unshare", "--mount", "--propagation", "private", "sh", "-c",
    "awk '$3 ~ /^fuse/ {print $2}' /proc/self/mounts | while read -r m; do umount -l \"$m\"; "
    "done; exec \"$@\"", "sh"]
# Paths podman writes outside --root/--runroot; removed afterwards if the test made them.
PODMAN_SYSTEM_DIRS = [Path("/var/lib/containers"), Path("/run/containers")]
# The files the official debian:*-slim images leave out (debuerreotype's slimify),
# so the measured image size is the one users get.
SLIM_DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
"""


def run(cmd, timeout=600, **kwargs):
    """Run a command; a failure fails the test with the command and its output."""
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                              timeout=timeout, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"{' '.join(map(str, cmd))}: {e}")
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n"
                    f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def apt_debian_mirror():
    """The Debian mirror apt uses for bookworm (deb822 .sources or one-line .list)."""
    sources = Path("/etc/apt/sources.list.d")
    files = [Path("/etc/apt/sources.list"), *sorted(sources.glob("*.list")),
             *sorted(sources.glob("*.sources"))]
    for path in filter(Path.is_file, files):
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields = dict(line.split(":", 1) for line in stanza.splitlines()
                              if ":" in line and not line.startswith(("#", " ")))
                if ("bookworm" in fields.get("Suites", "").split()
                        and "deb" in fields.get("Types", "").split()):
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                words = [w for w in line.split() if not w.startswith("[")]
                if len(words) >= 3 and words[0] == "deb" and words[2] == "bookworm":
                    return words[1]
    pytest.fail("no Debian bookworm mirror in the apt sources of this machine")


# the user's cache, as the tests found it (conftest gives the mounts one of their own)
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def debian_rootfs_tarball():
    """A slim bookworm minbase rootfs as a tarball, cached for the day (debootstrap ~30 s)."""
    cache = USER_CACHE / "ctdsfs-tests"
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"debian-bookworm-minbase-{datetime.date.today():%Y%m%d}.tar"
    if tarball.exists():
        return tarball
    for old in cache.glob("debian-bookworm-minbase-*.tar"):
        old.unlink()
    rootfs = Path(tempfile.mkdtemp(dir=cache, prefix=f"{tarball.stem}-"))
    partial = rootfs.with_suffix(".partial")
    try:
        run(["debootstrap", "--variant=minbase", "bookworm", rootfs, apt_debian_mirror()])
        for junk in ("var/cache/apt", "var/lib/apt/lists", "usr/share/man", "usr/share/locale",
                     "usr/share/info"):
            shutil.rmtree(rootfs / junk)
            (rootfs / junk).mkdir()
        (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(SLIM_DPKG_EXCLUDES)
        run(["tar", "-C", rootfs, "-cf", partial, "."])
        partial.rename(tarball)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
        partial.unlink(missing_ok=True)
    return tarball


def hosts_pyfuse3_wheel(directory):
    """Into ``directory``, the pyfuse3 this host runs as a wheel (pip's cache keeps the one
    the set-up compiled), where this host is what the image's build stage is: Debian 12
    with CPython 3.11, whose glibc and libfuse3 the wheel links against. The build installs
    it with no compiler (docker/Dockerfile's ``wheels`` context) instead of compiling
    pyfuse3 again, most of the build's CPU time; elsewhere it compiles."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11) or \
            platform.freedesktop_os_release().get("VERSION_CODENAME") != "bookworm":
        return
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-q", f"pyfuse3=={importlib.metadata.version('pyfuse3')}", "-w", directory],
        env=dict(os.environ, XDG_CACHE_HOME=str(USER_CACHE)))  # (pip's cache is there)


class Podman:
    """podman with its whole store under one temporary directory."""

    def __init__(self, root):
        self.root = Path(root)
        for sub in ("store", "run", "tmp", "networks"):
            (self.root / sub).mkdir(exist_ok=True)  # (a worker's view of the controller's)
        self.env = dict(os.environ, TMPDIR=str(self.root / "tmp"))
        self.base = ["podman", "--root", self.root / "store", "--runroot", self.root / "run",
                     "--tmpdir", self.root / "tmp", "--network-config-dir",
                     self.root / "networks", "--runtime", "runc",
                     "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        self.containers = []

    def __call__(self, *args, apart=False, **kwargs):
        """``apart``: away from the tests' mounts (see APART_FROM_THE_MOUNTS)."""
        return run([*(APART_FROM_THE_MOUNTS if apart else []), *self.base, *args],
                   env=self.env, **kwargs)

    def start(self, name, source_dir, source_mode, share, args):
        """``podman run -d`` of the image; SOURCE_DIR at /data, SHARE (rshared) at /share."""
        self.containers.append(name)
        self("run", "-d", "--name", name, "--network", "none", *RUN_LIMITS,
             "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
             "--security-opt", "apparmor=unconfined",
             "-v", f"{source_dir}:/data:{source_mode}",
             "--mount", f"type=bind,src={share},dst=/share,bind-propagation=rshared",
             IMAGE, *args)

    def state(self, name):
        status, code = self("inspect", name, "--format",
                            "{{.State.Status}} {{.State.ExitCode}}").split()
        return status, int(code)

    def logs(self, name):
        """The container's output (the daemon logs to stderr)."""
        return subprocess.run([*self.base, "logs", name], env=self.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout

    def wait_for_mount(self, name, mountpoint):
        deadline = time.monotonic() + 60
        while not is_mounted(mountpoint):
            status, _ = self.state(name)
            if status != "running" or time.monotonic() > deadline:
                pytest.fail(f"no mount at {mountpoint} (container {status}):\n"
                            f"{self.logs(name)}")
            time.sleep(0.05)

    def stop(self, name):
        """``podman stop`` (SIGTERM, SIGKILL only after 30 s): exit status and log."""
        self("stop", "-t", "30", name)
        return self.state(name)[1], self.logs(name)

    def remove_everything(self):
        for name in self.containers:
            subprocess.run([*self.base, "rm", "-f", "-t", "0", name], env=self.env,
                           capture_output=True)
        subprocess.run([*self.base, "system", "reset", "-f"], env=self.env,
                       capture_output=True)
        with open("/proc/self/mounts") as f:
            leftovers = [line.split()[1] for line in f
                         if line.split()[1].startswith(f"{self.root.resolve()}/")]
        for path in sorted(leftovers, reverse=True):
            subprocess.run(["umount", "-l", path], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


class ImageBuild:
    """The image built in a thread from the start of the session (``start_image_build``,
    called by conftest when this module's tests are collected): the build (two apt
    stages, pip, a compile) takes minutes, mostly waiting on downloads, and overlaps the
    other tests instead of adding to them. Under pytest-xdist the controller builds
    (it lives as long as the session) and says in ``status`` how it went, for the worker
    that runs this module (:class:`BuiltByController`)."""

    def __init__(self, status=None):
        self.engine = self.error = None
        self.status = status
        self._preexisting = {d for d in PODMAN_SYSTEM_DIRS if d.exists()}
        self._thread = threading.Thread(target=self._build, name="ctdsfs-image-build",
                                        daemon=True)
        self._thread.start()

    def _build(self):
        try:
            for tool in ("podman", "runc", "debootstrap"):
                if shutil.which(tool) is None:
                    pytest.fail(f"{tool} is not installed (scripts/setup.sh installs it)")
            self.engine = Podman(tempfile.mkdtemp(prefix="ctdsfs-podman-"))
            with open(debian_rootfs_tarball(), "rb") as rootfs:
                self.engine("import", "-q", "-", BASE_IMAGE, stdin=rootfs)
            wheels = self.engine.root / "wheels"
            wheels.mkdir()
            hosts_pyfuse3_wheel(wheels)
            # (--layers=false: no image of each step, which only a rebuild would reuse)
            self.engine("build", "-q", "--layers=false", "--network", "host", "--secret",
                        f"id=ca,src={CA_BUNDLE}", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                        "--build-context", f"wheels={wheels}", "-f",
                        REPO / "docker/Dockerfile", "-t", IMAGE, REPO, timeout=1200,
                        apart=True)
        except BaseException as exc:  # (pytest.fail's Failed too) raised again in the test
            self.error = exc
        if self.status is not None:
            said = f"failed\n{self.error}" if self.error else f"built\n{self.engine.root}"
            Path(f"{self.status}.partial").write_text(said)
            os.rename(f"{self.status}.partial", self.status)

    def result(self):
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.engine

    def remove(self):
        """Everything the build made, once (the module's end, or the session's)."""
        self._thread.join()
        if self.engine is not None:
            self.engine.remove_everything()
            self.engine = None
        for made in set(PODMAN_SYSTEM_DIRS) - self._preexisting:
            shutil.rmtree(made, ignore_errors=True)


class BuiltByController:
    """A pytest-xdist worker's side of the controller's :class:`ImageBuild`: waits for its
    ``status`` file; the containers this worker started are removed at the module's end,
    the store with the image by the controller at the session's."""

    def __init__(self, status):
        self.status = Path(status)
        self.engine = None

    def result(self):
        deadline = time.monotonic() + 1800
        while not self.status.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"the image build said nothing in {self.status} in 30 minutes")
            time.sleep(0.5)
        outcome, said = self.status.read_text().split("\n", 1)
        if outcome != "built":
            pytest.fail(f"the image build failed: {said}")
        self.engine = Podman(said)
        return self.engine

    def remove(self):
        if self.engine is not None:
            for name in self.engine.containers:
                subprocess.run([*self.engine.base, "rm", "-f", "-t", "0", name],
                               env=self.engine.env, capture_output=True)
            self.engine = None


_BUILDS = []


def start_image_build(controller=False):
    """The build, started once: by the controller of an xdist run (``controller``), or in
    this process; an xdist worker only waits for the controller's."""
    if not _BUILDS:
        status = os.environ.get(BUILD_STATUS)
        if status and not controller:
            _BUILDS.append(BuiltByController(status))
        else:
            _BUILDS.append(ImageBuild(status))


def remove_image_build():
    """At the session's end: a build whose tests never ran (``-x``) is cleared too."""
    while _BUILDS:
        _BUILDS.pop().remove()


@pytest.fixture(scope="module")
def podman():
    """The ctdsfs image built from docker/Dockerfile on a debootstrapped base."""
    start_image_build()  # (already started, unless this module was not collected first)
    try:
        engine = _BUILDS[0].result()
        size = int(engine("image", "inspect", IMAGE, "--format", "{{.Size}}"))
        print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB", file=sys.stderr)
        yield engine
    finally:
        remove_image_build()


@pytest.fixture
def share(tmp_path):
    """A directory made a shared mount, so mounts inside containers propagate to it."""
    share = tmp_path / "share"
    share.mkdir()
    run(["mount", "--bind", share, share])
    run(["mount", "--make-shared", share])
    yield share
    with open("/proc/self/mounts") as f:
        below = [line.split()[1] for line in f if line.split()[1].startswith(f"{share}/")]
    for path in below:
        unmount(path)
    for args in (["umount"], ["umount", "-l"]):
        if is_mounted(share):
            subprocess.run(args + [str(share)], capture_output=True)


def test_secret_ca_bundle_is_not_in_the_image(podman):
    """The CA bundle passed as a build secret is in no file of the image."""
    merged = Path(podman("image", "mount", IMAGE).strip())
    try:
        bundle = CA_BUNDLE.read_bytes()
        leaked = [p for p in merged.rglob("*") if p.is_file() and not p.is_symlink()
                  and p.stat().st_size == len(bundle) and p.read_bytes() == bundle]
        assert leaked == []
        assert (merged / "opt/ctdsfs/bin/mount.ctdsfs").exists()
        assert not list(merged.glob("usr/bin/gcc*"))
    finally:
        podman("image", "unmount", IMAGE)


def test_read_only_mount_seen_by_the_host(podman, share, tmp_path):
    """docs/container-image.md's read-only line on a python-casacore table with a subtable:
    the host reads every file, byte for byte as ctdsfs shows it without the image."""
    table = make_casacore_table(tmp_path / "src/sample.ms")
    (share / "ro").mkdir()
    podman.start("ctdsfs-ro", table, "ro", share, ["/data", "/share/ro", "-o", "allow_other"])
    podman.wait_for_mount("ctdsfs-ro", share / "ro")
    seen = tree(share / "ro")

    (tmp_path / "direct").mkdir()
    direct = Mount(table, tmp_path / "direct", ["allow_other"])
    try:
        assert seen == tree(direct.mountpoint)
    finally:
        direct.close()
    for subtable in ("", "ANTENNA"):
        unpacked = tmp_path / "unpacked" / subtable
        run(["ctdsfs", "unpack", "--quiet", table / subtable / "table.mf", unpacked])
        inside = tree(unpacked)
        assert len(inside) >= 2
        assert {name: seen[os.path.join(subtable, name)] for name in inside} == inside

    code, log = podman.stop("ctdsfs-ro")
    assert code == 0, log
    assert "SIGTERM received" in log
    assert not is_mounted(share / "ro")


def test_read_write_mount_then_stop_leaves_a_clean_container(podman, share, tmp_path):
    """Writes through the host-visible mount are in the container after ``podman stop``."""
    table = make_casacore_table(tmp_path / "src/sample.ms")
    before = tmp_path / "before"
    run(["ctdsfs", "unpack", "--quiet", table / "table.mf", before])
    (share / "rw").mkdir()
    podman.start("ctdsfs-rw", table, "rw", share, ["/data/table.mf", "/share/rw", "-o", "rw"])
    podman.wait_for_mount("ctdsfs-rw", share / "rw")

    written = pattern(300_000, 7, 3)
    (share / "rw/added.bin").write_bytes(written)
    code, log = podman.stop("ctdsfs-rw")
    assert code == 0, log
    assert not is_mounted(share / "rw")

    run(["ctdsfs", "check", "--quiet", table / "table.mf"])
    after = tmp_path / "after"
    run(["ctdsfs", "unpack", "--quiet", table / "table.mf", after])
    assert tree(after) == {**tree(before), "added.bin": written}
