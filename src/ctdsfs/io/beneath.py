"""Paths inside a directory source that can never lead outside it.

A directory format (a TileDB array, a bcolz rootdir) is untrusted as a whole: any
component of a path inside it may be a symbolic link to a folder elsewhere, so
opening ``root/__meta/x`` with ``O_NOFOLLOW`` on the last component alone could
still read a file outside the source. Every function here walks from a
descriptor of ``root`` one component at a time with ``openat`` and
``O_NOFOLLOW``, so a link anywhere below ``root`` fails (ELOOP or ENOTDIR)
instead of being followed. ``root`` itself is trusted (the user named it).
"""

import contextlib
import os

from .store import open_if_regular, read_whole, regular_or_refused

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(rel):
    parts = [p for p in os.fspath(rel).split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OSError(2, "a path inside a source never climbs out of it", rel)
    return parts


@contextlib.contextmanager
def parent_fd(root, rel):
    """(descriptor of the folder holding ``rel``, last component); every folder on the
    way reached without following a link."""
    parts = _parts(rel)
    if not parts:
        raise OSError(21, "names the source itself", rel)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd, parts[-1]
    finally:
        os.close(fd)


def open_beneath(root, rel, flags=os.O_RDONLY, mode=0o644):
    """``os.open`` of ``root/rel`` with no link followed below ``root``."""
    with parent_fd(root, rel) as (fd, name):
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)


def lstat_beneath(root, rel):
    """``os.lstat`` of ``root/rel``, its folders reached without following a link."""
    parts = _parts(rel)
    if not parts:
        return os.lstat(root)
    with parent_fd(root, rel) as (fd, name):
        return os.stat(name, dir_fd=fd, follow_symlinks=False)


def kind_beneath(root, rel, test):
    """Whether ``root/rel`` exists, reached without links, and passes ``test``
    (``stat.S_ISDIR``, ``stat.S_ISREG``); False for anything unreachable."""
    try:
        return test(lstat_beneath(root, rel).st_mode)
    except OSError:
        return False


def listdir_beneath(root, rel=""):
    """The names in folder ``root/rel`` (reached without following a link)."""
    parts = _parts(rel)
    if not parts:
        return os.listdir(root)
    fd = open_beneath(root, rel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def open_regular_beneath(root, rel, what=None):
    """A read-only descriptor of the regular file ``root/rel`` (a FIFO, socket or device
    there is never opened: see :func:`~.store.open_if_regular`); failures are FormatErrors
    naming ``what`` (default: the path)."""
    what = what or os.path.join(root, rel)

    def opener():
        with parent_fd(root, rel) as (fd, name):
            return open_if_regular(name, dir_fd=fd, what=what)
    return regular_or_refused(opener, what)


def read_small_beneath(root, rel, limit, what=None):
    """The whole of regular file ``root/rel``, refused if it holds more than ``limit`` bytes."""
    what = what or os.path.join(root, rel)
    return read_whole(open_regular_beneath(root, rel, what), limit, what)


def create_exclusive_beneath(root, rel, mode=0o644):
    """A new file ``root/rel`` open for writing. A leftover of that name (a temporary a
    crash left, or a link someone planted there) is unlinked first, never opened: the
    file is made with ``O_CREAT | O_EXCL``, so no write can land in an existing file."""
    with parent_fd(root, rel) as (fd, name):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, mode, dir_fd=fd)
