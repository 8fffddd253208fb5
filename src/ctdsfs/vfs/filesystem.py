"""Inodes, handles and directories over a tree of containers.

A directory is a container (the mounted one, or a nested one); a file is one
virtual file of a container. Inode numbers are handed out on first sight and
kept for the life of the mount, so ``find``/``cp -r``/hard-link detection see
stable numbers. Ownership, permissions and times come from the container file
itself, with write bits removed (the mount is read-only).
"""

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass

from ..errors import BlockError

log = logging.getLogger(__name__)

ROOT_INO = 1
NAME_MAX = 255


class FSError(Exception):
    """A POSIX error for one operation; the adapter hands ``errno`` to the kernel."""

    def __init__(self, code, message=""):
        super().__init__(message or os.strerror(code))
        self.errno = code


@dataclass
class Attr:
    ino: int
    mode: int
    nlink: int
    size: int
    blocks: int  # in 512-byte units, as st_blocks
    blksize: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int


@dataclass
class _Node:
    ino: int
    parent: int
    owner: object  # the container holding this entry (None for the root)
    name: str  # entry name in ``owner`` ('' for the root)
    directory: object  # the container this node shows as a directory, or None


class ContainerFS:
    """The mounted tree: lookup, getattr, readdir, open/read/release, statfs."""

    def __init__(self, root, file_stat):
        self.root = root
        self._stat = file_stat
        self._lock = threading.Lock()
        self._nodes = {ROOT_INO: _Node(ROOT_INO, ROOT_INO, None, "", root)}
        self._inos = {}
        self._next_ino = ROOT_INO + 1
        self._handles = {}
        self._next_fh = 1

    # -- nodes

    def _node(self, ino):
        try:
            return self._nodes[ino]
        except KeyError:
            raise FSError(errno.ENOENT) from None

    def _child(self, parent, name):
        """The node for entry ``name`` of directory node ``parent`` (created once)."""
        key = (id(parent.directory), name)
        with self._lock:
            ino = self._inos.get(key)
            if ino is not None:
                return self._nodes[ino]
        nested = parent.directory.nested(name)
        with self._lock:
            ino = self._inos.get(key)
            if ino is None:
                ino = self._next_ino
                self._next_ino += 1
                self._inos[key] = ino
                self._nodes[ino] = _Node(ino, parent.ino, parent.directory, name, nested)
            return self._nodes[ino]

    def _attr(self, node):
        st = self._stat
        readable = st.st_mode & 0o444
        if node.directory is not None:
            mode, nlink = stat.S_IFDIR | readable | (readable >> 2), 2  # r -> r-x
        else:
            mode, nlink = stat.S_IFREG | readable, 1
        if node.owner is None:  # the root: the mounted container itself
            size = nblocks = 0
            blksize = node.directory.usage().block_size
        else:
            size = node.owner.entry_size(node.name)
            nblocks = node.owner.entry_blocks(node.name)
            blksize = node.owner.usage().block_size
        return Attr(ino=node.ino, mode=mode, nlink=nlink, size=size,
                    blocks=nblocks * blksize // 512, blksize=blksize,
                    uid=st.st_uid, gid=st.st_gid, atime_ns=st.st_atime_ns,
                    mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)

    def _directory(self, ino):
        node = self._node(ino)
        if node.directory is None:
            raise FSError(errno.ENOTDIR)
        return node

    # -- operations

    def lookup(self, parent_ino, name):
        parent = self._directory(parent_ino)
        if name == ".":
            return self._attr(parent)
        if name == "..":
            return self._attr(self._node(parent.parent))
        if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise FSError(errno.ENAMETOOLONG)
        try:
            parent.directory.entry_size(name)
        except FileNotFoundError:
            raise FSError(errno.ENOENT) from None
        return self._attr(self._child(parent, name))

    def getattr(self, ino):
        return self._attr(self._node(ino))

    def opendir(self, ino):
        self._directory(ino)
        return ino

    def readdir(self, ino, start=0):
        """``(name, attr, next_offset)`` for entries from offset ``start`` on."""
        parent = self._directory(ino)
        names = parent.directory.names()
        for index in range(start, len(names)):
            yield names[index], self._attr(self._child(parent, names[index])), index + 1

    def open(self, ino, flags):
        node = self._node(ino)
        if node.directory is not None:
            raise FSError(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise FSError(errno.EROFS)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = node
        return fh

    def read(self, fh, offset, size):
        try:
            node = self._handles[fh]
        except KeyError:
            raise FSError(errno.EBADF) from None
        try:
            return node.owner.read(node.name, offset, size)
        except BlockError as exc:
            raise FSError(errno.EIO, str(exc)) from None

    def release(self, fh):
        with self._lock:
            self._handles.pop(fh, None)

    def statfs(self):
        usage = self.root.usage()
        return {
            "f_bsize": usage.block_size,
            "f_frsize": usage.block_size,
            "f_blocks": usage.total_blocks,
            "f_bfree": usage.free_blocks,
            "f_bavail": 0,  # read-only: nothing can be allocated
            "f_files": len(self._nodes),
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": NAME_MAX,
        }
