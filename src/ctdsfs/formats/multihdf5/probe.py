"""Read an untrusted HDF5 file in a child process before the main process opens it.

The HDF5 C library can crash (a segmentation fault) or spin forever on
damaged bytes; in the daemon or a command that would end everything without a
message. So ``probe(path)`` has a child open the file the way ctdsfs does and
touch everything ctdsfs will (``probe_child``): the header attributes, every
listed group, each FileData's shape, type, layout and chunk index, nested
containers in turn, within the same bounds. A child killed by a signal refuses
the file in one line. The child reports its own verdict as one JSON line: a
refusal is passed on as it is. The children are forked from a server process
of this one (``probe_server``, started at the first probe and again after a
fork or its death), which has Python and h5py loaded already: a fresh
interpreter for every opened file cost more than the check itself.

A spinning HDF5 is stopped by CPU time, not by the clock, so that a damaged
file costs seconds on a loaded machine too: the child may spend at most
DEFAULT_CPU_SECONDS (or CTDSFS_HDF5_PROBE_CPU_SECONDS) of CPU time between
two HDF5 objects or entries it gets past (a valid one takes a millisecond or
so; closing a file of thousands of entries a fraction of a second), else the
kernel ends it (RLIMIT_CPU). DEFAULT_SECONDS of wall clock (or CTDSFS_HDF5_PROBE_SECONDS)
is the backstop for a child that waits instead of spinning; it is generous,
so that a large file on a busy machine is not refused.

This module is the parent's side and knows nothing of MultiHDF5 (which calls
it); the child's side, which opens the file as MultiHDF5, is ``probe_child``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading

from ...errors import FormatError
from ...remote.schemes import SPEC_ENV
from ...remote.wire import RemoteError

TIME_LIMIT_ENV = "CTDSFS_HDF5_PROBE_SECONDS"
DEFAULT_SECONDS = 60.0
CPU_LIMIT_ENV = "CTDSFS_HDF5_PROBE_CPU_SECONDS"
DEFAULT_CPU_SECONDS = 3.0
MEMORY_LIMIT = 4 << 30  # the child's address space: an allocation bomb fails there
SERVER_MODULE = f"{__package__}.probe_server"
ANSWER_LIMIT = 4 << 20  # a server's answer: the check's verdict and the tail of its errors


def _seconds(variable, default):
    try:
        return max(0.1, float(os.environ.get(variable, default)))
    except ValueError:
        return default


def time_limit():
    """Wall-clock seconds the child may take in all."""
    return _seconds(TIME_LIMIT_ENV, DEFAULT_SECONDS)


def cpu_limit():
    """CPU seconds the child may spend without getting past another HDF5 object."""
    return _seconds(CPU_LIMIT_ENV, DEFAULT_CPU_SECONDS)


class _Server:
    """This process's probe server: started when first needed, and again in a forked
    process (the parent's is not its child) or once the server is gone."""

    def __init__(self):
        self.lock = threading.Lock()
        self.control = None
        self.process = None
        self.cpu_seconds = 0.0  # spent by the checks answered so far

    def forget(self):
        """In a forked child: the parent's server is the parent's (its socket closed here,
        so that the server ends with the processes that use it)."""
        if self.control is not None:
            self.control.close()
        self.__init__()

    def _start(self):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        inherited = os.environ.get("PYTHONPATH")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",  # no threads
                   PYTHONPATH=os.pathsep.join(filter(None, [package_root, inherited])))
        env.pop(SPEC_ENV, None)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno())], env=env,
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.control = ours

    def ask(self, request):
        """The answer of a check of ``request`` (None: no server took it, or it died
        during the check; a timed-out one if no answer came in the check's time, as
        when the server is still starting on a loaded machine). A server found gone
        before it took the request is started again once; one that died during the
        check is not asked again, as the check's time is spent."""
        theirs, ours = socket.socketpair()
        try:
            with self.lock:
                for _ in range(2):
                    if self.process is not None and self.process.poll() is not None:
                        self.forget()
                    if self.control is None:
                        self._start()
                    try:
                        socket.send_fds(self.control, [json.dumps(request).encode()],
                                        [theirs.fileno()])
                        break
                    except OSError:
                        self.forget()
                else:
                    ours.close()
                    return None
        finally:
            theirs.close()
        with ours:
            ours.settimeout(request["seconds"] + 1)  # (the server kills it at "seconds")
            answer = bytearray()
            try:
                while chunk := ours.recv(65536):
                    answer += chunk
                    if len(answer) > ANSWER_LIMIT:
                        return None
            except TimeoutError:
                return {"timed_out": True, "signal": 0, "stdout": "", "stderr": "", "cpu": 0.0}
            except OSError:
                return None
        try:
            answer = json.loads(answer)
        except ValueError:
            return None
        with self.lock:
            self.cpu_seconds += answer["cpu"]
        return answer


_server = _Server()
os.register_at_fork(after_in_child=_server.forget)


def checks_cpu_seconds():
    """CPU seconds spent so far by this process's checks (they are not its children)."""
    return _server.cpu_seconds


def probe(path):
    """Refuse ``path`` (FormatError) if reading it crashes or hangs HDF5; else its problems.

    ``path`` may be a remote store: the child then reads the same version of the object
    (``remote.schemes.SPEC_ENV``), within the time the request that opens it has left,
    and a server that does not answer it is the server's failure (RemoteError: tried
    again at the next look), not the file's."""
    seconds, cpu_seconds = time_limit(), cpu_limit()
    remote = hasattr(path, "child_spec")
    if remote:
        seconds = max(0.1, min(seconds, path.time_left()))
    # The check runs with this process's environment of the moment (credentials a
    # library user set after the server started among it), not the server's.
    env = dict(os.environ)
    env.pop(SPEC_ENV, None)
    env[CPU_LIMIT_ENV] = repr(cpu_seconds)  # (the child and this message use the same)
    if remote:
        env[SPEC_ENV] = path.child_spec()
        path = path.label
    path = os.fspath(path)
    request = {"path": path, "env": env, "seconds": seconds}
    answer = _server.ask(request)
    if answer is None:
        raise FormatError(f"{path}: the HDF5 check process could not be started or "
                          "answered nothing")
    if answer["timed_out"]:
        if remote:
            raise RemoteError(f"{path}: not read whole within the request's {seconds:.1f} s "
                              "left while it was checked", "not read whole in time")
        raise FormatError(f"{path}: HDF5 did not finish reading it within {seconds:g} s: "
                          "damaged file")
    if answer["signal"] == signal.SIGXCPU:
        raise FormatError(f"{path}: HDF5 spent {cpu_seconds:g} s of CPU time reading it without "
                          "getting further: damaged file")
    if answer["signal"]:
        raise FormatError(f"{path}: HDF5 crashed (signal {answer['signal']}) while reading "
                          "it: damaged file")
    lines = answer["stdout"].splitlines()
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (answer["stderr"].strip().splitlines() or ["no output"])[-1]
        raise FormatError(f"{path}: the HDF5 check process failed ({last[:200]}): "
                          "damaged file") from None
    if "unanswered" in verdict:
        raise RemoteError(verdict["unanswered"], "the server did not answer its check")
    if "refused" in verdict:
        raise FormatError(verdict["refused"])
    return verdict["problems"]
