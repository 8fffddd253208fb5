"""The process the HDF5 checks are forked from: it serves threads at once, comes back
after it died or its process forked, survives the checks that crash, and ends with the
processes that use it."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ctdsfs.errors import CtdsfsError
from ctdsfs.formats.multihdf5 import probe

from ...conftest import DATA
from .test_multihdf5_trust import CRASH_FLIP, flipped

GOOD = DATA / "mh5_basic.mfh5"


def _server_pid():
    return probe._server.process.pid


def _gone(pid, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_threads_checking_at_once_each_get_their_own_verdict(tmp_path):
    bad = flipped(tmp_path, CRASH_FLIP)

    def check(path):
        try:
            return probe.probe(path)
        except CtdsfsError as exc:
            return str(exc)

    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(check, [GOOD, bad] * 8))
    assert verdicts[0::2] == [[]] * 8
    assert verdicts[1::2] == [f"{bad}: HDF5 crashed (signal 11) while reading it: damaged "
                              "file"] * 8


def test_a_killed_server_is_started_again(tmp_path):
    assert probe.probe(GOOD) == []
    first = _server_pid()
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    assert probe.probe(GOOD) == []
    assert _server_pid() != first


def test_a_forked_process_checks_with_a_server_of_its_own():
    assert probe.probe(GOOD) == []
    parents = _server_pid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (a daemon's worker is a fork of the process that mounted)
        try:
            verdict = probe.probe(GOOD)
            os.write(write, json.dumps([verdict, _server_pid()]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        verdict, childs = json.loads(f.read())
    os.waitpid(pid, 0)
    assert verdict == [] and childs != parents
    assert _gone(childs)  # (it ended with the forked process)
    assert probe.probe(GOOD) == [] and _server_pid() == parents


@pytest.mark.parametrize("ending", ["exit", "SIGKILL"])
def test_the_server_ends_with_the_process_that_started_it(ending):
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from ctdsfs.formats.multihdf5 import probe\n"
        f"assert probe.probe({str(GOOD)!r}) == []\n"
        "print(probe._server.process.pid, flush=True)\n"
        f"time.sleep({0 if ending == 'exit' else 60})\n")], stdout=subprocess.PIPE, text=True)
    server = int(child.stdout.readline())
    if ending == "SIGKILL":
        child.kill()
    child.wait(timeout=30)
    assert _gone(server)
