"""The legacy table view over every container of a tree, not only over directories.

A casacore table stored as MultiFile keeps its files in ``table.mf`` beside
``table.dat``. A directory source shows such a table through
:class:`~ctdsfs.sources.directory.TableView` (casacore 3.5 reads it); a table that
sits inside a container (``ctdsfs pack`` of such a MeasurementSet, a packed
container under an ``s3://`` prefix, a container nested in a directory) is shown
the same way here: :func:`with_table_views` wraps a tree's root, every container
the wrapper hands out is wrapped in turn, and a container holding ``table.dat``
with a MultiFile in its ``table.mf`` becomes a :class:`ContainerTableView`:
TableView's reading over the container's entries. The view is read-only: a
writable tree keeps such tables as they are stored (``table.mf`` a file).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from ..container import Container, DerivedView, Usage
from ..errors import CtdsfsError
from ..formats import open_from_store
from ..io.store import VirtualFileStore
from .directory import TABLE_CONTAINERS, DirectorySource, TableView

log = logging.getLogger(__name__)


def with_table_views(container: Optional[Any]) -> Optional[Any]:
    """``container`` with the legacy view over every table stored in a container inside it
    (None stays None; a view or a wrapper is not wrapped again)."""
    if container is None or isinstance(container, (WithTableViews, ContainerTableView)):
        return container
    if getattr(container, "writable", False) or \
            isinstance(container, (DirectorySource, DerivedView)):  # (no table.mf inside)
        return WithTableViews(container)
    try:
        if _holds_stored_table(container):
            return ContainerTableView(container)
    except CtdsfsError as exc:
        log.warning("%s: shown as stored, not as a table: %s", container.label, exc)
        container.problems.append(f"shown as stored, not as a table: {exc}")
    return WithTableViews(container)


def _holds_stored_table(container: Container) -> bool:
    """Whether ``container`` holds a table whose files are in a container file beside
    ``table.dat`` (both plain files: a nested container named so is no table)."""
    if not container.contains("table.dat") or container.nested("table.dat") is not None:
        return False
    return any(container.contains(n) and container.nested(n) is None for n in TABLE_CONTAINERS)


def _kept_view(lock: Any, children: dict[str, tuple[Any, Any]], name: str,
               child: Optional[Any]) -> Optional[Any]:
    """The one view of a wrapped container's nested ``child``, kept in ``children`` while
    the wrapped container hands out that same child (a reload makes new ones)."""
    with lock:
        known = children.get(name)
        if known is None or known[0] is not child:
            known = children[name] = (child, with_table_views(child))
        return known[1]


class _EntryStore(VirtualFileStore):
    """A file of a read-only container as the store of the container it holds."""

    writable = False

    def sibling(self, suffix: str) -> _EntryStore:
        """The file named like this one plus ``suffix`` (a version-1 ``_hdrext``)."""
        return _EntryStore(self.parent, self.name + suffix)

    def replaced(self) -> bool:
        """The parent follows its own file's changes; the header counter tells the rest."""
        return False


class WithTableViews:
    """A container whose nested containers are shown with table views (the module
    docstring). Every attribute it does not define is the wrapped container's own."""

    def __init__(self, inner: Container) -> None:
        self.inner = inner
        self._lock = threading.RLock()
        self._children: dict[str, tuple[Any, Any]] = {}  # name -> (inner child, shown)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _shown(self, name: str, child: Optional[Any]) -> Optional[Any]:
        return _kept_view(self._lock, self._children, name, child)

    def nested(self, name: str) -> Optional[Any]:
        return self._shown(name, self.inner.nested(name))

    def classify(self, names: list[str]) -> list[Optional[Any]]:
        return [self._shown(n, c) for n, c in zip(names, self.inner.classify(names))]

    def reopened(self) -> Optional[Any]:
        return with_table_views(self.inner.reopened())

    def reload_if_changed(self) -> bool:
        changed = bool(self.inner.reload_if_changed())
        if changed:
            self.refresh_views()
        return changed

    def refresh_views(self) -> None:
        """The wrapped tree was reloaded: the table views below read it anew."""
        with self._lock:
            shown = [view for _, view in self._children.values()]
        for view in shown:
            if view is not None:
                view.refresh_views()

    def close_view(self) -> None:
        """Close the table views made below (the wrapped tree closes its own containers)."""
        with self._lock:
            shown = [view for _, view in self._children.values()]
            self._children.clear()
        for view in shown:
            if view is not None:
                view.close_view()

    def close(self) -> None:
        self.close_view()
        self.inner.close()


class ContainerTableView(TableView):
    """A table inside a container shown as a table stored in separate files: TableView's
    reading over the entries of the container that holds it (read-only)."""

    format_name = "casacore table view"
    holds_links = False

    def __init__(self, inner: Container) -> None:
        DirectorySource.__init__(self, inner.label, verify_crc=getattr(inner, "verify_crc", True))
        self.inner = inner
        self.container_name = next(n for n in TABLE_CONTAINERS
                                   if inner.contains(n) and inner.nested(n) is None)
        self.container = self._open_table_container()
        self._staged = None
        self._translated = None
        self._generation = 0  # moves on when the container holding the table reloads
        self._children: dict[str, tuple[Any, Any]] = {}  # as WithTableViews keeps them

    def _open_table_container(self) -> Container:
        return open_from_store(_EntryStore(self.inner, self.container_name),
                               verify_crc=self.verify_crc)

    # -- TableView's own files, read from the container holding the table

    def _stored_table_dat(self) -> bytes:
        return bytes(self.inner.read("table.dat", 0, self.inner.entry_size("table.dat")))

    def _table_dat_version(self) -> tuple[int, int]:
        return self._generation, self.inner.entry_size("table.dat")

    # -- DirectorySource's reading, from the container holding the table

    @property
    def checks_reads(self) -> bool:  # type: ignore[override]
        return bool(self.inner.checks_reads or self.container.checks_reads)

    read_into = None

    def names(self) -> list[str]:
        hidden = {self.container_name, self.container_name + "_hdrext"}
        own = [n for n in self.inner.names() if n not in hidden]
        return sorted(set(own) | set(self.container.names()))

    def _own(self, name: str) -> bool:
        return name not in (self.container_name, self.container_name + "_hdrext")

    def contains(self, name: str) -> bool:
        return self.container.contains(name) or (self._own(name) and self.inner.contains(name))

    def entry_size(self, key: Any) -> int:
        if key == "table.dat":
            return len(self._table_dat())
        if self._in_container(key):
            return self.container.entry_size(key)
        return self.inner.entry_size(key)

    def entry_blocks(self, key: Any) -> int:
        if self._in_container(key):
            return self.container.entry_blocks(key)
        return self.inner.entry_blocks(key)

    def read(self, key: Any, offset: int, size: int) -> Any:
        if key == "table.dat":
            return self._table_dat()[offset:offset + size]
        if self._in_container(key):
            return self.container.read(key, offset, size)
        return self.inner.read(key, offset, size)

    def cached(self, key: Any, offset: int, size: int) -> bool:
        if key == "table.dat":
            return True
        if self._in_container(key):
            return self.container.cached(key, offset, size)
        return self.inner.cached(key, offset, size)

    def symlink_target(self, name: str) -> Optional[str]:
        return None

    def nested(self, name: str) -> Optional[Any]:
        if not self._own(name) or self.container.contains(name):
            return None
        return _kept_view(self._lock, self._children, name, self.inner.nested(name))

    def usage(self) -> Usage:
        return self.inner.usage()

    def describe(self) -> dict:
        return self.inner.describe()

    def info_lines(self, info: dict) -> list[str]:
        return self.inner.info_lines(info)

    def reload_if_changed(self) -> bool:
        changed = bool(self.inner.reload_if_changed())
        if changed:
            self.refresh_views()
        return changed

    def refresh_views(self) -> None:
        """The container holding the table was reloaded: the table's container and
        table.dat are read anew, and so are the views below."""
        with self._lock:
            self._generation += 1
            self.container.reload_if_changed()
            shown = [view for _, view in self._children.values() if view is not None]
        for view in shown:
            view.refresh_views()

    def close_view(self) -> None:
        """Close what the view opened (the container holding the table is its parent's)."""
        with self._lock:
            shown = [view for _, view in self._children.values() if view is not None]
            self._children.clear()
        for view in shown:
            view.close_view()
        self.container.close()

    def close(self) -> None:
        """The view as a tree's root: it closes the container that holds the table too."""
        self.close_view()
        self.inner.close()
