"""Inodes, handles and directories over a tree of containers.

A directory is a container (the mounted one, or a nested one); a file is one
virtual file of a container. Inode numbers are handed out on first sight and
kept for the life of the mount. Ownership, permissions and times come from
the container file itself: MultiFile stores none of them, so chmod, chown and
utimens succeed without changing anything (``cp -a``/``rsync -a`` work).
A directory's link count is 2 plus its subdirectories. Telling a nested
container from a file reads the entry's first block, so a directory is
classified once (then kept until it changes), on its first stat if it has at
most CLASSIFY_MAX entries, else by its first full listing, which classifies
every entry anyway: until then it shows 1, the "count unknown" value find and
fts accept, so a stat never reads a block of every file of a huge directory.
A directory source's real directory changed behind the mount is counted anew
at its next listing. A file unlinked while open has link count 0.

Directory sources may hold symbolic links: they show as links (readlink gives
their text as stored) and are never followed here; the kernel resolves them
for the caller, with the caller's permissions. Creating symlinks, hard links,
FIFOs and device nodes is not supported (ENOSYS).

Write semantics: a file unlinked while open stays readable and writable
through its handles until the last one closes; rename replaces its target
like rename(2), moves files between containers by copying, and refuses to
move a directory into another container (EXDEV, so ``mv`` copies instead).
Changes are committed when the last writer of a file closes it (at flush,
so close() reports a failed commit), on fsync, on ``commit()`` (the
adapter's timer and unmount).

Coherence: lookup, readdir and open first ask the container whether another
process committed since (its header counter), and so does the adapter's
watcher every second (``refresh``); if so the tree is reloaded and nodes are
rebound by path, every node the kernel may have cached is handed to the
adapter to invalidate (``take_stale``), and the kernel is told not to keep
pages cached before the change (``may_keep_cache``). So the kernel may keep
names, attributes and pages of a container file for long; a directory source
(whose real files change without a counter) gets short timeouts instead.
"""

import errno
import functools
import logging
import os
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import (
    BlockError,
    ContainerFull,
    CtdsfsError,
    FSError,
    NotPermitted,
    ReadOnlyError,
    TooLarge,
)
from ..remote.retry import user_request
from .nodes import Node, NodeTable

log = logging.getLogger(__name__)

ROOT_INO = 1
NAME_MAX = 255
COPY_CHUNK = 4 << 20
LOGGED_MAX = 4096  # bad-block lines remembered per mount (so each is logged once)
CLASSIFY_MAX = 256  # entries a stat may classify to count a directory's subdirectories
UNKNOWN = -1  # subdirectory count of a large directory not listed yet
NUMBERED_AHEAD = 1024  # names past a listing's batch that workers number with it
# How long the kernel may keep names and attributes: a container file tells of
# every change by its header counter (then the kernel's copies are invalidated);
# a real directory changes silently, so the kernel asks again after a second.
FOLLOWED_CACHE_SECONDS = 24 * 3600.0
UNFOLLOWED_CACHE_SECONDS = 1.0


class Attr(NamedTuple):
    """A file's attributes (a tuple: a listing makes one per entry, and unpacks it)."""

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


class UnknownAttr(Attr):
    """What a listing shows of a file whose attributes fail with EIO (its size needs a
    damaged part, as a view's may): the entry is listed all the same, and the kernel keeps
    nothing of it, so a stat or an open asks again and gets the EIO."""

    __slots__ = ()


@dataclass(slots=True)
class _Handle:
    node: Node
    writable: bool
    append: bool


_ERRNOS = ((FileNotFoundError, errno.ENOENT), (FileExistsError, errno.EEXIST),
           (BlockError, errno.EIO), (ReadOnlyError, errno.EROFS), (NotPermitted, errno.EPERM),
           (ContainerFull, errno.ENOSPC), (TooLarge, errno.EFBIG),
           (CtdsfsError, errno.EINVAL))  # the first match wins; anything else is EIO


def _one_request(method):
    """A user's request: whatever a remote source waits for during it shares one time
    budget (``remote_retry.user_request``), however many GETs it takes."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with user_request():
            return method(*args, **kwargs)
    return wrapper


class ContainerFS:
    """The mounted tree: every operation the FUSE adapter forwards, as plain calls."""

    def __init__(self, root, source_path, writable=False, kernel_appends=False,
                 source_stat=None, stat_reads=True):
        self.root = root
        # whether a stat may read entries' first bytes to count a directory's subdirectories
        # (not of a remote source: a stat must not wait for a GET; a listing counts them)
        self.stat_reads = stat_reads
        self.source_path = source_path
        # owner, modes and times shown (a remote source has no local file to stat)
        self._source_stat = source_stat or functools.partial(os.stat, source_path)
        self.writable = writable
        # With the kernel's writeback cache the kernel places O_APPEND writes itself.
        self.kernel_appends = kernel_appends
        self._lock = threading.RLock()
        self._nodes = NodeTable(Node(ROOT_INO, ROOT_INO, None, "", root))
        # id(container) -> {entry name -> ino}: one small dict per directory, keyed by
        # the names the header already holds (a (container, name) tuple per file cost
        # ~100 bytes more for each of the 20,000 inodes of a small-files tree)
        self._inos = {}
        self._handles = {}
        self._open_counts = {}  # ino -> [handles, writers] while a handle is open on it
        self._next_fh = 1
        self.generation = 0  # bumped whenever the tree is reloaded
        self._subdirs = weakref.WeakKeyDictionary()  # directory container -> subdirectories
        self._logged = set()  # bad-block lines already logged (the kernel retries reads)
        self._log_lock = threading.Lock()  # reads run in worker threads
        self._stale = {}  # ino -> (parent ino, name) the kernel may hold from before a reload
        self.follows_changes = os.path.isfile(source_path)
        self._shared = None  # SharedInodes, while several processes serve the mount
        self._reloads_seen = 0  # the workers' count of reloads when this one last looked
        self.kernel_cache_seconds = (FOLLOWED_CACHE_SECONDS if self.follows_changes
                                     else UNFOLLOWED_CACHE_SECONDS)

    # ------------------------------------------------------------ helpers

    def _call(self, func, *args):
        """Run a container call, turning its exceptions into FSError."""
        try:
            return func(*args)
        except FSError:
            raise
        except (CtdsfsError, OSError) as exc:
            code = next((code for kind, code in _ERRNOS if isinstance(exc, kind)), errno.EIO)
            raise FSError(code, str(exc)) from None

    def share_inodes(self, table):
        """Number nodes by ``table`` (a SharedInodes), with the worker processes that share
        it; a handle is then its inode number, so any of them reads it. Read-only: only
        the root has a node yet."""
        assert not self.writable and len(self._nodes) == 1
        self._shared = table

    def _node(self, ino):
        try:
            return self._nodes[ino]
        except KeyError:
            if self._shared is None:
                raise FSError(errno.ENOENT) from None
        with self._lock:
            return self._resolve(ino)

    def _resolve(self, ino):
        """The node of ``ino``, which another worker numbered: its path from the shared
        table, looked up here from the nearest node this process has."""
        chain = [ino]
        while chain[-1] not in self._nodes:
            where = self._shared.where(chain[-1])
            if where is None or len(chain) > 4096:
                raise FSError(errno.ENOENT)
            chain.append(where[0])
        node = self._nodes[chain.pop()]
        while chain:
            wanted = chain.pop()
            if node.directory is None:
                raise FSError(errno.ENOENT)
            node = self._existing_child(node, self._shared.where(wanted)[1])
            if node.ino != wanted:
                raise FSError(errno.ENOENT)
        return node

    def _directory(self, ino):
        node = self._node(ino)
        if node.directory is None:
            raise FSError(errno.ENOTDIR)
        return node

    def _inos_of(self, container):
        """The ``{name: ino}`` of ``container``'s entries that have a node (made on demand)."""
        inos = self._inos.get(id(container))
        if inos is None:
            inos = self._inos[id(container)] = {}
        return inos

    def _child(self, parent, name):
        """The node for entry ``name`` of directory node ``parent`` (created once)."""
        inos = self._inos_of(parent.directory)
        ino = inos.get(name)
        if ino is not None:
            return self._nodes[ino]
        return self._new_node(parent, inos, name, self._call(parent.directory.nested, name))

    def _new_node(self, parent, inos, name, nested, ino=None):
        if ino is None and self._shared is not None:
            ino = self._shared.number(parent.ino, [name])[0]
        node = self._nodes.new(parent.ino, parent.directory, name, nested, ino)
        inos[name] = node.ino
        return node

    def _children(self, parent, names, ahead=()):
        """``_child`` of each of ``names`` (a listing's batch; most are new on a first one).
        With workers, the listing's next names ``ahead`` are numbered in the same go if
        any of ``names`` is new to all (its next batches then skip the table's lock)."""
        container, nodes = parent.directory, self._nodes
        inos = self._inos_of(container)
        new = [name for name in names if name not in inos]
        numbers = dict(zip(new, self._shared.number(parent.ino, new, ahead))) \
            if new and self._shared is not None else {}
        out = []
        for name, nested in zip(names, self._call(container.classify, names)):
            ino = inos.get(name)
            out.append(nodes[ino] if ino is not None
                       else self._new_node(parent, inos, name, nested, numbers.get(name)))
        return out

    def _existing_child(self, parent, name):
        if not parent.directory.contains(name):
            raise FSError(errno.ENOENT)
        return self._child(parent, name)

    def _forget_name(self, container, name):
        self._inos_of(container).pop(name, None)

    def _attr(self, node, st=None, blksize=None):
        """Attributes of ``node``; ``st`` is the source's stat and ``blksize`` the block size
        of ``node``'s container when the caller has them (a listing: once per batch)."""
        st = st or self._source_stat()
        perms = st.st_mode & (0o666 if self.writable else 0o444)
        if node.directory is not None:
            subdirs = self._subdirectories(node.directory)
            nlink = 1 if subdirs == UNKNOWN else 2 + subdirs
            mode = stat.S_IFDIR | perms | ((perms & 0o444) >> 2)  # r -> r-x
        elif self._link_text(node) is not None:
            mode, nlink = stat.S_IFLNK | 0o777, 1
        else:
            mode, nlink = stat.S_IFREG | perms, 1 if isinstance(node.key, str) else 0
        if node.owner is None:  # the root: the mounted container itself
            size = nblocks = 0
            blksize = node.directory.usage().block_size
        else:
            size = self._call(self._call_logged, node, node.owner.entry_size, node.key)
            nblocks = self._call(node.owner.entry_blocks, node.key)
            blksize = blksize or node.owner.usage().block_size
        return Attr(ino=node.ino, mode=mode, nlink=nlink, size=size,
                    blocks=nblocks * blksize // 512, blksize=blksize,
                    uid=st.st_uid, gid=st.st_gid, atime_ns=st.st_atime_ns,
                    mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)

    def _subdirectories(self, directory):
        """How many of ``directory``'s entries are directories (UNKNOWN if too many to
        classify for a stat)."""
        count = self._subdirs.get(directory)
        if count is None and not directory.holds_directories:
            count = self._subdirs[directory] = 0  # known without listing it (columns/)
        if count is None:
            names = directory.names()
            count = UNKNOWN if len(names) > CLASSIFY_MAX or not self.stat_reads \
                else self._count_subdirectories(directory, names)
            self._subdirs[directory] = count
        return count

    def _count_subdirectories(self, directory, names):
        return sum(nested is not None for nested in self._call(directory.classify, names))

    def _link_text(self, node):
        """The text of ``node`` if it is a symbolic link, else None."""
        if node.owner is None or node.directory is not None or not isinstance(node.key, str):
            return None
        return node.owner.symlink_target(node.key)

    def _path(self, node):
        """``node``'s path inside the mount, for messages."""
        parts = []
        while node.ino != ROOT_INO and len(parts) < 64:
            parts.append(node.key if isinstance(node.key, str) else "(unlinked)")
            node = self._nodes.get(node.parent, self._nodes[ROOT_INO])
        return "/".join(reversed(parts))

    def _log_once(self, line):
        """Log ``line`` unless this mount logged it already (bounded memory)."""
        if self._shared is not None:
            if self._shared.first_time(line):
                log.error("%s", line)
            return
        with self._log_lock:
            if line in self._logged:
                return
            if len(self._logged) >= LOGGED_MAX:
                self._logged.clear()
            self._logged.add(line)
        log.error("%s", line)

    def _check_name(self, name):
        if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise FSError(errno.ENAMETOOLONG)
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise FSError(errno.EINVAL)

    def _check_writable(self):
        if not self.writable or not self.root.writable:
            raise FSError(errno.EROFS)

    # ------------------------------------------------------------ coherence

    def _refresh(self):
        """Reload the tree if another process changed the container; rebind nodes by path."""
        if self._shared is not None:
            self._reloads_seen = self._shared.reloads()
        try:
            changed = self.root.reload_if_changed()
            replacement = self.root.reopened()
        except (CtdsfsError, OSError) as exc:
            log.error("cannot re-read the changed container: %s", exc)
            return
        if replacement is not None:
            old, self.root = self.root, replacement
            self._nodes[ROOT_INO].directory = replacement
            old.close()
            changed = True
        if not changed:
            return
        if self._shared is not None:
            self._shared.reloaded()
        self.generation += 1
        self._stale.update((node.ino, (node.parent, node.key)) for node in self._nodes.values()
                           if isinstance(node.key, str))
        self._inos.clear()
        self._subdirs.clear()
        rebound = {ROOT_INO: self._nodes[ROOT_INO]}
        for node in sorted(self._nodes.values(), key=self._depth):
            parent = rebound.get(node.parent)
            if node.ino == ROOT_INO or parent is None or parent.directory is None:
                continue
            if not isinstance(node.key, str) or not parent.directory.contains(node.key):
                continue  # gone: the kernel gets ENOENT on its next use
            node.owner = parent.directory
            node.directory = parent.directory.nested(node.key)
            self._inos_of(node.owner)[node.key] = node.ino
            rebound[node.ino] = node
        self._nodes.keep_only(rebound)

    def _depth(self, node):
        depth = 0
        while node.ino != ROOT_INO and node.parent in self._nodes and depth < 64:
            node, depth = self._nodes[node.parent], depth + 1
        return depth

    def refresh(self):
        """Reload now if another process changed the container (the adapter's watcher)."""
        with self._lock:
            self._refresh()

    def take_stale(self):
        """``[(ino, parent ino, name)]`` whose kernel copies predate a reload (then forgotten)."""
        with self._lock:
            stale, self._stale = self._stale, {}
            return [(ino, parent, name) for ino, (parent, name) in stale.items()]

    def may_keep_cache(self, fh):
        """Whether the kernel's cached pages of this file are still valid (no reload since)."""
        with self._lock:
            node = self._handle(fh).node
            keep = node.generation == self.generation and node.owner.kernel_keeps_pages
            node.generation = self.generation
            return keep

    # ------------------------------------------------------------ reading

    @property
    def asks_servers(self):
        """Whether a first look at an entry may wait for a server (a remote source)."""
        return not self.stat_reads

    def looks_up_at_once(self, parent_ino, name):
        """Whether ``lookup(parent_ino, name)`` is answered from memory: a remote
        source's entry once it was looked at (a first look may wait for the server)."""
        node = self._nodes.get(parent_ino)
        return self.stat_reads or (node is not None and node.directory is not None
                                   and name in self._inos.get(id(node.directory), ()))

    def _look_first(self, ino, names=None):
        """Before the lock: what a lookup or a listing of ``names`` (None: all) in
        directory ``ino`` will ask a remote source for and may wait for the server for
        (which entries are containers or prefixes, a table view's table.dat), so that
        no other request waits for that server behind the lock: the locked part finds
        it kept. A local source answers those at once (nothing done here)."""
        if self.stat_reads:
            return
        directory = self._node(ino).directory  # (numbered by another worker: found here)
        if directory is None:
            return
        names = [n for n in (directory.names() if names is None else names)
                 if directory.contains(n)]
        nested = self._call(directory.classify, names)
        try:
            directory.entry_stats([n for n, d in zip(names, nested) if d is None])
        except (CtdsfsError, OSError):
            pass  # (the locked part says which entry it costs: ``_listed_attrs``)

    @_one_request
    def prepare_listing(self, ino):
        """``_look_first`` of a whole directory (the adapter runs it in a thread)."""
        self._look_first(ino)

    @_one_request
    def lookup(self, parent_ino, name):
        if name not in (".", ".."):
            self._look_first(parent_ino, [name])
        with self._lock:
            self._refresh()
            parent = self._directory(parent_ino)
            if name == ".":
                return self._attr(parent)
            if name == "..":
                return self._attr(self._node(parent.parent))
            if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
                raise FSError(errno.ENAMETOOLONG)
            return self._attr(self._existing_child(parent, name))

    @_one_request
    def getattr(self, ino):
        with self._lock:
            if self._shared is not None:
                self._refresh()  # (another worker may have had the kernel forget it just now)
            return self._attr(self._node(ino))

    @_one_request
    def opendir(self, ino):
        with self._lock:
            self._refresh()
            self._directory(ino)
            return ino

    @_one_request
    def readdir(self, ino, start=0, limit=None):
        """``[(name, attr, next_offset)]`` for at most ``limit`` entries from offset ``start``
        on, ``.`` and ``..`` first. The kernel reads a listing in small batches, so only the
        entries asked for get attributes (else a listing costs the square of its length).
        A whole listing also counts the subdirectories (for ``st_nlink``): a container's
        count once (a reload or a change of its own drops it), a directory source's at
        every listing (its real directory changes without telling)."""
        with self._lock:
            if start == 0 or self._shared is not None:
                # (a listing's next batch may come to a worker that did not answer its
                # first: it reloads too, else it would list the tree from before)
                self._refresh()
            parent = self._directory(ino)
            names = parent.directory.names()
            if start == 0 and (not self.follows_changes or
                               self._subdirs.get(parent.directory, UNKNOWN) == UNKNOWN):
                self._subdirs[parent.directory] = self._count_subdirectories(parent.directory,
                                                                             names)
            stop = len(names) + 2 if limit is None else min(len(names) + 2, start + limit)
            st = self._source_stat()  # once for the whole batch
            blksize = parent.directory.usage().block_size  # (a directory source's: statvfs)
            out = [("." if i == 0 else "..",
                    self._attr(parent if i == 0 else self._node(parent.parent), st), i + 1)
                   for i in range(start, min(stop, 2))]
            first = max(start, 2)
            wanted = names[first - 2:stop - 2]
            nodes = self._children(parent, wanted, names[stop - 2:stop - 2 + NUMBERED_AHEAD])
            out += zip(wanted, self._listed_attrs(parent.directory, nodes, st, blksize),
                       range(first + 1, stop + 1))
            return out

    def _listed_attrs(self, directory, nodes, st, blksize):
        """``_attr`` of each of ``nodes`` (entries of ``directory``), a plain file's without
        a call per attribute: a listing builds one for every entry it returns. An entry
        whose attributes are EIO is an UnknownAttr: it costs that entry, not the listing."""
        perms = st.st_mode & (0o666 if self.writable else 0o444)
        mode, uid, gid = stat.S_IFREG | perms, st.st_uid, st.st_gid
        atime, mtime, ctime = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        if not directory.holds_links:
            try:
                stats = self._call(directory.entry_stats, [node.key for node in nodes])
                return [Attr(node.ino, mode, 1, size, nblocks * blksize // 512, blksize, uid,
                             gid, atime, mtime, ctime) if node.directory is None
                        else self._attr(node, st, blksize)
                        for node, (size, nblocks) in zip(nodes, stats)]
            except FSError as exc:
                if exc.errno != errno.EIO:
                    raise
        out = []
        for node in nodes:  # (one by one: which of them is EIO)
            try:
                out.append(self._attr(node, st, blksize))
            except FSError as exc:
                if exc.errno != errno.EIO:
                    raise
                out.append(UnknownAttr(node.ino, mode, 1, 0, 0, blksize, uid, gid, atime,
                                       mtime, ctime))
        return out

    @_one_request
    def readlink(self, ino):
        """A symbolic link's text, as stored (never resolved here)."""
        with self._lock:
            target = self._link_text(self._node(ino))
            if target is None:
                raise FSError(errno.EINVAL)
            return target

    @_one_request
    def open(self, ino, flags):
        with self._lock:
            self._refresh()
            node = self._node(ino)
            if node.directory is not None:
                raise FSError(errno.EISDIR)
            if self._link_text(node) is not None:
                raise FSError(errno.ELOOP)
            writable = flags & os.O_ACCMODE != os.O_RDONLY
            if writable or flags & os.O_TRUNC:
                self._check_writable()
            if flags & os.O_TRUNC:
                self._call(node.owner.truncate, node.key, 0)
            return self._new_handle(node, writable, bool(flags & os.O_APPEND))

    def _new_handle(self, node, writable, append):
        if self._shared is not None:
            return node.ino  # (read-only: a handle holds nothing but its node)
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = _Handle(node, writable, append)
        counts = self._open_counts.setdefault(node.ino, [0, 0])
        counts[0] += 1
        counts[1] += writable
        return fh

    def _opened(self, node):
        """``(handles, writers)`` open on ``node``."""
        return self._open_counts.get(node.ino, (0, 0))

    def _handle(self, fh):
        handle = self._handles.get(fh)
        if handle is not None:
            return handle
        if self._shared is None:
            raise FSError(errno.EBADF)
        return _Handle(self._node(fh), False, False)

    @_one_request
    def read(self, fh, offset, size):
        if self._shared is not None and self._shared.reloads() != self._reloads_seen:
            with self._lock:  # (another worker reloaded: this one's tree is from before)
                self._refresh()
        node = self._handle(fh).node
        return self._call(self._call_logged, node, node.owner.read, node.key, offset, size)

    def read_at_once(self, fh, offset, size):
        """Whether that read is answered from memory, without waiting (``Container.cached``)."""
        node = self._handle(fh).node
        return self._call(node.owner.cached, node.key, offset, size)

    def _call_logged(self, node, call, *args):
        """``call(*args)`` (a read of ``node``, or its size); a bad block is logged once per
        mount, with the file's path in the mount."""
        try:
            return call(*args)
        except BlockError as exc:
            self._log_once(f"{self.source_path}: {self._path(node)}: {exc.detail}")
            raise

    @_one_request
    def statfs(self):
        """Space in the root container's blocks. Counts come from an untrusted header: the
        free count is kept within 0 .. total, so every field fits the kernel's unsigned ones."""
        usage = self.root.usage()
        total = max(0, usage.total_blocks)
        own_free = min(max(0, usage.free_blocks), total)
        free = own_free
        avail = 0
        if self.writable:
            disk = os.statvfs(self.source_path)
            free += disk.f_bavail * disk.f_frsize // usage.block_size
            avail = free
        return {
            "f_bsize": usage.block_size,
            "f_frsize": usage.block_size,
            "f_blocks": total + (free - own_free),
            "f_bfree": free,
            "f_bavail": avail,
            "f_files": len(self._nodes) if self._shared is None else self._shared.count(),
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": NAME_MAX,
        }

    # ------------------------------------------------------------ writing

    def write(self, fh, offset, data):
        with self._lock:
            handle = self._handle(fh)
            if not handle.writable:
                raise FSError(errno.EBADF)
            node = handle.node
            if handle.append and not self.kernel_appends:
                offset = node.owner.entry_size(node.key)
            return self._call(node.owner.write, node.key, offset, data)

    def create(self, parent_ino, name, flags):
        """Create (or open, if it exists) a file; returns ``(fh, attr)``."""
        with self._lock:
            self._check_writable()
            self._check_name(name)
            parent = self._directory(parent_ino)
            if parent.directory.contains(name):
                if flags & os.O_EXCL:
                    raise FSError(errno.EEXIST)
                node = self._child(parent, name)
                return self.open(node.ino, flags), self._attr(node)
            self._call(parent.directory.create, name)
            node = self._child(parent, name)
            fh = self._new_handle(node, flags & os.O_ACCMODE != os.O_RDONLY,
                                  bool(flags & os.O_APPEND))
            return fh, self._attr(node)

    def setattr(self, ino, size=None):
        """Only the size is stored; mode, owner and times are accepted and not kept."""
        with self._lock:
            node = self._node(ino)
            if size is not None:
                if node.directory is not None:
                    raise FSError(errno.EISDIR)
                self._check_writable()
                self._call(node.owner.truncate, node.key, size)
            return self._attr(node)

    def mkdir(self, parent_ino, name):
        with self._lock:
            self._check_writable()
            self._check_name(name)
            parent = self._directory(parent_ino)
            if parent.directory.contains(name):
                raise FSError(errno.EEXIST)
            self._call(parent.directory.make_nested, name)
            self._subdirs.pop(parent.directory, None)
            return self._attr(self._child(parent, name))

    def unlink(self, parent_ino, name):
        with self._lock:
            self._check_writable()
            parent = self._directory(parent_ino)
            node = self._existing_child(parent, name)
            if node.directory is not None:
                raise FSError(errno.EISDIR)
            self._drop(parent, node)

    def _drop(self, parent, node):
        """Remove ``node``'s entry; an open file lives on, unnamed, until its last release."""
        name = node.key
        orphan = self._call(parent.directory.remove, name, self._opened(node)[0] > 0)
        self._forget_name(parent.directory, name)
        if orphan is not None:
            node.key = orphan
        else:
            self._nodes.pop(node.ino, None)

    def rmdir(self, parent_ino, name):
        with self._lock:
            self._check_writable()
            parent = self._directory(parent_ino)
            node = self._existing_child(parent, name)
            if node.directory is None:
                raise FSError(errno.ENOTDIR)
            if node.directory.names():
                raise FSError(errno.ENOTEMPTY)
            self._drop(parent, node)
            self._subdirs.pop(parent.directory, None)

    def rename(self, old_parent_ino, old_name, new_parent_ino, new_name, noreplace=False):
        with self._lock:
            self._check_writable()
            self._check_name(new_name)
            src_parent = self._directory(old_parent_ino)
            dst_parent = self._directory(new_parent_ino)
            node = self._existing_child(src_parent, old_name)
            src, dst = src_parent.directory, dst_parent.directory
            if src is dst and old_name == new_name:
                return
            self._subdirs.pop(src, None)
            self._subdirs.pop(dst, None)
            if dst.contains(new_name):
                if noreplace:
                    raise FSError(errno.EEXIST)
                target = self._child(dst_parent, new_name)
                if node.directory is None and target.directory is not None:
                    raise FSError(errno.EISDIR)
                if node.directory is not None and target.directory is None:
                    raise FSError(errno.ENOTDIR)
                if target.directory is not None and target.directory.names():
                    raise FSError(errno.ENOTEMPTY)
                if src is dst and self._opened(target)[0] == 0:
                    # The container replaces it itself (and a view may translate it).
                    self._forget_name(dst, new_name)
                    self._nodes.pop(target.ino, None)
                else:
                    self._drop(dst_parent, target)
            if src is dst:
                self._call(src.rename, old_name, new_name)
            elif node.directory is not None:
                raise FSError(errno.EXDEV)
            else:
                self._copy_across(src, old_name, dst, new_name)
                self._call(src.remove, old_name)
                node.owner = dst
            self._forget_name(src, old_name)
            self._inos_of(dst)[new_name] = node.ino
            node.key = new_name
            node.parent = dst_parent.ino

    def _copy_across(self, src, old_name, dst, new_name):
        self._call(dst.create, new_name)
        size = src.entry_size(old_name)
        for offset in range(0, size, COPY_CHUNK):
            data = self._call(src.read, old_name, offset, COPY_CHUNK)
            self._call(dst.write, new_name, offset, data)

    def flush(self, fh):
        """close(): the last writer's close commits, and close() reports a failure."""
        with self._lock:
            handle = self._handle(fh)
            if handle.writable and self._opened(handle.node)[1] == 1:
                self.commit()

    def fsync(self, fh=None):
        with self._lock:
            if fh is not None:
                self._handle(fh)
            self.commit()

    def release(self, fh):
        """Close a handle; the last writer's close commits, the last close frees an orphan."""
        with self._lock:
            handle = self._handles.pop(fh, None)
            if handle is None:
                return
            node = handle.node
            counts = self._open_counts[node.ino]
            counts[0] -= 1
            counts[1] -= handle.writable
            handles, writers = counts
            if not handles:
                del self._open_counts[node.ino]
            if not isinstance(node.key, str) and handles == 0:
                self._call(node.owner.release, node.key)
                self._nodes.pop(node.ino, None)
            if handle.writable and writers == 0 and self.root.dirty:
                self.commit()  # normally done at flush; kept for handles never flushed

    def commit(self):
        """Commit every pending change; a failure leaves the committed state and goes read-only."""
        with self._lock:
            if not self.writable or not self.root.writable:
                return False
            return self._call(self.root.commit)

    def close(self):
        """Unmount: commit what is pending and release the container."""
        with self._lock:
            try:
                self.root.close()
            except (CtdsfsError, OSError) as exc:
                log.error("final commit failed: %s", exc)
