"""``mount.ctdsfs``: option handling, pre-flight checks and daemonizing.

Follows mount(8) helper conventions: ``SOURCE MOUNTPOINT [-o opts] [-n] [-s]
[-v] [-t fuse.ctdsfs]``; options mount(8) itself consumes (``noauto``,
``user``, ``_netdev``, ``x-*``, ...) are accepted and ignored. Without ``-f``
the process forks and the parent exits only once the mount is live (status 0)
or has failed (status 1, one-line message), so scripts and fstab can rely on
the mount being there when the command returns.
"""

import functools
import gc
import logging
import os
import re
import sys
from dataclasses import dataclass, field

from .errors import CtdsfsError, PrintableFormatter, printable
from .formats import REMOTE_SCHEMES, directory_format
from .formats.multifile import index as multifile_index
from .formats.multifile import shared_index as multifile_shared_index
from .sources.opener import DEFAULT_BLOCK_SIZE, OpenOptions, open_source

log = logging.getLogger("ctdsfs")

# Generic options libfuse understands; passed to the kernel mount as given.
KERNEL_OPTIONS = {
    "allow_other", "default_permissions", "auto_unmount", "nosuid", "suid", "nodev",
    "dev", "noexec", "exec", "noatime", "atime", "relatime", "norelatime", "strictatime",
    "nodiratime", "diratime", "sync", "async", "dirsync",
}
# Options that mount(8) and fstab use for themselves.
IGNORED_OPTIONS = {"defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group",
                   "nofail", "_netdev"}
DEFAULT_COMMIT_SECONDS = 5.0
IGNORED_PREFIXES = ("x-", "comment=")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt(3) parameters
# Allocations between two collections of the youngest generation (Python's default: 700).
GC_YOUNG_ALLOCATIONS = 50_000
# Options that cannot be given together (each pair says opposite things).
CONTRADICTIONS = [("ro", "rw"), ("ro", "create"), ("ro", "commit"),
                  ("default_permissions", "no_default_permissions"),
                  ("suid", "nosuid"), ("dev", "nodev"), ("exec", "noexec"), ("sync", "async"),
                  ("atime", "noatime"), ("noatime", "relatime"), ("noatime", "strictatime"),
                  ("relatime", "norelatime"), ("relatime", "strictatime"),
                  ("diratime", "nodiratime")]
# Options of a remote (s3://, http(s)://) SOURCE: RemoteOptions fields.
REMOTE_TEXT_OPTIONS = {"endpoint_url", "region", "profile", "cache_dir"}
CREDENTIAL_OPTIONS = {"key", "secret", "token", "access_key", "secret_key", "aws_access_key_id",
                      "aws_secret_access_key", "aws_session_token"}
# Worker processes of a read-only mount (-o workers=N): at most MAX_WORKERS; by default two
# per core (requests mostly wait for the disk), at most DEFAULT_WORKERS_MAX.
MAX_WORKERS = 64
DEFAULT_WORKERS_MAX = 8
# Options that mean nothing without another one.
REQUIRES = {"blocksize": "create", "crc": "create", "no_default_permissions": "allow_other"}


class UsageError(CtdsfsError):
    """Bad command line or mount options."""


@dataclass
class MountOptions:
    kernel: set = field(default_factory=set)
    writable: bool = False
    create: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE  # for a container made by ``create``
    new_crc: bool = False  # ditto: with per-block CRCs
    commit_seconds: float = DEFAULT_COMMIT_SECONDS
    verify_crc: bool = True
    recurse: bool = True  # directory sources: container files shown as directories
    columns: bool = False  # columns/ (casacore columns as NumPy) in every table
    index: bool = True  # keep and use the persistent index of plain files (multifile_index)
    logfile: str = None
    debug: bool = False
    nonempty: bool = False  # mount over a mount point that holds files
    remote: dict = field(default_factory=dict)  # RemoteOptions fields (s3:// or http(s)://)
    timestamp: tuple = None  # TileDB time travel: (start, end) in ms since the epoch
    workers: int = None  # processes serving a read-only mount (None: default_workers)


def _bytes(text):
    """A byte count, with an optional K, M or G (binary) suffix."""
    scale = 1 << 10 * ("KMG".index(text[-1].upper()) + 1) if text[-1:].upper() in ("K", "M", "G") \
        else 1
    return int(text[:-1] if scale > 1 else text) * scale


REMOTE_NUMBER_OPTIONS = {"cache_size": _bytes, "chunk_size": _bytes, "readahead": int,
                         "concurrency": int, "retries": int, "timeout": float,
                         "revalidate": float, "cache_dir_size": _bytes}


def _number(item, kind):
    value = item.split("=", 1)[1]
    try:
        number = kind(value)
    except ValueError:
        raise UsageError(f"mount option {item!r} needs a number") from None
    if number <= 0:
        raise UsageError(f"mount option {item!r} must be positive")
    return number


def _check_consistent(given):
    """Refuse options that contradict each other, or that would be silently ignored."""
    for first, second in CONTRADICTIONS:
        if first in given and second in given:
            raise UsageError(f"mount options {first!r} and {second!r} contradict each other")
    for name, needed in REQUIRES.items():
        if name in given and needed not in given:
            raise UsageError(f"mount option {name!r} means nothing without {needed!r}")


def parse_options(text):
    """Parse a comma-separated ``-o`` string (may be given several times, joined by commas).

    ``allow_other`` implies ``default_permissions`` (the kernel checks the modes and
    owners shown, those of SOURCE) unless ``no_default_permissions`` is given:
    without it every local user could write to a read-write mount.
    """
    opts = MountOptions()
    items = list(filter(None, (text or "").split(",")))
    _check_consistent({item.split("=", 1)[0] for item in items})
    for item in items:
        if item in KERNEL_OPTIONS:
            opts.kernel.add(item)
        elif item in IGNORED_OPTIONS or item.startswith(IGNORED_PREFIXES):
            continue
        elif item in ("ro", "rw"):
            opts.writable = item == "rw"
        elif item == "create":
            opts.create = opts.writable = True
        elif item.startswith("blocksize="):
            opts.block_size = _number(item, int)
        elif item == "crc":
            opts.new_crc = True
        elif item.startswith("commit="):
            opts.commit_seconds = _number(item, float)
        elif item == "nocrc":
            opts.verify_crc = False
        elif item == "norecurse":
            opts.recurse = False
        elif item == "columns":
            opts.columns = True
        elif item == "no_index":
            opts.index = False
        elif item == "debug":
            opts.debug = True
        elif item == "nonempty":
            opts.nonempty = True
        elif item == "no_default_permissions":
            continue  # only keeps allow_other from adding default_permissions
        elif item.split("=", 1)[0] == "timestamp":
            from .formats.tiledb.time import parse_timestamp  # (numpy: only when asked)

            opts.timestamp = parse_timestamp(item.partition("=")[2])
            if opts.timestamp is None:
                raise UsageError(f"mount option {item!r} needs T or T1:T2 (ms since the "
                                 "epoch, T1 <= T2)")
        elif item.startswith("workers="):
            opts.workers = _number(item, int)
            if opts.workers > MAX_WORKERS:
                raise UsageError(f"mount option {item!r}: at most {MAX_WORKERS} workers")
        elif item.startswith("logfile="):
            opts.logfile = item.split("=", 1)[1]
        elif item == "anon":
            opts.remote["anon"] = True
        elif item.split("=", 1)[0] in REMOTE_TEXT_OPTIONS and "=" in item:
            key, value = item.split("=", 1)
            opts.remote[key] = os.path.abspath(value) if key == "cache_dir" else value
        elif item.split("=", 1)[0] in REMOTE_NUMBER_OPTIONS and "=" in item:
            key = item.split("=", 1)[0]
            opts.remote[key] = _number(item, REMOTE_NUMBER_OPTIONS[key])
        elif item.split("=", 1)[0] in CREDENTIAL_OPTIONS:
            raise UsageError(f"mount option {item.split('=', 1)[0]!r}: credentials come only from "
                             "the AWS environment variables and config files, never from the "
                             "command line")
        else:
            raise UsageError(f"unknown mount option {item!r} (see mount.ctdsfs --help)")
    if "allow_other" in opts.kernel and "no_default_permissions" not in items:
        opts.kernel.add("default_permissions")
    return opts


def _unescape_mount_field(text):
    """A path as /proc/self/mounts spells it (space, tab, newline, backslash in octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _mounts():
    """``(mount point, file system type)`` of each mount in /proc/self/mounts (none if it
    cannot be read)."""
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:
            yield _unescape_mount_field(fields[1]), fields[2]


def _mounted_paths():
    return {point for point, _ in _mounts()}


# Filesystems whose reads come from this machine's own disks or memory: a read there may
# wait on the mount's loop while it is the only one (FuseOperations.lone_reads_on_loop).
# A network filesystem's read can stall for minutes (Lustre, NFS), and must not stop
# the mount answering everything else.
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs",
                     "tmpfs", "ramfs", "overlay", "squashfs", "iso9660", "vfat", "exfat"}


def _within(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def on_local_disk(path):
    """Whether ``path`` lies on a filesystem of LOCAL_FILESYSTEMS (the innermost mount
    holding it, from /proc/self/mounts), and so does everything mounted below it (a
    directory source may hold an NFS mount); False when that cannot be told."""
    path = os.path.realpath(path)
    best, fstype, below = "", None, set()
    for point, kind in _mounts():
        if _within(path, point) and len(point) >= len(best):
            best, fstype = point, kind
        elif _within(point, path):
            below.add(kind)
    return fstype in LOCAL_FILESYSTEMS and below <= LOCAL_FILESYSTEMS


def check_mountpoint(path, nonempty=False):
    if not os.path.exists(path):
        raise UsageError(f"{path}: mount point does not exist")
    if not os.path.isdir(path):
        raise UsageError(f"{path}: mount point is not a directory")
    real = os.path.realpath(path)
    if real in _mounted_paths() and real != "/":
        raise UsageError(f"{path}: mount point is already in use (something is mounted there)")
    try:
        entries = os.listdir(path)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    if entries and not nonempty:
        raise UsageError(f"{path}: mount point is not empty (-o nonempty mounts over its files)")


def _setup_logging(opts, foreground):
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if opts.debug else logging.INFO)
    fmt = PrintableFormatter("%(asctime)s ctdsfs[%(process)d] %(levelname)s: %(message)s")
    if opts.logfile:
        handler = logging.FileHandler(opts.logfile)
    elif foreground:
        handler = logging.StreamHandler(sys.stderr)
    elif os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler  # (sockets, pickle: only for syslog)

        handler = SysLogHandler("/dev/log")
        fmt = PrintableFormatter("ctdsfs[%(process)d]: %(levelname)s: %(message)s")
    else:
        handler = logging.NullHandler()
    handler.setFormatter(fmt)
    root.handlers[:] = [handler]


def _reuse_freed_memory():
    """Have glibc keep freed buffers for reuse instead of handing them back at once.

    Decoding a compressed format allocates and frees megabytes per tile; glibc maps
    such buffers anew and trims its heap each time, and faulting those pages in again
    (slow in a VM) nearly doubled what a tile costs to decode: 4.2 against 2.3 CPU
    seconds for a 1 GiB zstd TileDB attribute. Buffers up to 32 MiB now come from the
    heap, which keeps up to 64 MiB free.

    Worker threads share that one heap: with an arena of its own, each thread that
    served large reads kept about 2 MB of freed buffers resident for good (two threads
    held 4 MB for 7 KB in use after a small-files ``tar``; sharing takes 1.7 MB off the
    daemon's RSS). Their Python objects come from Python's own allocator under the
    GIL, so one arena makes them wait for nothing.

    Returns what gives the heap's free pages back (``malloc_trim``), or None.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: its defaults stand
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 64 << 20)
    mallopt(M_ARENA_MAX, 1)
    return functools.partial(malloc_trim, 0)


def _collect_garbage_seldom():
    """Keep the cyclic garbage collector from rescanning what the daemon keeps.

    A first listing allocates a few objects per entry (header entries, inodes,
    attributes) and keeps nearly all; nothing the daemon makes is cyclic garbage in
    bulk. At Python's default pace the collector walked those objects again every 700
    allocations, a large share of a cold ``find``. What exists once the container is open
    (modules, the root's entries) is frozen out of collections altogether.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, middle, old)


def default_workers(remote, decoded=False):
    """Worker processes of a read-only mount when ``workers`` is not given: two per core
    the process may run on, capped; one for a remote source (``mount`` says why), and one
    where the files shown are ``decoded`` views (``-o columns``, a TileDB array, a bcolz
    rootdir): the workers share what they decode, but their machinery made one reader
    slower with several, and parallel readers no faster (docs/benchmarks.md)."""
    if remote or decoded:
        return 1
    return min(2 * len(os.sched_getaffinity(0)), DEFAULT_WORKERS_MAX)


def _share_memory(workers):
    """Split the memory caches' bounds among ``workers`` processes, so that the mount's
    whole stays within them."""
    from .io import decoded_cache

    decoded_cache.share_among(workers)


def mount(source, mountpoint, opts, foreground=False):
    """Mount ``source`` on ``mountpoint``; returns the exit status for the caller."""
    # Imported here so `ctdsfs info` and `--help` work where libfuse is missing.
    from .fuse_adapter import FuseOperations, serve
    from .vfs import ContainerFS

    if opts.remote and not source.startswith(REMOTE_SCHEMES):
        raise UsageError(f"mount options {', '.join(sorted(opts.remote))} are for an s3:// or "
                         "http(s):// source only")
    remote = source.startswith(REMOTE_SCHEMES)
    if remote and (opts.workers or 1) > 1:
        raise UsageError("mount option 'workers' is for local sources: a remote one is served "
                         "by one process (each worker would fetch for itself, and what one "
                         "fetched would not stay served by the others while the server fails)")
    if opts.writable and (opts.workers or 1) > 1:
        raise UsageError("mount option 'workers' is for read-only mounts (a read-write mount's "
                         "commits need one process)")
    chunked = os.path.isdir(source) and not os.path.islink(source) and getattr(
        directory_format(source), "decoded", False)  # (a TileDB array, a bcolz rootdir)
    decoded = opts.columns or chunked
    workers = 1 if opts.writable else opts.workers or default_workers(remote, decoded)
    if workers > 1:
        _share_memory(workers)
        multifile_shared_index.enable()  # (before the source is opened: its files share)
    target = os.path.realpath(mountpoint)
    if os.path.isdir(source):
        real_source = os.path.realpath(source)
        if target == real_source or real_source.startswith(target + os.sep):
            raise UsageError(f"{source}: the source lies under the mount point {mountpoint}")
    check_mountpoint(mountpoint, nonempty=opts.nonempty)
    trim_heap = _reuse_freed_memory()
    _setup_logging(opts, foreground=True)  # problems found while opening reach the terminal
    if opts.index:
        multifile_index.enable()
    remote_options = None
    if opts.remote:
        from .remote.store import RemoteOptions

        remote_options = RemoteOptions(**opts.remote)
    opened = open_source(source, OpenOptions(
        writable=opts.writable, create=opts.create, block_size=opts.block_size,
        new_crc=opts.new_crc, verify_crc=opts.verify_crc, recurse=opts.recurse,
        columns=opts.columns, timestamp=opts.timestamp, remote=remote_options,
        hide=frozenset({target})))
    container, source, remote = opened.container, opened.name, opened.remote
    if opts.columns and not remote:
        container.warm_decoders()
    # a prefix's root is what is shown now (it may be reopened as a table view)
    source_stat = opened.stat or ((lambda: fs.root.stat()) if remote else None)
    write_cache = opts.writable and container.kernel_write_cache
    fs = ContainerFS(container, source, writable=opts.writable, kernel_appends=write_cache,
                     source_stat=source_stat, stat_reads=not remote)
    fuse_options = {"rw" if opts.writable else "ro", "subtype=ctdsfs",
                    "fsname=" + source.replace(",", "\\,")}
    fuse_options |= opts.kernel
    local = not remote and on_local_disk(source)
    operations = FuseOperations(
        fs, threaded_reads=not opts.writable and (container.checks_reads or remote),
        write_cache=write_cache, commit_interval=opts.commit_seconds if opts.writable else None,
        trim_heap=trim_heap, readahead_kb=container.readahead_kb,
        lone_reads_on_loop=local, reads_on_loop=local and bool(chunked))
    _collect_garbage_seldom()

    if workers > 1:
        from .fuse_workers import serve_workers

        serve = functools.partial(serve_workers, count=workers, decoded=bool(decoded))
    if foreground:
        serve(operations, mountpoint, fuse_options)
        return 0

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:  # parent: wait for the child's verdict
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            verdict = pipe.read().decode("utf-8", "replace")
        if verdict.startswith("ok"):
            return 0
        message = verdict.strip() or "mount daemon exited before the mount was live"
        print(f"mount.ctdsfs: {message}", file=sys.stderr)
        return 1

    os.close(read_end)
    os.setsid()
    _setup_logging(opts, foreground=False)
    status = 0

    def mounted():
        os.write(write_end, b"ok\n")
        os.close(write_end)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir("/")

    try:
        serve(operations, mountpoint, fuse_options, on_mounted=mounted)
    except BaseException as exc:  # report to the waiting parent, then exit
        try:
            text = str(exc) if isinstance(exc, CtdsfsError) else f"{mountpoint}: {exc}"
            os.write(write_end, printable(text).encode() + b"\n")
        except OSError:
            log.exception("mount daemon failed")
        status = 1
    os._exit(status)
