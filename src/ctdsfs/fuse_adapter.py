"""Kernel requests to ContainerFS calls (with fuse_workers.py, the only pyfuse3 and trio code).

Metadata operations are cheap and run on the trio loop, except a remote source's
first look at an entry and its listings (``ContainerFS.looks_up_at_once``): those may
wait for a server, so they run in worker threads too. Reads of a
CRC-protected container, and large reads (THREADED_READ_MIN) of a read-only
mount, run in worker threads: a read that waits for the disk must not hold up
every other request (while one reader of a local disk is alone, they run on the
loop all the same: ``FuseOperations._alone``; a local mount of a format decoded
from chunks or tiles runs them all there: ``reads_on_loop``). A read the container
answers from memory (``ContainerFS.read_at_once``: a remote source's cached chunks)
stays on the loop. Small reads stay on the loop too, where the thread hop would cost more
than the read (it doubles the time to read 20,000 small files), even when
their bytes are not in the page cache: sending such cold reads to threads
was measured slower with one and with four random readers (the benchmark's
cold fio rows). A read the page cache of the mount could answer never
reaches us, since the kernel keeps a file's pages. A read-write mount reads
on the loop, between the writes it orders.

The kernel keeps names and attributes for ``ContainerFS.kernel_cache_seconds``
(a day for a container file), so ``find``/``ls -lR``/``tar`` cost one readdir
per directory and one open per file. Coherence comes from invalidation: a
watcher asks the VFS every WATCH_SECONDS whether another process changed the
container (as do open and opendir), and what the kernel cached before a reload
is invalidated from a worker thread (the kernel calls block until related
requests, which this loop serves, are done).
"""

import contextlib
import errno
import functools
import logging
import os
import select
import sys
import tempfile
import threading
import time

import pyfuse3
import trio

from .container import READAHEAD_KB
from .errors import CtdsfsError
from .vfs import FSError, UnknownAttr

log = logging.getLogger(__name__)

# How often the watcher looks for another process's commit (header counter).
WATCH_SECONDS = 1.0
# Reads of at least this size run in a worker thread (read-only mounts).
THREADED_READ_MIN = 128 << 10
# After a sign of a second reader (a request waiting when a read on the loop ended, or a
# read arriving while another is in a thread), reads that may wait for the disk go to
# worker threads until this long has passed without one.
SHARED_SECONDS = 0.5
# Least time between two trims of the heap after large reads (see FuseOperations.release).
TRIM_SECONDS = 1.0
# Directory entries built per step of a readdir reply: about what one kernel buffer (a
# 4 KiB page) takes with full attributes (readdirplus, ~170 bytes an entry). Entries built
# but not taken are built again for the next request: with 128 a listing built each
# entry 2.6 times.
READDIR_BATCH = 32
FS_ENCODING = sys.getfilesystemencoding()  # names as os.fsencode gives them


def _fuse_errors(method, keeps_claim=False):
    """Translate FSError (and unexpected failures, logged once) into FUSEError.
    ``keeps_claim``: an answer so quick that a worker of several keeps the read claim
    through it (fuse_workers.Gate)."""

    @functools.wraps(method)
    async def wrapper(operations, *args, **kwargs):
        if operations.gate is not None and not keeps_claim:
            operations.gate.read_done()
        try:
            return await method(operations, *args, **kwargs)
        except FSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except pyfuse3.FUSEError:
            raise
        except Exception:
            log.exception("internal error in %s", method.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _entry(attr, cache_seconds):
    ino, mode, nlink, size, blocks, blksize, uid, gid, atime, mtime, ctime = attr
    entry = pyfuse3.EntryAttributes()  # (generation and st_rdev start at 0)
    entry.st_ino = ino
    entry.entry_timeout = cache_seconds
    entry.attr_timeout = cache_seconds
    entry.st_mode = mode
    entry.st_nlink = nlink
    entry.st_uid = uid
    entry.st_gid = gid
    entry.st_size = size
    entry.st_blksize = blksize
    entry.st_blocks = blocks
    entry.st_atime_ns = atime
    entry.st_mtime_ns = mtime
    entry.st_ctime_ns = ctime
    return entry


class FuseOperations(pyfuse3.Operations):
    """pyfuse3 request handlers delegating to a :class:`ctdsfs.vfs.ContainerFS`."""

    def __init__(self, fs, *, threaded_reads, write_cache=False, commit_interval=None,
                 trim_heap=None, readahead_kb=READAHEAD_KB, lone_reads_on_loop=False,
                 reads_on_loop=False):
        """``lone_reads_on_loop``: a read that would go to a worker thread is answered on
        the loop while no other request waits (see ``_alone``); only for a source whose
        reads cannot stall for long (a local disk, not a network filesystem or server).
        ``reads_on_loop``: such reads are answered on the loop even beside other
        readers, for a local mount of a format decoded from chunks or tiles (a TileDB
        array, a bcolz rootdir): their decoders work ahead in threads of their own,
        and the hop of each request to a worker thread and back once a second reader
        showed cost the mount more CPU than it let run side by side (more, per byte,
        than one reader's reads)."""
        super().__init__()
        self.readahead_kb = readahead_kb  # set on the mount once it is live
        # Let the kernel gather writes in its page cache and send them in large
        # batches (it sends them before every flush and fsync).
        self.enable_writeback_cache = write_cache
        self.fs = fs
        self.threaded_reads = threaded_reads
        self.commit_interval = commit_interval
        self.serving = False  # set while serving: a kernel to make forget what it cached
        self.initialized = None  # set while serving: a trio.Event, set by init()
        self.trim_heap = trim_heap  # gives the C heap's free pages back (malloc_trim), or None
        self._heavy_reads = False  # reads that may wait for the disk, since the last trim
        self._trimmed_at = float("-inf")  # monotonic time of the last trim
        self.lone_reads_on_loop = lone_reads_on_loop
        self.reads_on_loop = reads_on_loop
        self._device_poll = None  # polls /dev/fuse for waiting requests, once serving
        self._reads_in_flight = 0  # reads in worker threads now
        self._shared_until = float("-inf")  # monotonic time until which reads are shared
        # One of several worker processes (fuse_workers.Gate): one request at a time.
        self.gate = None

    def init(self):
        """FUSE_INIT is being answered: pyfuse3 writes the reply (and the kernel takes it)
        before its loop lets another task run."""
        if self.initialized is not None:
            self.initialized.set()

    def _entry(self, attr):
        return _entry(attr, 0 if isinstance(attr, UnknownAttr) else self.fs.kernel_cache_seconds)

    async def _invalidate_stale(self, wait):
        """Make the kernel forget what it cached before a reload. A request holding the
        kernel's lock on a directory (lookup, readdir) cannot ``wait``: the
        invalidation would wait for it. (A worker of several waits too: the idle workers
        answer what the invalidation waits for.)"""
        stale = self.fs.take_stale()
        if not stale:
            return
        if wait or not self.serving:
            await trio.to_thread.run_sync(_forget_in_kernel, stale)
        else:  # (a thread of its own starts now: a task of the loop would wait for the
            # next pass through trio's scheduler, which a worker makes only now and then)
            threading.Thread(target=_forget_in_kernel, args=(stale,), daemon=True,
                             name="ctdsfs-forget").start()

    async def watch_for_changes(self):
        """Every WATCH_SECONDS: reload if another process committed, and invalidate. A
        worker of several looks in a thread, so that a look waiting for the disk does not
        hold up the request it answers."""
        while True:
            await trio.sleep(WATCH_SECONDS)
            try:
                if self.gate is None:
                    self.fs.refresh()
                else:
                    await trio.to_thread.run_sync(self.fs.refresh)
            except FSError as exc:
                log.error("cannot look for changes: %s", exc)
            await self._invalidate_stale(wait=True)

    @_fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        name = os.fsdecode(name)
        if self.fs.looks_up_at_once(parent_inode, name):
            attr = self.fs.lookup(parent_inode, name)
        else:  # (it may wait for a server: in a thread, so the loop answers others)
            attr = await trio.to_thread.run_sync(self.fs.lookup, parent_inode, name)
        entry = self._entry(attr)
        await self._invalidate_stale(wait=False)
        return entry

    @_fuse_errors
    async def getattr(self, inode, ctx=None):
        return self._entry(self.fs.getattr(inode))

    @_fuse_errors
    async def readlink(self, inode, ctx):
        return os.fsencode(self.fs.readlink(inode))

    @_fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        return self._entry(self.fs.setattr(inode, attr.st_size if fields.update_size else None))

    @_fuse_errors
    async def opendir(self, inode, ctx):
        fh = self.fs.opendir(inode)
        await self._invalidate_stale(wait=True)
        return fh

    @_fuse_errors
    async def readdir(self, fh, start_id, token):
        if start_id == 0 and self.fs.asks_servers:  # (as lookup's)
            await trio.to_thread.run_sync(self.fs.prepare_listing, fh)
        self._reply_entries(fh, start_id, token)
        await self._invalidate_stale(wait=False)

    def _reply_entries(self, fh, start_id, token):
        """Entries from ``start_id`` on, with full attributes, until the kernel's buffer is full."""
        limit = READDIR_BATCH
        while True:
            batch = self.fs.readdir(fh, start_id, limit)
            for name, attr, next_id in batch:
                if not pyfuse3.readdir_reply(token, name.encode(FS_ENCODING, "surrogateescape"),
                                             self._entry(attr), next_id):
                    return
                start_id = next_id
            if len(batch) < limit:
                return
            limit *= 2  # a kernel with larger buffers (Linux 6.16 on) takes more a request

    async def releasedir(self, fh):
        pass

    @_fuse_errors
    async def fsyncdir(self, fh, datasync):
        self.fs.fsync()

    @_fuse_errors
    async def open(self, inode, flags, ctx):
        fh = self.fs.open(inode, flags)
        await self._invalidate_stale(wait=True)
        return pyfuse3.FileInfo(fh=fh, keep_cache=self.fs.may_keep_cache(fh))

    @_fuse_errors
    async def read(self, fh, off, size):
        """A worker of several answers on its loop: it reads no other request meanwhile,
        and the other workers answer those (fuse_workers.Gate)."""
        if self.gate is not None:
            return self.fs.read(fh, off, size)
        if (self.threaded_reads or (size >= THREADED_READ_MIN and not self.fs.writable)) \
                and not self.fs.read_at_once(fh, off, size):
            self._heavy_reads = True
            if self.reads_on_loop or self._alone():
                try:
                    return self.fs.read(fh, off, size)
                finally:
                    if self._requests_waiting():
                        self._shared_until = time.monotonic() + SHARED_SECONDS
            if self._reads_in_flight:
                self._shared_until = time.monotonic() + SHARED_SECONDS
            self._reads_in_flight += 1
            try:
                return await trio.to_thread.run_sync(self.fs.read, fh, off, size)
            finally:
                self._reads_in_flight -= 1
        return self.fs.read(fh, off, size)

    def _alone(self):
        """Whether a read that may wait for the disk can be answered on the loop: nobody
        else is reading (no read in a thread, no other request waiting, no sign of a
        second reader for SHARED_SECONDS). One reader's cold reads then skip a thread's
        hop there and back (0.1 ms on the 2-core VM, a tenth of a cold bcolz chunk);
        a second reader waits for at most one read before reads are shared again."""
        return self.lone_reads_on_loop and not self._reads_in_flight \
            and time.monotonic() >= self._shared_until and not self._requests_waiting()

    def _requests_waiting(self):
        """Whether the kernel holds requests this process has not read yet."""
        return self._device_poll is None or bool(self._device_poll.poll(0))

    def watch_device(self, fd=None):
        """Poll ``fd``, the /dev/fuse descriptor, for ``_requests_waiting``; pyfuse3 does
        not say which it opened, so by default it is found in /proc/self/fd. Without one,
        reads are never answered on the loop."""
        if fd is None:
            for name in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError, ValueError):
                    if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                        fd = int(name)
        if fd is not None:
            self._device_poll = select.poll()
            self._device_poll.register(fd, select.POLLIN)

    @_fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        fh, attr = self.fs.create(parent_inode, os.fsdecode(name), flags)
        return pyfuse3.FileInfo(fh=fh), self._entry(attr)

    @_fuse_errors
    async def write(self, fh, off, buf):
        return self.fs.write(fh, off, buf)

    @_fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._entry(self.fs.mkdir(parent_inode, os.fsdecode(name)))

    @_fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        self.fs.unlink(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        self.fs.rmdir(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        self.fs.rename(parent_inode_old, os.fsdecode(name_old), parent_inode_new,
                       os.fsdecode(name_new), noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE))

    @_fuse_errors
    async def flush(self, fh):
        """A read-only mount has nothing to do at a close: ENOSYS, and the kernel sends no
        more flushes (a request fewer for each file a walk opens)."""
        if not self.fs.writable:
            raise FSError(errno.ENOSYS)
        self.fs.flush(fh)

    @_fuse_errors
    async def fsync(self, fh, datasync):
        self.fs.fsync(fh)

    @functools.partial(_fuse_errors, keeps_claim=True)
    async def release(self, fh):
        """Close; after reads that may wait for the disk (large ones, or a CRC-checked
        mount's, on the loop or in worker threads), also give the heap's free pages
        back, at most once per TRIM_SECONDS: the daemon keeps freed buffers for the next
        read (mount.py's mallopt), and a reader done with a large file left a few MB of
        them resident for the life of the mount (2-3 MB after a ``tar`` of the
        small-files tree)."""
        self.fs.release(fh)
        if self._heavy_reads and self.trim_heap is not None \
                and time.monotonic() - self._trimmed_at >= TRIM_SECONDS:
            self._heavy_reads = False
            self._trimmed_at = time.monotonic()
            if self.gate is not None:
                self.gate.read_done()  # (no longer quick: another worker may read meanwhile)
            self.trim_heap()

    @_fuse_errors
    async def statfs(self, ctx):
        data = pyfuse3.StatvfsData()
        for key, value in self.fs.statfs().items():
            setattr(data, key, value)
        return data

    async def commit_periodically(self):
        """Commit at least every ``commit_interval`` seconds while there are changes."""
        while True:
            await trio.sleep(self.commit_interval)
            try:
                self.fs.commit()
            except FSError as exc:
                log.error("periodic commit failed: %s", exc)


def _forget_in_kernel(stale):
    """Invalidate the kernel's entries, attributes and pages of ``stale`` nodes (blocks:
    a worker thread's job). What the kernel never cached gives ENOENT, ignored."""
    for ino, parent, name in stale:
        if ino != pyfuse3.ROOT_INODE:
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_entry(parent, os.fsencode(name))
        with contextlib.suppress(OSError):
            pyfuse3.invalidate_inode(ino)


async def serve_loop(operations, target, on_mounted, max_tasks=99):
    """Run pyfuse3's loop until unmounted; SIGINT/SIGTERM end it. True if a signal did.
    ``max_tasks``: how many requests are answered at once (pyfuse3's tasks)."""
    import signal

    async def when_live():
        # Once FUSE_INIT is answered the mount is live and the kernel has set its
        # readahead, which we may now change. Nothing here touches the mount itself: a
        # request to our own mount (a stat from a worker thread) that this process is
        # killed while answering is never answered, and the kernel waits for it
        # uninterruptibly, so the process, /dev/fuse and the mount would hang for good.
        await operations.initialized.wait()
        set_readahead(target, operations.readahead_kb)
        if on_mounted is not None:
            on_mounted()

    async with trio.open_nursery() as nursery:
        stopped_by_signal = False

        async def watch_signals(task_status=trio.TASK_STATUS_IGNORED):
            nonlocal stopped_by_signal
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("%s received: unmounting", signal.Signals(signum).name)
                    stopped_by_signal = True
                    pyfuse3.terminate()
                    if operations.gate is not None:
                        operations.gate.close()
                    return

        operations.serving = True
        operations.initialized = trio.Event()
        await nursery.start(watch_signals)
        if target is not None:  # (None: a worker of several, on a mount already live)
            nursery.start_soon(when_live)
        if operations.fs.follows_changes:
            nursery.start_soon(operations.watch_for_changes)
        if operations.commit_interval:
            nursery.start_soon(operations.commit_periodically)
        await pyfuse3.main(max_tasks=max_tasks)
        nursery.cancel_scope.cancel()
    return stopped_by_signal


def set_readahead(target, kb):
    """Set the readahead of the mount at ``target`` (a resolved path) to ``kb`` KiB (root
    only; best effort).

    Nothing here may touch the mount point itself (stat, realpath): that would
    ask this very process, which is not serving requests yet. The device
    number comes from /proc/self/mountinfo instead.
    """
    try:
        with open("/proc/self/mountinfo") as f:
            devices = [line.split()[2] for line in f
                       if line.split()[4].replace("\\040", " ") == target]
        if devices:
            with open(f"/sys/class/bdi/{devices[-1]}/read_ahead_kb", "w") as f:
                f.write(str(kb))
    except OSError as exc:
        log.debug("readahead left as is: %s", exc)


@contextlib.contextmanager
def _stderr_captured():
    """What libfuse writes to file descriptor 2 meanwhile, as a function giving its lines:
    its reasons then reach the user inside one error line (or the log), not beside it."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)

        def lines():
            capture.seek(0)
            text = capture.read().decode("utf-8", "replace")
            return [line.strip() for line in text.splitlines() if line.strip()]
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def mount_session(operations, mountpoint, fuse_options):
    """Mount (pyfuse3.init); a refusal is a one-line CtdsfsError with libfuse's reasons."""
    with _stderr_captured() as libfuse_said:
        try:
            pyfuse3.init(operations, mountpoint, fuse_options)
        except RuntimeError as exc:  # pyfuse3 says only "fuse_session_mount failed"
            why = "; ".join(libfuse_said()) or str(exc)
            operations.fs.close()
            raise CtdsfsError(f"{mountpoint}: the kernel refused the mount ({why}): is /dev/fuse "
                              "there and usable, and may this user mount here?") from None
        warnings = libfuse_said()
    for line in warnings:
        log.warning("%s", line)


def serve(operations, mountpoint, fuse_options, on_mounted=None):
    """Mount, call ``on_mounted()`` once the mount answers requests, serve until unmount,
    commit."""
    target = os.path.realpath(mountpoint)  # resolved before it becomes our own mount
    mount_session(operations, mountpoint, fuse_options)
    operations.watch_device()
    unmount = True
    try:
        unmount = trio.run(serve_loop, operations, target, on_mounted)
    finally:
        pyfuse3.close(unmount=unmount)
        operations.fs.close()
