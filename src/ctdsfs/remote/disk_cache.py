"""Chunks of remote objects kept in a local directory (a remote source's ``cache_dir``)."""

import contextlib
import hashlib
import logging
import os
import threading
import time

from ..errors import CtdsfsError
from ..io.store import create_exclusive

log = logging.getLogger(__name__)


class DiskCache:
    """Chunks of remote objects in a local directory that survives remounts, bounded by
    ``limit`` bytes (the oldest written go first).

    A chunk is named by a hash of the object's address, ETag and chunk size, so a
    replaced object never meets its old chunks. The directory must be private (it is
    made mode 0700): its chunks are served as they are, checked only for length. It is written whole under a temporary
    name and renamed into place, so two mounts sharing the directory never read half a
    chunk; a chunk of the wrong length, or one the other mount just evicted, is a miss.
    """

    STALE_TEMPORARY = 600  # seconds after which a temporary file is a crashed writer's

    def __init__(self, directory, limit):
        self.directory, self.limit = directory, limit
        self._lock = threading.Lock()
        self._used = None  # bytes in the directory, counted at the first write
        self._failed = False  # a failed write is logged once
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)  # its chunks are served as read
        except OSError as exc:
            raise CtdsfsError(f"cache_dir {directory}: {exc.strerror}") from None

    def _path(self, url, etag, chunk_size, index):
        name = hashlib.sha256(f"{url}\0{etag}\0{chunk_size}".encode()).hexdigest()
        return os.path.join(self.directory, f"{name}-{index}")

    def get(self, url, etag, chunk_size, index, length):
        try:
            with open(self._path(url, etag, chunk_size, index), "rb") as f:
                data = f.read(length + 1)
        except OSError:
            return None
        return data if len(data) == length else None

    def put(self, url, etag, chunk_size, index, data):
        path = self._path(url, etag, chunk_size, index)
        temporary = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            with os.fdopen(create_exclusive(temporary), "wb") as f:  # (never a planted link)
                f.write(data)
            os.replace(temporary, path)
        except OSError as exc:
            if not self._failed:
                log.warning("%s: cannot keep chunks there (%s)", self.directory, exc.strerror)
            self._failed = True
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        with self._lock:  # (the first count finds the chunk just written)
            self._used = self._scan()[1] if self._used is None else self._used + len(data)
            over = self._used > self.limit
        if over:
            self._evict()

    def _scan(self):
        """``([(mtime, size, path)], total bytes)`` of the directory's chunks."""
        files, now = [], time.time()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # evicted by the other mount meanwhile
                if entry.name.endswith(".tmp") and now - st.st_mtime < self.STALE_TEMPORARY:
                    continue  # being written
                files.append((st.st_mtime, st.st_size, entry.path))
        return files, sum(f[1] for f in files)

    def _evict(self):
        """Remove the oldest chunks until 90 % of the limit is left."""
        with self._lock:
            files, used = self._scan()
            for _, size, path in sorted(files):
                if used <= self.limit * 0.9:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(path)
                used -= size
            self._used = used
