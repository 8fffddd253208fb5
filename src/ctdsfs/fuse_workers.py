"""A read-only mount served by several processes on one FUSE connection (``-o workers=N``).

One pyfuse3+trio process answers one request at a time on one core; several
processes answer several at once, and decode on several cores. The daemon mounts,
answers the kernel's INIT itself (libfuse refuses every other request of a session
that has not seen it), and forks the workers. Each worker gives itself a descriptor
of its own on the connection (``FUSE_DEV_IOC_CLONE`` of the session's, put in its
place): the kernel sends the answer to a request through the descriptor that read
it, so a worker that dies takes with it only the requests it was answering, which
fail (ECONNABORTED) instead of hanging their readers. The daemon stays as the
workers' supervisor: it starts another in place of one that died, ends the mount
(ENOTCONN) if they keep dying, and unmounts on SIGTERM/SIGINT.

The kernel wakes every process that polls /dev/fuse for each request, but only
one of those waiting in ``epoll_wait`` on a descriptor registered with
``EPOLLEXCLUSIVE``: each worker waits so, on its loop, for one request at a time
(``Gate``), so a request wakes one idle worker, and a busy worker is never woken.
The kernel wakes the idle worker that registered first, so a lone reader is answered
by one worker, as by one process; the readahead the kernel sends beside it, and other
readers, go to the next idle ones.

Every worker answers alike: inode numbers come from a table they share
(``vfs.shared_inodes``), and a handle is its inode number. The workers decode a piece
(a TileDB tile, a bcolz chunk) once for the mount, whichever worker a reader's requests
reach, and serve it from the pages of an arena made before the fork
(``io.shared_arena``): each worker is done with the pieces it served once it waits
for its next request.
"""

import contextlib
import fcntl
import logging
import os
import select
import signal
import struct
import time

import pyfuse3
import trio

from .fuse_adapter import mount_session, serve_loop, set_readahead
from .io import decoded_cache
from .io.shared_arena import SharedArena
from .vfs.filesystem import ROOT_INO, FSError
from .vfs.shared_inodes import SharedInodes

log = logging.getLogger(__name__)

# _IOR(229, 0, uint32_t): make the new /dev/fuse descriptor one of the given one's session.
FUSE_DEV_IOC_CLONE = 0x8004E500
STOPPED_BY_SIGNAL = 3  # a worker's exit status after SIGTERM/SIGINT: the mount is ending
# More deaths than this (per worker) within DEATH_WINDOW seconds end the mount.
DEATHS_PER_WORKER = 2
DEATH_WINDOW = 60.0
STOP_SECONDS = 10.0  # a worker still there this long after SIGTERM is killed
SUPERVISOR_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
IDLE_POLL_SECONDS = 0.1
# Longest a worker answering request after request lets its other tasks (signals) wait.
SCHEDULE_SECONDS = 0.02
SPIN_SECONDS = 0.001  # longest a worker waits awake for another to read the request it claimed


class Gate:
    """A worker's wait before pyfuse3 reads /dev/fuse: in ``epoll_wait``, registered
    exclusively, so that the kernel wakes one idle worker per request. The wait blocks
    the worker's loop (it answers one request at a time) but not its threads; it wakes
    every IDLE_POLL_SECONDS so that the loop sees signals and the end of the mount.

    The kernel may still wake two workers for one request (a worker coming back to wait
    finds a request another was woken for). The descriptor blocks, and pyfuse3 reads it
    holding the GIL, so a worker that read nothing would stall its own threads until the
    next request: a woken worker claims the read (an ``flock`` the workers share, held
    from its check that a request waits until the request is read) and reads only if
    one still waits. A worker that finds the claim held does not sleep on it: it waits
    again, awake (the request still waits until the claimer has read it, then its wait
    returns at once if another waits too, or sleeps), as sleeping on the lock until it
    was given back cost a sleep and a wake for most requests of a lone reader; only a
    claimer that has not read its request within SPIN_SECONDS is slept on. A request
    answered without letting go of the claim (a close, which the kernel sends beside a
    walker's next request) leaves its worker to take the request that waits: the walker
    stays with the worker that has its directories, and no other is woken for it.

    The loop does not pass through trio's scheduler between an answer and the wait (but
    once every SCHEDULE_SECONDS, for its other tasks): the sooner the worker that answered
    waits again, the likelier it is that a lone reader's next request finds it waiting,
    rather than waking another worker. So an answer starts nothing on the loop that must
    run soon."""

    def __init__(self, device_fd, claim_fd, arena):
        self.device_fd = device_fd
        self._arena = arena
        self._claim_fd = claim_fd
        self._claimed = False
        self._closed = False
        self._scheduled_at = time.monotonic()
        self._epoll = select.epoll()
        self._epoll.register(device_fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        self._waiting = select.poll()
        self._waiting.register(device_fd, select.POLLIN)

    async def wait_readable(self, fd):
        if fd != self.device_fd:
            return await trio.lowlevel.wait_readable(fd)
        self._arena.unpin()  # (the answer before is written: the kernel has its bytes)
        if time.monotonic() - self._scheduled_at >= SCHEDULE_SECONDS:
            self._scheduled_at = time.monotonic()
            await trio.lowlevel.checkpoint()
        if self._claimed and self._waiting.poll(0):
            return  # (a quick answer kept the claim, and a request waits: it is ours)
        self.read_done()
        spinning_since = None
        while not self._closed:
            if self._epoll.poll(IDLE_POLL_SECONDS):
                try:
                    fcntl.flock(self._claim_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # (another is reading a request: see the docstring)
                    now = time.monotonic()
                    spinning_since = spinning_since or now
                    if now - spinning_since < SPIN_SECONDS:
                        os.sched_yield()
                        continue
                    fcntl.flock(self._claim_fd, fcntl.LOCK_EX)  # (a claimer this slow:
                    # stopped, or off the cores; sleeping costs less than spinning)
                spinning_since = None
                if self._waiting.poll(0):
                    self._claimed = True
                    return
                fcntl.flock(self._claim_fd, fcntl.LOCK_UN)
            await trio.lowlevel.checkpoint()
        raise trio.ClosedResourceError  # (pyfuse3's loop ends)

    def read_done(self):
        """The request claimed is read (its answer starts): another worker may read."""
        if self._claimed:
            self._claimed = False
            fcntl.flock(self._claim_fd, fcntl.LOCK_UN)

    def close(self):
        """The worker stops (pyfuse3.terminate): its wait ends at its next wake."""
        self._closed = True


class _Lowlevel:
    def __init__(self, wait_readable):
        self.wait_readable = wait_readable

    def __getattr__(self, name):
        return getattr(trio.lowlevel, name)


class _Unshared:
    """The lock pyfuse3 takes around its wait for the descriptor. Its loop is one task
    here (the daemon's, then each worker's: pyfuse3 makes the lock once, in the daemon),
    so nobody else takes it, and it need not pass through trio's scheduler as
    ``trio.Lock`` does: that pass, at every request, kept the worker that had just
    answered out of its wait when the reader's next request came."""

    async def __aenter__(self):
        pass

    async def __aexit__(self, *exc):
        pass


class _TrioWaitingWith:
    """What pyfuse3 sees as ``trio``: trio itself, but for the wait before each read and
    the lock around it (pyfuse3's loop is given one task)."""

    Lock = _Unshared

    def __init__(self, wait_readable):
        self.lowlevel = _Lowlevel(wait_readable)

    def __getattr__(self, name):
        return getattr(trio, name)


def _until_init(operations):
    """The wait while the daemon answers INIT: pyfuse3's loop ends (as if the descriptor
    were closed) once INIT is answered, before it reads another request."""

    async def wait_readable(fd):
        if operations.initialized.is_set():
            raise trio.ClosedResourceError
        await trio.lowlevel.wait_readable(fd)
    return wait_readable


async def _answer_init(operations, target):
    operations.initialized = trio.Event()
    await pyfuse3.main(max_tasks=1)
    set_readahead(target, operations.readahead_kb)


def _session_fd():
    """pyfuse3's /dev/fuse descriptor (pyfuse3 does not say which it opened)."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
    raise OSError("no /dev/fuse descriptor after the mount")


def _worker(operations, device_fd, claim_file, table, arena, blocked):
    """A worker's life, in the forked child: a descriptor of its own, then serve."""
    status = 1
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        clone = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        fcntl.ioctl(clone, FUSE_DEV_IOC_CLONE, struct.pack("I", device_fd))
        os.dup2(clone, device_fd, inheritable=False)
        os.close(clone)
        table.after_fork()
        arena.attach()
        claim_fd = os.open(f"/proc/self/fd/{claim_file}", os.O_RDONLY | os.O_CLOEXEC)
        operations.gate = gate = Gate(device_fd, claim_fd, arena)
        pyfuse3.trio = _TrioWaitingWith(gate.wait_readable)
        stopped = trio.run(serve_loop, operations, None, None, 1)
        status = STOPPED_BY_SIGNAL if stopped else 0
    except BaseException:
        log.exception("worker %d failed", os.getpid())
    finally:
        with contextlib.suppress(BaseException):
            operations.fs.close()
        logging.shutdown()
        os._exit(status)


class _Supervisor:
    def __init__(self, count, start):
        self.count = count
        self._start = start
        self.pids = set()
        self._deaths = []  # monotonic times of deaths
        self.stopping = False

    def start_all(self):
        for _ in range(self.count):
            self.pids.add(self._start())

    def reap(self):
        """Collect the workers that ended; True once the mount should end."""
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.pids.clear()
                break
            if pid == 0:
                break
            if pid not in self.pids:
                continue
            self.pids.discard(pid)
            self._ended(pid, status)
        return not self.pids or self.stopping

    def _ended(self, pid, status):
        code = os.waitstatus_to_exitcode(status)
        if self.stopping or code == 0:
            return  # the mount ends (unmounted, or stopping)
        if code == STOPPED_BY_SIGNAL:
            log.info("worker %d was stopped by a signal: unmounting", pid)
            self.stopping = True
            return
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < DEATH_WINDOW] + [now]
        if len(self._deaths) > DEATHS_PER_WORKER * self.count:
            log.error("worker %d died (%s), the requests it was answering failed; %d "
                      "workers died within %.0f s: ending the mount", pid, why,
                      len(self._deaths), DEATH_WINDOW)
            self.stopping = True
            return
        log.error("worker %d died (%s), the requests it was answering failed "
                  "(ECONNABORTED); starting another", pid, why)
        self.pids.add(self._start())

    def stop(self):
        """SIGTERM the workers left, SIGKILL those still there STOP_SECONDS later."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        while self.pids:
            self.reap()
            if time.monotonic() > deadline:
                for pid in self.pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.01)


def _learn_the_root(fs):
    """Before the fork, what the kernel's first request (the root's attributes) costs:
    the top's nested containers opened and its entries told apart (the root's link
    count). Done once here, every worker has it; else each worker would do it again
    when a walk's requests reach it."""
    try:
        fs.getattr(ROOT_INO)
    except FSError:
        pass  # (the worker that answers the kernel's own request says why)


def serve_workers(operations, mountpoint, fuse_options, on_mounted=None, *, count,
                  decoded=False):
    """Like ``fuse_adapter.serve``, for a read-only mount served by ``count`` workers:
    mount, answer INIT, call ``on_mounted()``, fork the workers, supervise them until
    the mount ends. ``decoded``: the mount shows decoded views (their arena's pages are
    made before the workers start)."""
    target = os.path.realpath(mountpoint)  # resolved before it becomes our own mount
    mount_session(operations, mountpoint, fuse_options)
    table = SharedInodes(ROOT_INO + 1)
    operations.fs.share_inodes(table)
    arena = SharedArena(decoded_cache.ARENA_BYTES, populate=decoded)
    decoded_cache.share_through(arena)
    claim_file = os.memfd_create("ctdsfs-claim", os.MFD_CLOEXEC)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
    supervisor = None
    try:
        device_fd = _session_fd()
        pyfuse3.trio = _TrioWaitingWith(_until_init(operations))
        trio.run(_answer_init, operations, target)
        pyfuse3.trio = trio

        def start():
            pid = os.fork()
            if pid == 0:
                _worker(operations, device_fd, claim_file, table, arena, blocked)
            return pid

        if on_mounted is not None:
            on_mounted()  # (live: what the kernel sends meanwhile waits for the workers)
        _learn_the_root(operations.fs)
        supervisor = _Supervisor(count, start)
        supervisor.start_all()
        log.debug("serving with %d worker processes: %s", count,
                 " ".join(map(str, sorted(supervisor.pids))))
        while not supervisor.reap():
            signum = signal.sigwaitinfo(SUPERVISOR_SIGNALS).si_signo
            if signum != signal.SIGCHLD:
                log.info("%s received: unmounting", signal.Signals(signum).name)
                supervisor.stopping = True
    finally:
        pyfuse3.trio = trio
        # Unmounted already if every worker ended by itself (the kernel's ENODEV).
        pyfuse3.close(unmount=supervisor is None or supervisor.stopping)
        if supervisor is not None:
            supervisor.stop()
            arena.attach()
            stats = arena.stats()
            if stats is not None:
                log.info("decoded pieces the workers shared: %(decoded)d decoded, %(served)d "
                         "served from the arena, %(taken_over)d decodings taken over from a "
                         "worker that died, %(kept)d kept by their decoder (their place "
                         "pinned), %(bytes)d bytes held", stats)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if supervisor is None:
            operations.fs.close()
        # (else the workers closed theirs; the daemon's has read nothing since they forked,
        # and closing it would write the index of plain files over what they learned)
