"""A small persistent index of the plain files in a MultiFile, so a cold listing need not
read them.

Only content tells a nested MultiFile from a plain file (casacore never sets
the nested flag), so the first listing of a mount reads the first bytes of
every file: for a container of small files, all of it. The index remembers,
per container file, which virtual files' first bytes were not a MultiFile
header, and a later read-only mount of the same, unchanged file skips those
reads. It only ever saves a read: a file it does not name is read as before,
and a nested container is always opened (and checked) as before.

An index applies only to the file it was made for: the same device, inode,
size, mtime and ctime (``identity``), and within it to the nested container
whose header is byte for byte the one recorded (``Header.fingerprint``). A
file changed so recently that a further change could keep its timestamps
(they are coarser than the clock) gets no index. Anything else about an index
file (garbage, too big, wrong types, another file's) makes it ignored and
rewritten at the next unmount. Files are written whole under a temporary name
and renamed into place, so two daemons never see half of one, and under a lock,
each adding what it learned to what another wrote meanwhile (a mount's worker
processes each write what they were asked about); the directory
holds at most ``MAX_FILES`` of them (the oldest go) of at most ``MAX_BYTES``.
"""

import fcntl
import json
import logging
import os
import stat
import time

from ...errors import FormatError
from ...io.store import read_small

log = logging.getLogger(__name__)

FORMAT_TAG = "ctdsfs nested index 1"
MAX_BYTES = 8 << 20  # an index file larger than this is neither read nor written
MAX_FILES = 256  # index files kept in the directory (the least recently written go)
# A file changed less than this long ago may change again without its timestamps moving
# (they follow a clock that ticks every few ms; whole-second ones on coarse file systems).
RACY_NS = 100_000_000
RACY_COARSE_NS = 2_000_000_000

_directory = None  # where index files live; None: no index (``enable``)


def enable():
    """Use the index (mounts do, unless ``-o no_index``), in
    ``${XDG_CACHE_HOME:-~/.cache}/ctdsfs/index``."""
    global _directory
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "ctdsfs", "index")
    # (no home to expand "~" in: no index, rather than one relative to wherever we are)
    _directory = directory if os.path.isabs(directory) else None


def open_index(fd):
    """The :class:`NestedIndex` of the container file open as ``fd``, or None when the
    index is off or the file's identity cannot be established."""
    if _directory is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_ino == 0:
        return None
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    name = f"{st.st_dev:x}-{st.st_ino:x}.json"  # one file per container file
    return NestedIndex(os.path.join(_directory, name), fd, identity)


def _racy(identity, now_ns):
    """Whether the file changed so recently that a change now could leave it the same."""
    changed = max(identity[3], identity[4])
    coarse = all(t % 1_000_000 == 0 for t in identity[3:])
    return now_ns - changed < (RACY_COARSE_NS if coarse else RACY_NS)


def plain_bitmap(flags):
    """Which entries (in the container's order, as ``flags``) are plain, as hex: one bit
    an entry, so an index costs a mount little to read and to hold (names would)."""
    bits = bytearray((len(flags) + 7) // 8)
    for i, plain in enumerate(flags):
        if plain:
            bits[i >> 3] |= 1 << (i & 7)
    return bits.hex()


class NestedIndex:
    """The index of one container file: ``records`` maps a nested container's path
    ('' for the top, else its names joined by '/') to (header fingerprint, plain_bitmap)."""

    def __init__(self, path, fd, identity):
        self.path = path
        self.fd = fd
        self.identity = identity
        self.savable = not _racy(identity, time.time_ns())
        self.records = self._load()

    def _load(self):
        try:
            data = json.loads(read_small(self.path, MAX_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, FormatError, ValueError, RecursionError) as exc:
            log.debug("%s: index ignored (%s)", self.path, exc)
            return {}
        records = _valid_records(data, self.identity)
        if records is None:
            log.debug("%s: index ignored (another file's, a changed file's, or damaged)",
                     self.path)
            return {}
        return records

    def plain_names(self, path, fingerprint, names):
        """Those of ``names`` (the entries of the container at ``path``, in order) that the
        index says are plain files, if that container's header is still the one recorded.
        Asked once per container opened: the record is handed over (``save`` gets it back
        from the container)."""
        record = self.records.pop(path, None)
        if record is None or record[0] != fingerprint:
            return ()
        try:
            bits = bytes.fromhex(record[1])
        except ValueError:
            return ()
        if len(bits) != (len(names) + 7) // 8:
            return ()
        return [name for i, name in enumerate(names) if bits[i >> 3] >> (i & 7) & 1]

    def save(self, visited):
        """Record ``visited`` ({path: (fingerprint, plain_bitmap)}) and what was loaded for
        containers not opened, if the file is still the one opened; never raises (the index
        only saves reads). Written even when unchanged: the least recently used go first."""
        try:
            current = os.fstat(self.fd)
        except OSError:
            return
        same = [current.st_dev, current.st_ino, current.st_size, current.st_mtime_ns,
                current.st_ctime_ns] == self.identity
        if not (self.savable and same):
            return
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            lock = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            log.debug("%s: index not written (%s)", self.path, exc.strerror)
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # What another process serving this file wrote meanwhile (the other worker
            # processes of a mount) stays, and adds to what this one found
            records = {**self.records, **self._load()}
            for path, (fingerprint, bitmap) in visited.items():
                records[path] = _joined(records.get(path), fingerprint, bitmap)
            self._save_records(records)
        except OSError as exc:
            log.debug("%s: index not written (%s)", self.path, exc.strerror)
        finally:
            os.close(lock)

    def _save_records(self, records):
        text = json.dumps({"format": FORMAT_TAG, "identity": self.identity,
                           "containers": {p: list(r) for p, r in sorted(records.items())}},
                          separators=(",", ":")).encode()
        if len(text) > MAX_BYTES:
            log.debug("%s: index of %d bytes not written (limit %d)", self.path, len(text),
                     MAX_BYTES)
            return
        self._write(text)

    def _write(self, text):
        import tempfile  # (only here, at unmount: it costs a mount milliseconds)

        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".new-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            os.replace(temporary, self.path)
        except BaseException:
            os.unlink(temporary)
            raise
        _prune(directory)


def _joined(record, fingerprint, bitmap):
    """The record of a container visited, with the plain files another process found in
    it (the same header: the same files); each process knows the files it was asked about."""
    if record is None or record[0] != fingerprint or len(record[1]) != len(bitmap):
        return fingerprint, bitmap
    try:
        return fingerprint, bytes(a | b for a, b in zip(bytes.fromhex(record[1]),
                                                        bytes.fromhex(bitmap))).hex()
    except ValueError:
        return fingerprint, bitmap


def _valid_records(data, identity):
    """The records of a loaded index that is well-formed and made for ``identity``, else
    None. Every value is checked for its type: the file is as untrusted as the container."""
    if not (isinstance(data, dict) and data.get("format") == FORMAT_TAG
            and data.get("identity") == identity and isinstance(data.get("containers"), dict)):
        return None
    records = {}
    for path, record in data["containers"].items():
        if not (isinstance(record, list) and len(record) == 2
                and all(isinstance(part, str) for part in record)):
            return None
        records[path] = tuple(record)
    return records


def _prune(directory):
    """Keep at most MAX_FILES files in ``directory`` (index files and the temporary files
    of daemons that died writing one), removing the least recently written."""
    try:
        with os.scandir(directory) as entries:
            files = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in entries]
    except OSError:
        return
    for _, path in sorted(files)[:max(0, len(files) - MAX_FILES)]:
        try:
            os.unlink(path)
        except OSError:
            pass
