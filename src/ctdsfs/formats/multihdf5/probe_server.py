"""The process ``probe`` forks its checks from: Python, h5py and the MultiHDF5 reader
imported once, so that a check costs a fork instead of an interpreter's start.

Run as ``python3 -m ctdsfs.formats.multihdf5.probe_server FD`` by ``probe`` only. It is
single-threaded, so forking it is safe (forking the threaded daemon is not). Requests
arrive on the SEQPACKET socket FD, each one JSON message carrying the socket to answer
on and the environment to check with (its caller's). For each, a watcher is forked; it
forks the check (``probe_child.main``, reading the file under the probe's limits) and
answers with the check's exit status, output and CPU seconds once it ends, or kills it
at the request's deadline. The server ends when the last process holding the other end
of FD closes it.
"""

import json
import os
import select
import signal
import socket
import sys
import time
import traceback

from . import probe_child

OUTPUT_LIMIT = 1 << 20  # what a check may print; its verdict is one short line
REQUEST_LIMIT = 1 << 20  # a request: a path and an environment


def _check(request, out, err):
    """In the forked check: run it with the request's environment; never returns."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        code = probe_child.main(request["path"])
        sys.stdout.flush()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(code)


def _watch(request, reply_fd):
    """In a watcher (a fork of the server): fork the check, gather its output until it
    ends or the request's deadline passes (then kill it), and answer on ``reply_fd``."""
    reply = socket.socket(fileno=reply_fd)
    outputs = [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:
        reply.close()
        for read, _ in outputs:
            os.close(read)
        _check(request, outputs[0][1], outputs[1][1])
    for _, write in outputs:
        os.close(write)
    gathered = {read: bytearray() for read, _ in outputs}
    pending = set(gathered)
    deadline = time.monotonic() + request["seconds"]
    timed_out = False
    while pending:
        left = deadline - time.monotonic()
        ready = select.select(list(pending), [], [], left)[0] if left > 0 else []
        if not ready:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                pending.discard(fd)
            elif len(gathered[fd]) < OUTPUT_LIMIT:
                gathered[fd] += chunk
    _, status, usage = os.wait4(pid, 0)
    out, err = (bytes(gathered[read]).decode("utf-8", "replace") for read, _ in outputs)
    answer = {"timed_out": timed_out, "stdout": out, "stderr": err[-4000:],
              "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
              "cpu": usage.ru_utime + usage.ru_stime}
    reply.sendall(json.dumps(answer).encode())
    reply.close()


def serve(control):
    """Fork a watcher for each request on ``control`` until its other end closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # (watchers are reaped by the kernel)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, REQUEST_LIMIT, 1)
        except InterruptedError:
            continue
        if not message:
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (this one waits for its check)
            try:
                _watch(json.loads(message), fds[0])
            finally:
                os._exit(0)
        os.close(fds[0])


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
