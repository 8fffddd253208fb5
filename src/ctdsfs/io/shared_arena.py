"""Decoded pieces shared by the worker processes of one mount (``-o workers=N``).

The kernel hands a reader's requests to whichever worker is idle, readahead beside
them, so without a cache they share, the workers would each decode the same chunks.
The arena is an anonymous shared file made before the workers fork: an index of pieces
(a hash table of digests of what the piece is, with a first-in first-out queue of the
ones held), and a ring of their bytes, bounded for the mount as a whole. Reads are
served from the ring's pages themselves: a worker hands the kernel a view of the piece,
so serving a shared piece costs what serving one of its own does.

- **One lock**, ``flock`` on each worker's own opening of the file, so a worker killed
  while holding it frees it. The index is marked dirty while a holder changes it: the
  next holder finding it dirty forgets every piece (the cache starts empty again).
- **One decoding of a piece for the mount.** A worker about to decode a piece enters it
  as being decoded, holding a lock on a byte of its own (an open file description's
  lock, ``F_OFD_SETLK``, freed by the kernel if its holder dies); a worker wanting
  the piece meanwhile waits for that byte, then looks again: the piece is there, or
  its decoder gave up (the waiter decodes it), or died (the waiter takes it over).
- **No torn or recycled bytes.** A piece is copied into the ring under the lock. A
  worker serving a view of a piece pins its place in the ring (in a slot of the worker's
  own, under the lock) until it waits for its next request, when the kernel has copied
  what it was handed; a place pinned is never written over: a worker that would need
  it keeps the piece it decoded to itself instead. A slot whose
  worker died (its byte's lock gone) pins nothing. A thread that is not the worker's
  loop gets a copy, checked to be of a piece still entered once made.
- **Patience.** A worker stalled without dying (a thread of its process keeping the
  interpreter's lock while it blocks) holds the others up for LOCK_PATIENCE (the lock)
  or DECODE_PATIENCE (a decoding) at most; then they do without the arena.
"""

import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time

# dirty, next generation, ring head, queue first, queue end, index slots used (gone ones
# too), decoded, served, taken over, forgotten (times the index was emptied), kept (pieces
# not shared: their place was pinned)
HEADER = struct.Struct("<11Q")
DIRTY, GENERATION, HEAD, FIRST, END, USED, DECODED, SERVED, TAKEN_OVER, FORGOTTEN, \
    KEPT = range(11)
ENTRY = struct.Struct("<16sIIQQQ")  # digest, state, loader byte, generation, offset, length
EMPTY, DECODING, HELD, GONE = range(4)
QUEUED = struct.Struct("<IQ")  # entry index, its generation (an entry since replaced: stale)
ENTRIES = 8192  # index slots (a power of two); crowded with gone ones: emptied
LOADERS = 1024  # bytes locked by the workers decoding (one each per piece being decoded)
PIN_SLOTS = 128  # processes that may pin pieces (a slot each, taken by ``attach``)
PINS = 8  # pieces a worker may pin at once (one request's); more are copied
PIN = struct.Struct("<QQ")  # a pinned piece's place in the ring: offset + 1, length
LOCK_BASE = 1 << 40  # where in the file the locked bytes are (nothing is stored there):
PIN_BYTES = LOADERS  # the loaders' first, then the pin slots' (each locked by its worker)
PIECE_SHARE = 4  # a piece larger than the ring over this is not shared
WAIT_STEPS = 64  # looks again after a wait before giving up and decoding without the arena
# Seconds a worker waits for the lock, or for another's decoding, before it does without
# the arena: a holder may be stalled without dying, and the others must not stall with it.
LOCK_PATIENCE = 1.0
DECODE_PATIENCE = 5.0
PAUSE_MAX = 250e-6  # the longest pause between two looks at a lock (a waiter's latency)


class ArenaBusy(Exception):
    """The arena's lock was not had within LOCK_PATIENCE."""


class SharedArena:
    """The arena of one mount; each process that uses it calls ``attach`` first."""

    def __init__(self, capacity, populate=False):
        """``populate``: the ring's pages are made now and mapped by each worker as it
        attaches (a mount of decoded views: its readers do not fault them in, a page at
        a time, while they read)."""
        self.capacity = capacity
        self._populate = populate
        self._index_at = HEADER.size
        self._queue_at = self._index_at + ENTRIES * ENTRY.size
        self._pins_at = self._queue_at + ENTRIES * QUEUED.size
        self._data_at = -(-(self._pins_at + PIN_SLOTS * PINS * PIN.size) // mmap.PAGESIZE) \
            * mmap.PAGESIZE
        self._fd = os.memfd_create("ctdsfs-decoded", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, self._data_at + capacity)
        if populate:
            os.posix_fallocate(self._fd, 0, self._data_at + capacity)
        self._map = mmap.mmap(self._fd, self._data_at + capacity, mmap.MAP_SHARED)
        self._view = memoryview(self._map)
        self._thread_lock = threading.Lock()
        self._lock_fd = None
        self._pin_slot = None  # (this process's pin slot, the opening that locks its byte)
        self._pinned_since_unpin = False  # (else a request's end has nothing to clear)
        self._next_loader = os.getpid() % LOADERS

    def attach(self):
        """A lock of this process's own (an opening of the file ``flock`` tells from the
        other processes'), and a pin slot: in each worker after the fork."""
        self._lock_fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)
        self._next_loader = os.getpid() % LOADERS
        self._pin_slot = None
        if self._populate:  # (the parent's mapping stays too: nothing is copied)
            self._map = mmap.mmap(self._fd, self._data_at + self.capacity,
                                  mmap.MAP_SHARED | mmap.MAP_POPULATE)
            self._view = memoryview(self._map)
        fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
        for slot in range(PIN_SLOTS):
            try:
                _ofd_lock(fd, fcntl.F_WRLCK, PIN_BYTES + slot, wait=False)
            except OSError:
                continue
            self._clear_pins(slot)
            self._pin_slot = slot, fd
            return
        os.close(fd)  # (every slot taken: this process copies what it serves)

    # -- the header and the index, lock held

    def _get(self, field):
        return struct.unpack_from("<Q", self._map, field * 8)[0]

    def _set(self, field, value):
        struct.pack_into("<Q", self._map, field * 8, value)

    def _add(self, field, count=1):
        self._set(field, self._get(field) + count)

    def _locked(self, function, *args):
        """``function(*args)`` under the lock; ArenaBusy if it is not had in time (or this
        process never attached: it does without the arena)."""
        if self._lock_fd is None or not self._thread_lock.acquire(timeout=LOCK_PATIENCE):
            raise ArenaBusy
        try:
            if not _patiently(lambda: fcntl.flock(self._lock_fd,
                                                  fcntl.LOCK_EX | fcntl.LOCK_NB), LOCK_PATIENCE):
                raise ArenaBusy
            try:
                if self._get(DIRTY):
                    self._forget()  # (its last holder died while changing it)
                self._set(DIRTY, 1)
                result = function(*args)
                self._set(DIRTY, 0)
                return result
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _forget(self):
        """Empty the index (the bytes stay, unreachable; decoders in flight find their
        entries gone and keep their pieces to themselves). Pins stay: the pieces they
        pin keep their places until their workers are done with them."""
        self._map[self._index_at:self._queue_at] = bytes(self._queue_at - self._index_at)
        for field in (FIRST, END, USED):
            self._set(field, 0)
        self._add(FORGOTTEN)

    def _entry(self, slot):
        return ENTRY.unpack_from(self._map, self._index_at + slot * ENTRY.size)

    def _put_entry(self, slot, *fields):
        ENTRY.pack_into(self._map, self._index_at + slot * ENTRY.size, *fields)

    def _find(self, digest):
        """``(slot of the digest's entry or None, first free slot or None)``."""
        free = None
        slot = int.from_bytes(digest[:8], "little") % ENTRIES
        for _ in range(ENTRIES):
            found, state = ENTRY.unpack_from(self._map, self._index_at + slot * ENTRY.size)[:2]
            if state == EMPTY:
                return None, slot if free is None else free
            if state == GONE:
                free = slot if free is None else free
            elif found == digest:
                return slot, free
            slot = (slot + 1) % ENTRIES
        return None, free

    # -- pins

    def _pins(self, slot):
        """The places ``(offset, length)`` pinned in a slot (free places: None)."""
        at = self._pins_at + slot * PINS * PIN.size
        return [(offset - 1, length) if offset else None
                for offset, length in PIN.iter_unpack(self._map[at:at + PINS * PIN.size])]

    def _clear_pins(self, slot):
        at = self._pins_at + slot * PINS * PIN.size
        self._map[at:at + PINS * PIN.size] = bytes(PINS * PIN.size)

    def _pin(self, offset, length):
        """Pin a piece's place for this process's loop (lock held); False if it cannot
        (another thread, or every place of the slot taken)."""
        if self._pin_slot is None or threading.current_thread() is not threading.main_thread():
            return False
        slot = self._pin_slot[0]
        pins = self._pins(slot)
        if (offset, length) in pins:
            return True
        if None not in pins:
            return False
        PIN.pack_into(self._map, self._pins_at + (slot * PINS + pins.index(None)) * PIN.size,
                      offset + 1, length)
        self._pinned_since_unpin = True
        return True

    def unpin(self):
        """This process is done with the views it served (the kernel copied them): its
        pieces may be written over. Called by the worker's loop between requests."""
        if self._pinned_since_unpin:
            self._pinned_since_unpin = False
            self._clear_pins(self._pin_slot[0])

    def _pinned(self):
        """The places pinned by live workers (lock held); a dead worker's pins go. They
        are places, not pieces: a piece the index forgot stays pinned."""
        pinned = []
        for slot in range(PIN_SLOTS):
            pins = [pin for pin in self._pins(slot) if pin is not None]
            if not pins:
                continue
            if self._pin_slot is None or slot != self._pin_slot[0]:
                if not _ofd_held(self._lock_fd_rw(), PIN_BYTES + slot):
                    self._clear_pins(slot)  # (its worker died)
                    continue
            pinned += pins
        return pinned

    def _lock_fd_rw(self):
        """An opening of this process's to ask the kernel about others' byte locks."""
        return self._pin_slot[1] if self._pin_slot is not None else self._lock_fd

    # -- what the workers call

    def get(self, digest):
        """The piece's bytes if the arena holds it (as ``look`` serves them), else None;
        nothing is entered, nothing waited for."""
        try:
            what, found = self._locked(self._look, digest, None, "peek")
            if what == "held":
                return self._served(digest, *found)
        except ArenaBusy:
            pass
        return None

    def look(self, digest, ahead=False):
        """What the arena holds of the piece: ``("held", view)`` (a read-only view of its
        bytes, pinned until ``unpin``; a checked copy off the loop), ``("decode",
        ticket)`` (the caller decodes it and ends with ``publish`` or ``abandon``), or,
        if the arena cannot take it now, ``("alone", None)`` (the caller decodes it for
        itself). ``ahead``: for a piece nobody asked for yet, ``("elsewhere", None)`` if
        it is held or being decoded (neither served nor waited for: a reader that wants
        it will)."""
        woken = None  # the generation of the decoding waited for
        try:
            for _ in range(WAIT_STEPS):
                what, found = self._locked(self._look, digest, woken,
                                           "ahead" if ahead else "want")
                if what == "held":
                    data = self._served(digest, *found)
                    if data is not None:
                        return "held", data
                    woken = None
                elif what == "wait":
                    loader, woken = found
                    if not self._wait_for(loader):
                        break
                else:
                    return what, found
        except ArenaBusy:
            pass
        return "alone", None

    def _look(self, digest, woken, mode):
        """``look``'s step under the lock; ``mode``: "want" (a reader's piece), "ahead"
        (one decoded ahead of its reader) or "peek" (``get``: enter nothing)."""
        slot, free = self._find(digest)
        if slot is not None:
            _, state, loader, generation, offset, length = self._entry(slot)
            if mode == "ahead" or mode == "peek" and state != HELD:
                return "elsewhere", None
            if state == HELD:
                self._add(SERVED)
                return "held", (slot, generation, offset, length, self._pin(offset, length))
            if generation != woken:
                return "wait", (loader, generation)
            # its decoder let go of its byte without ending: it died; take it over
            self._add(TAKEN_OVER)
            return self._claim(digest, slot)
        if mode == "peek":
            return "elsewhere", None
        if free is None or self._get(USED) >= ENTRIES * 3 // 4:
            self._forget()  # (crowded: probing would take long)
            slot, free = self._find(digest)
        return self._claim(digest, free)

    def _claim(self, digest, slot):
        ticket = self._loader_lock()
        if ticket is None:
            return "alone", None
        loader, fd = ticket
        generation = self._get(GENERATION) + 1
        self._set(GENERATION, generation)
        if self._entry(slot)[1] == EMPTY:
            self._add(USED)
        self._put_entry(slot, digest, DECODING, loader, generation, 0, 0)
        self._add(DECODED)
        return "decode", (digest, generation, fd)

    def _loader_lock(self):
        """A loader byte nobody holds, locked by a new opening of the file: ``(byte, fd)``;
        None if every byte is held."""
        fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
        for _ in range(LOADERS):
            loader = self._next_loader
            self._next_loader = (loader + 1) % LOADERS
            try:
                _ofd_lock(fd, fcntl.F_WRLCK, loader, wait=False)
                return loader, fd
            except OSError:
                continue
        os.close(fd)
        return None

    def _wait_for(self, loader):
        """Until the worker decoding with ``loader`` lets go of it (done, gave up or died):
        True, or False if it did not within DECODE_PATIENCE."""
        fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            return _patiently(lambda: _ofd_lock(fd, fcntl.F_RDLCK, loader, wait=False),
                              DECODE_PATIENCE)
        finally:
            os.close(fd)  # (which lets go of it)

    def _served(self, digest, slot, generation, offset, length, pinned):
        """The piece's bytes: a view of them if pinned, else a copy, if the piece is still
        entered once copied (else None)."""
        view = self._view[self._data_at + offset:self._data_at + offset + length]
        if pinned:
            return view.toreadonly()
        data = bytes(view)
        still = self._locked(lambda: self._entry(slot)[:4] == (digest, HELD, 0, generation))
        return data if still else None

    def publish(self, ticket, data):
        """End a decoding: the piece into the ring for every worker; False if it was not
        put there (too large, not contiguous, its place pinned, the lock not had). Its
        place is taken under the lock, and its bytes copied there without it (the entry
        still being decoded meanwhile: nobody reads the place, nobody takes it)."""
        digest, generation, fd = ticket
        try:
            try:
                view = memoryview(data).cast("B")
            except TypeError:  # (not contiguous: its decoder keeps it to itself)
                self._locked(self._drop, digest, generation)
                return False
            place = self._locked(self._place, digest, generation, len(view))
            if place is None:
                return False
            self._view[self._data_at + place:self._data_at + place + len(view)] = view
            return self._locked(self._hold, digest, generation)
        except ArenaBusy:
            return False  # (the entry stays as being decoded: a waiter takes it over)
        finally:
            os.close(fd)  # (which lets the waiters go)

    def abandon(self, ticket):
        """End a decoding that failed: waiters decode the piece themselves."""
        digest, generation, fd = ticket
        try:
            self._locked(self._drop, digest, generation)
        except ArenaBusy:
            pass  # (the entry stays as being decoded: a waiter takes it over)
        finally:
            os.close(fd)

    def _drop(self, digest, generation):
        slot, _ = self._find(digest)
        if slot is not None and self._entry(slot)[3] == generation:
            self._put_entry(slot, b"", GONE, 0, 0, 0, 0)
        return slot

    def _place(self, digest, generation, length):
        """Where in the ring the piece goes (the pieces there dropped), or None if it is
        not shared: too large, or its place pinned or being filled."""
        slot, _ = self._find(digest)
        if slot is None or self._entry(slot)[3] != generation:
            return None  # (the index was emptied meanwhile)
        if length > self.capacity // PIECE_SHARE:
            self._put_entry(slot, b"", GONE, 0, 0, 0, 0)
            return None
        head = self._get(HEAD)
        if head + length > self.capacity:  # (the rest of the ring's last lap goes too)
            last_lap = head
            head = 0
        else:
            last_lap = self.capacity
        if self._get(END) - self._get(FIRST) >= ENTRIES or any(
                offset < head + length and offset + size > head
                for offset, size in self._pinned()) or not self._evict(
                lambda offset, size: offset < head + length and offset + size > head
                or offset + size > last_lap):
            self._add(KEPT)  # (a piece there is being served: this one is not shared)
            self._put_entry(slot, b"", GONE, 0, 0, 0, 0)
            return None
        self._set(HEAD, head + length)
        self._put_entry(slot, digest, DECODING, self._entry(slot)[2], generation, head, length)
        end = self._get(END)
        QUEUED.pack_into(self._map, self._queue_at + end % ENTRIES * QUEUED.size, slot,
                         generation)
        self._set(END, end + 1)
        return head

    def _hold(self, digest, generation):
        """The piece's bytes are in its place: it is held (unless the index forgot it)."""
        slot, _ = self._find(digest)
        if slot is None:
            return False
        found, state, loader, entered, offset, length = self._entry(slot)
        if state != DECODING or entered != generation:
            return False
        self._put_entry(slot, digest, HELD, 0, generation, offset, length)
        return True

    def _evict(self, overlaps):
        """Drop the oldest pieces while their bytes ``overlaps(offset, length)`` (pieces
        are placed in the ring in the queue's order): False, nothing dropped, if one of
        them is being filled by a worker alive."""
        first, end = self._get(FIRST), self._get(END)
        doomed = []
        while first < end:
            slot, generation = QUEUED.unpack_from(self._map,
                                                  self._queue_at + first % ENTRIES * QUEUED.size)
            _, state, loader, entered, offset, length = self._entry(slot)
            if state in (HELD, DECODING) and entered == generation:
                if not overlaps(offset, length):
                    break
                if state == DECODING and _ofd_held(self._lock_fd_rw(), loader):
                    return False  # (its filler lives; one that died left the place)
                doomed.append(slot)
            first += 1
        for slot in doomed:
            self._put_entry(slot, b"", GONE, 0, 0, 0, 0)
        self._set(FIRST, first)
        return True

    def joined(self, views):
        """One view of the pieces' ``views`` (served by ``look`` or ``get``) if they lie
        one after another in the ring, else None: a read across pieces decoded one after
        another is handed over without a copy. Each piece stays pinned."""
        base = _address(self._view)
        places = [_address(view) - base for view in views]
        if any(place < self._data_at or place + len(view) > len(self._view)
               for place, view in zip(places, views)) or any(
                places[k] + len(views[k]) != places[k + 1] for k in range(len(views) - 1)):
            return None
        return self._view[places[0]:places[-1] + len(views[-1])].toreadonly()

    def held(self, digest):
        """Whether the piece is in the arena (nothing served)."""
        def look():
            slot, _ = self._find(digest)
            return slot is not None and self._entry(slot)[1] == HELD
        try:
            return self._locked(look)
        except ArenaBusy:
            return False

    def stats(self):
        """``{decoded, served, taken_over, forgotten, kept, bytes}``: pieces decoded for
        the mount, pieces served from the arena, decodings taken over from a dead worker,
        times the index was emptied, pieces kept by their decoder as their place was
        pinned, and the bytes held now; None if the lock is not had in time."""
        def count():
            held = 0
            for slot in range(ENTRIES):
                _, state, _, _, _, length = self._entry(slot)
                held += length if state == HELD else 0
            return {"decoded": self._get(DECODED), "served": self._get(SERVED),
                    "taken_over": self._get(TAKEN_OVER), "forgotten": self._get(FORGOTTEN),
                    "kept": self._get(KEPT), "bytes": held}
        try:
            return self._locked(count)
        except ArenaBusy:
            return None


def digest_of(*parts):
    """What names a piece in the arena: the same in every worker for the same piece, or
    None if ``parts`` hold anything but plain values (an object's text names its
    address, which is another object's in another process)."""
    if not all(map(_plain, parts)):
        return None
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogateescape"),
                           digest_size=16).digest()


def _plain(value):
    if isinstance(value, tuple):
        return all(map(_plain, value))
    return value is None or isinstance(value, (str, bytes, int, float))


def _patiently(attempt, seconds):
    """Call ``attempt()`` until it does not raise BlockingIOError (a lock taken without
    waiting), pausing a little longer each time: True, or False after ``seconds``."""
    deadline = time.monotonic() + seconds
    pause = 50e-6
    while True:
        try:
            attempt()
            return True
        except (BlockingIOError, PermissionError):  # (a lock's EAGAIN or EACCES)
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, PAUSE_MAX)


def _ofd_lock(fd, kind, byte, wait):
    """Lock (``kind``: F_WRLCK, F_RDLCK) one byte at LOCK_BASE + ``byte`` for the open file
    description ``fd``; OSError if another holds it and not ``wait``."""
    request = struct.pack("hhqqi4x", kind, os.SEEK_SET, LOCK_BASE + byte, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, request)


def _ofd_held(fd, byte):
    """Whether another open file description holds a lock on the byte at LOCK_BASE +
    ``byte`` (a worker's pin slot: its worker lives)."""
    request = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, LOCK_BASE + byte, 1, 0)
    kind = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, request))[0]
    return kind != fcntl.F_UNLCK


def _address(view):
    """Where ``view``'s bytes start in memory (only pieces of decoded views are joined,
    and their decoders have NumPy loaded: a mount of plain files starts without it)."""
    import numpy as np
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0] if len(view) else -1
