"""Read an untrusted HDF5 file in a child process before the main process opens it.

The HDF5 C library can crash (a segmentation fault) or spin forever on
damaged bytes; in the daemon or a command that would end everything without a
message. So ``probe(path)`` runs ``python3 -m ctdsfs.formats.multihdf5.probe_child PATH``
(a fresh process: forking the threaded daemon is unsafe), which opens the
file the way ctdsfs does and touches everything ctdsfs will: the header
attributes, every listed group, each FileData's shape, type, layout and chunk
index, nested containers in turn, within the same bounds. A child killed by a
signal refuses the file in one line. The child reports its own verdict as one
JSON line: a refusal is passed on as it is. A Python start and the h5py import
cost about 0.3 s per opened file.

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
import subprocess
import sys

from ...errors import FormatError
from ...remote.schemes import SPEC_ENV
from ...remote.wire import RemoteError

TIME_LIMIT_ENV = "CTDSFS_HDF5_PROBE_SECONDS"
DEFAULT_SECONDS = 60.0
CPU_LIMIT_ENV = "CTDSFS_HDF5_PROBE_CPU_SECONDS"
DEFAULT_CPU_SECONDS = 3.0
MEMORY_LIMIT = 4 << 30  # the child's address space: an allocation bomb fails there
CHILD_MODULE = f"{__package__}.probe_child"


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
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    inherited = os.environ.get("PYTHONPATH")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",  # a lighter start
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, inherited])))
    env.pop(SPEC_ENV, None)
    env[CPU_LIMIT_ENV] = repr(cpu_seconds)  # (the child and this message use the same)
    if remote:
        env[SPEC_ENV] = path.child_spec()
        path = path.label
    path = os.fspath(path)
    try:
        child = subprocess.run([sys.executable, "-m", CHILD_MODULE, path], env=env,
                               capture_output=True, timeout=seconds, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:  # (subprocess.run has killed the child)
        if remote:
            raise RemoteError(f"{path}: not read whole within the request's {seconds:.1f} s "
                              "left while it was checked", "not read whole in time") from None
        raise FormatError(f"{path}: HDF5 did not finish reading it within {seconds:g} s: "
                          "damaged file") from None
    if child.returncode == -signal.SIGXCPU:
        raise FormatError(f"{path}: HDF5 spent {cpu_seconds:g} s of CPU time reading it without "
                          "getting further: damaged file")
    if child.returncode < 0:
        raise FormatError(f"{path}: HDF5 crashed (signal {-child.returncode}) while reading "
                          "it: damaged file")
    lines = child.stdout.decode("utf-8", "replace").splitlines()
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (child.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise FormatError(f"{path}: the HDF5 check process failed ({last[:200]}): "
                          "damaged file") from None
    if "unanswered" in verdict:
        raise RemoteError(verdict["unanswered"], "the server did not answer its check")
    if "refused" in verdict:
        raise FormatError(verdict["refused"])
    return verdict["problems"]
