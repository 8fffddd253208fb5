"""The decoded pieces the worker processes of a mount share (io/shared_arena.py, through
io/decoded_cache.py), with real forked processes: a piece is decoded once, a worker
killed while decoding or while holding the lock leaves nobody waiting, no reader sees
bytes of another piece (a piece served as a view of the arena is never written over
until its worker is done with it or dead), and the arena's bound holds."""

import hashlib
import json
import os
import signal
import time

import pytest

from ctdsfs.io import decoded_cache
from ctdsfs.io.decoded_cache import DecodedCache
from ctdsfs.io.shared_arena import SharedArena, digest_of

BOUND = 60  # seconds a child may take (a guard against hangs, not a speed check)


def _piece(key, size=4096):
    """The bytes of piece ``key``: only that piece's."""
    seed = hashlib.sha256(repr(key).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def arena():
    """A SharedArena the caches of this process and its forked children share."""
    made = SharedArena(4 << 20)
    made.attach()
    decoded_cache.share_through(made)
    yield made
    decoded_cache.share_through(None)


def _in_child(arena, work):
    """Fork a child (a worker using ``arena``) running ``work()``; returns (pid, the read
    end of a pipe carrying what ``work`` returned, as JSON)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            arena.attach()
            result = work()
            os.write(write_end, json.dumps(result).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def _result(pid, read_end):
    """What the child returned (it must end within BOUND seconds)."""
    deadline = time.monotonic() + BOUND
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "a child hung"
        time.sleep(0.01)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


def _reader(name, keys, pause=0.0):
    """A worker's reads: each key's piece through a cache of ``name``; returns whether
    every piece had its own bytes and which it decoded itself."""

    def work():
        cache = DecodedCache(1 << 20, name)
        decoded, right = [], True
        for key in keys:
            def load(key=key):
                decoded.append(key)
                time.sleep(pause)
                return _piece(key)
            right &= bytes(cache.get_or_load(key, ("identity", 1), load)) == _piece(key)
            decoded_cache._ARENA[0].unpin()  # (the request answered)
        return {"right": right, "decoded": decoded}
    return work


def test_parallel_workers_decode_each_piece_once(arena):
    """Four workers read the same 20 pieces in parallel, in turned orders: every piece is
    decoded by one of them once, and each gets every piece's own bytes."""
    keys = [f"piece {i}" for i in range(20)]
    children = [_in_child(arena, _reader("pieces", keys[k * 5:] + keys[:k * 5], pause=0.005))
                for k in range(4)]
    results = [_result(*child) for child in children]
    assert all(r["right"] for r in results)
    decoded = [key for r in results for key in r["decoded"]]
    assert sorted(decoded) == sorted(keys)
    assert arena.stats()["decoded"] == 20


def test_pieces_are_shared_by_name_key_and_identity_only(arena):
    """A cache without a name, a key that is not a plain value, another identity or
    another cache name: not the same piece."""
    assert digest_of("a", ("k", 1), (2, 3)) == digest_of("a", ("k", 1), (2, 3))
    assert digest_of("a", ("k", 1), (2, 3)) != digest_of("b", ("k", 1), (2, 3))
    assert digest_of("a", ("k", 1), (2, 4)) != digest_of("a", ("k", 1), (2, 3))
    assert digest_of("a", ("k", object()), 1) is None
    DecodedCache(1 << 20).get_or_load("k", 1, lambda: b"unnamed")
    DecodedCache(1 << 20, "one").get_or_load("k", 1, lambda: b"one")
    got = DecodedCache(1 << 20, "two").get_or_load("k", 1, lambda: b"two")
    assert bytes(got) == b"two"
    assert bytes(DecodedCache(1 << 20, "one").get_or_load("k", 1, lambda: b"again")) == b"one"
    assert arena.stats()["decoded"] == 2


def test_a_worker_killed_while_decoding_is_taken_over(arena):
    """A worker dies in the middle of decoding a piece another waits for: the waiter
    decodes it itself, at once, with the right bytes; the piece is then held."""
    read_end, write_end = os.pipe()
    stuck = os.fork()
    if stuck == 0:
        arena.attach()
        DecodedCache(1 << 20, "pieces").get_or_load(
            "slow", ("identity", 1), lambda: os.write(write_end, b"x") and time.sleep(3600))
        os._exit(0)
    os.read(read_end, 1)  # (it is decoding)
    waiter = _in_child(arena, _reader("pieces", ["slow"]))
    time.sleep(0.2)  # (the waiter waits for the decoding)
    os.kill(stuck, signal.SIGKILL)
    os.waitpid(stuck, 0)
    result = _result(*waiter)
    assert result == {"right": True, "decoded": ["slow"]}
    stats = arena.stats()
    assert stats["taken_over"] == 1 and stats["decoded"] == 2
    assert arena.held(digest_of("pieces", "slow", ("identity", 1)))


def test_a_worker_killed_holding_the_lock_leaves_the_arena_usable(arena):
    """A worker dies while holding the arena's lock, in the middle of changing the index:
    the next worker gets the lock, forgets what the index held (it may be torn), and
    the pieces are decoded and shared again."""
    assert _result(*_in_child(arena, _reader("pieces", ["a", "b"]))) == \
        {"right": True, "decoded": ["a", "b"]}
    read_end, write_end = os.pipe()
    holder = os.fork()
    if holder == 0:
        arena.attach()

        def torn():
            os.write(write_end, b"x")
            time.sleep(3600)
        arena._locked(torn)
        os._exit(0)
    os.read(read_end, 1)  # (it holds the lock, the index marked as being changed)
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    assert _result(*_in_child(arena, _reader("pieces", ["a", "b", "c"]))) == \
        {"right": True, "decoded": ["a", "b", "c"]}
    assert _result(*_in_child(arena, _reader("pieces", ["a", "b", "c"]))) == \
        {"right": True, "decoded": []}
    assert arena.stats()["forgotten"] == 1


def test_a_worker_stalled_holding_the_lock_or_decoding_does_not_stall_the_others(arena):
    """A worker stopped (not dead) while it holds the arena's lock, then one stopped in
    the middle of a decoding: the others do without the arena (or that piece) after a
    bounded wait, and get the right bytes."""
    read_end, write_end = os.pipe()
    holder = os.fork()
    if holder == 0:
        arena.attach()
        arena._locked(lambda: os.write(write_end, b"x") and os.kill(os.getpid(),
                                                                   signal.SIGSTOP))
        os._exit(0)
    os.read(read_end, 1)
    try:
        assert _result(*_in_child(arena, _reader("pieces", ["a"]))) == \
            {"right": True, "decoded": ["a"]}
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    stuck = os.fork()
    if stuck == 0:
        arena.attach()
        DecodedCache(1 << 20, "pieces").get_or_load(
            "slow", 0, lambda: os.write(write_end, b"x") and os.kill(os.getpid(),
                                                                    signal.SIGSTOP))
        os._exit(0)
    os.read(read_end, 1)
    try:
        waiter = _in_child(arena, lambda: bytes(DecodedCache(1 << 20, "pieces").get_or_load(
            "slow", 0, lambda: b"decoded alone")).decode())
        assert _result(*waiter) == "decoded alone"
    finally:
        os.kill(stuck, signal.SIGKILL)
        os.waitpid(stuck, 0)


def test_the_bound_holds_and_no_reader_sees_another_pieces_bytes(arena):
    """Workers read 400 pieces of 64 KiB at random through an arena of 4 MiB, so that
    pieces are dropped and their bytes written over all the time: every read gives the
    piece's own bytes, and the arena never holds more than its bound."""
    import random

    def work(seed):
        def run():
            cache = DecodedCache(256 << 10, "churn")  # (a worker's own: 4 pieces)
            rng = random.Random(seed)
            wrong = 0
            for _ in range(600):
                key = f"piece {rng.randrange(400)}"
                got = cache.get_or_load(key, 0, lambda key=key: _piece(key, 64 << 10))
                wrong += bytes(got) != _piece(key, 64 << 10)
                arena.unpin()
            return wrong
        return run
    children = [_in_child(arena, work(seed)) for seed in range(4)]
    assert [_result(*child) for child in children] == [0, 0, 0, 0]
    stats = arena.stats()
    assert 0 < stats["bytes"] <= 4 << 20
    assert stats["decoded"] > 400  # (pieces were dropped and decoded again)


def test_a_piece_too_large_for_the_arena_stays_with_its_decoder(arena):
    """A piece larger than a quarter of the arena is not shared (it would push out
    everything else): each worker decodes it for itself."""
    def work():
        cache = DecodedCache(4 << 20, "large")
        return len(cache.get_or_load("large", 0, lambda: bytes(2 << 20)))
    assert [_result(*_in_child(arena, work)) for _ in range(2)] == [2 << 20, 2 << 20]
    assert arena.stats()["bytes"] == 0


def _fill(arena, name, count, size=512 << 10):
    """A worker's work: ``count`` pieces of ``size`` decoded and shared, each request
    answered (unpinned) before the next; the keys it decoded."""
    def work():
        cache = DecodedCache(1 << 20, name)
        decoded = []
        for i in range(count):
            key = f"{name} {i}"
            cache.get_or_load(key, 0, lambda key=key: decoded.append(key) or _piece(key, size))
            arena.unpin()
        return decoded
    return work


def _killed_after(arena, step):
    """A worker that does ``step`` and is then killed (SIGKILL) before doing more."""
    read_end, write_end = os.pipe()
    worker = os.fork()
    if worker == 0:
        arena.attach()
        step()
        os.write(write_end, b"x")
        time.sleep(3600)
        os._exit(0)
    os.read(read_end, 1)
    os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)


def test_a_piece_served_is_never_written_over_while_its_worker_may_use_it(arena):
    """A worker serves a piece as a view of the arena and has not answered yet (pinned):
    another worker then decodes pieces enough to go round the ring twice; the view still
    holds the piece's bytes (the pieces whose place it was were kept by their decoder,
    not shared). Once the worker is done (unpinned), the place is taken again."""
    cache = DecodedCache(1 << 20, "pinned")
    view = cache.get_or_load("served", 0, lambda: _piece("served", 512 << 10))
    view = cache.get("served", 0)  # (now a view of the arena, pinned)
    assert isinstance(view, memoryview) and bytes(view) == _piece("served", 512 << 10)
    assert len(_result(*_in_child(arena, _fill(arena, "others", 16)))) == 16
    assert bytes(view) == _piece("served", 512 << 10)
    assert arena.stats()["kept"] >= 2
    arena.unpin()
    kept = arena.stats()["kept"]
    assert len(_result(*_in_child(arena, _fill(arena, "more", 16)))) == 16
    assert arena.stats()["kept"] == kept
    assert not arena.held(digest_of("pinned", "served", 0))


def test_the_pins_of_a_worker_that_died_hold_nothing(arena):
    """A worker killed while it serves a view of a piece (pinned): the others write over
    its place as if it were not pinned."""
    def serve():
        cache = DecodedCache(1 << 20, "pinned")
        cache.get_or_load("served", 0, lambda: _piece("served", 512 << 10))
        cache.get("served", 0)

    _killed_after(arena, serve)
    assert len(_result(*_in_child(arena, _fill(arena, "others", 16)))) == 16
    assert arena.stats()["kept"] == 0


def test_pieces_side_by_side_in_the_arena_are_served_as_one_view(arena):
    """Two pieces decoded one after the other lie side by side in the ring: a read
    across both gets one view of them (no copy); pieces apart get None (a copy)."""
    cache = DecodedCache(1 << 20, "side")
    for key in ("a", "b", "c"):
        cache.get_or_load(key, 0, lambda key=key: _piece(key, 64 << 10))
    a, b, c = (cache.get(key, 0) for key in ("a", "b", "c"))
    assert bytes(cache.joined([a, b])) == _piece("a", 64 << 10) + _piece("b", 64 << 10)
    assert cache.joined([a, c]) is None
    assert cache.joined([memoryview(_piece("a", 64 << 10)), b]) is None


def test_a_piece_that_fails_to_decode_fails_for_every_worker_and_the_others_are_shared(arena):
    """A damaged piece (its decoding raises) while another worker waits for it: each
    worker gets the error for that piece alone, nothing of it is held, and a healthy
    piece read beside it is decoded once and shared."""
    from ctdsfs.errors import BlockError

    def work():
        cache = DecodedCache(1 << 20, "damaged")
        failed = []
        try:
            cache.get_or_load("bad", 0, lambda: time.sleep(0.2) or (_ for _ in ()).throw(
                BlockError("tile 3: bad checksum")))
        except BlockError as exc:
            failed.append(str(exc))
        good = bytes(cache.get_or_load("good", 0, lambda: _piece("good"))) == _piece("good")
        arena.unpin()
        return {"failed": failed, "good": good}
    children = [_in_child(arena, work) for _ in range(3)]
    assert [_result(*child) for child in children] == \
        [{"failed": ["tile 3: bad checksum"], "good": True}] * 3
    assert not arena.held(digest_of("damaged", "bad", 0))
    assert arena.held(digest_of("damaged", "good", 0))
    assert arena.stats()["decoded"] == 3 + 1  # (each worker tried the bad one; the good once)


def test_a_worker_killed_while_filling_a_place_leaves_it_to_the_others(arena):
    """A worker dies after taking a piece's place in the ring, before its bytes are all
    there: nobody is served the piece's bytes from that place, the others write over it
    as over any other (no piece kept for it), and a reader of the piece decodes it."""
    def fill():
        digest = digest_of("filled", "torn", 0)
        _, (_, generation, _) = arena.look(digest)
        arena._locked(arena._place, digest, generation, 512 << 10)

    _killed_after(arena, fill)
    assert len(_result(*_in_child(arena, _fill(arena, "others", 16)))) == 16
    assert arena.stats()["kept"] == 0
    reader = _in_child(arena, lambda: bytes(DecodedCache(1 << 20, "filled").get_or_load(
        "torn", 0, lambda: b"decoded again")).decode())
    assert _result(*reader) == "decoded again"
