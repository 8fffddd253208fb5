"""What the tests of misbehaving servers share: a container to serve, the servers
(``hostile_http``), the options their mounts and clients use, and a way to run many
cases at once (most of them wait out a timeout)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from ctdsfs.toolbox import pack

from .hostile_http import HostileServer

CHUNK = 65536
TIMEOUT, RETRIES = 1.0, 1
OPTIONS = f"timeout={TIMEOUT:g},retries={RETRIES},chunk_size={CHUNK},readahead=2"
# (retries + 1) attempts of at most timeout * (1 + CHUNK / 1 MiB) s, the backoff between
# them, and some slack for a loaded machine
LIMIT = (RETRIES + 1) * TIMEOUT * (1 + CHUNK / (1 << 20)) + 0.2 + 3.5
FILE_SIZE = 256 * 600  # two files, so the second one's bytes lie past the first chunk


def each(cases, run):
    """``run(*case)`` for every case, a few at a time: ``{case: problems}`` of those with."""
    with ThreadPoolExecutor(4) as pool:
        found = dict(zip(cases, pool.map(lambda case: run(*case), cases)))
    return {case: problems for case, problems in found.items() if problems}


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """A MultiFile of two files (``first``, ``second``) with distinct bytes."""
    directory = tmp_path_factory.mktemp("hostile")
    tree = directory / "tree"
    tree.mkdir()
    contents = {"first": bytes(range(256)) * (FILE_SIZE // 256),
                "second": bytes(reversed(range(256))) * (FILE_SIZE // 256)}
    for name, data in contents.items():
        (tree / name).write_bytes(data)
    pack(str(tree), str(directory / "two.mf"), block_size=4096, quiet=True)
    return (directory / "two.mf").read_bytes(), contents


@pytest.fixture
def hostile():
    """``hostile(data, mode, ...) -> HostileServer``, each closed at teardown."""
    servers = []

    def make(data, mode, **kwargs):
        if mode == "redirect-port":
            kwargs["other_port"] = make(data, "honest").port
        servers.append(HostileServer(data, mode, **kwargs))
        return servers[-1]
    yield make
    for server in servers:
        server.close()
