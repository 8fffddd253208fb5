"""A file of another fsspec filesystem (``memory://``, ``gcs://``, a chained URL) as a
read-only store, so a container there opens like one on S3 (``open_from_store``)."""

from __future__ import annotations

from typing import Any


class FsspecStore:
    """A file of any other fsspec filesystem as a read-only store (ranged ``cat_file``)."""

    writable = False

    def __init__(self, fs: Any, path: str, label: str) -> None:
        self.fs, self.path, self.label = fs, path, label
        self._size: int | None = None  # asked for once: a read-only source

    def pread(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size())
        return self.fs.cat_file(self.path, offset, end) if offset < end else b""

    view = pread

    def cached(self, offset: int, size: int) -> bool:
        """Every read asks the other filesystem."""
        return False

    def size(self) -> int:
        if self._size is None:
            self._size = int(self.fs.size(self.path))
        return self._size

    def replaced(self) -> bool:
        """No version to compare: the header counter tells."""
        return False

    def sibling(self, suffix: str) -> FsspecStore:
        return FsspecStore(self.fs, self.path + suffix, self.label + suffix)

    def close(self) -> None:
        """The filesystem owns its connections."""
