"""``-o columns``: ``columns/`` in every table directory of a tree.

:func:`with_columns` wraps the container a mount (or the fsspec filesystem) shows;
the wrapper passes everything to the container it wraps, wraps every nested
container it hands out the same way, and adds one entry, ``columns``, to any
that holds ``table.dat`` (a table directory, a MultiFile or MultiHDF5 table
view, a packed container's nested table, a table under an ``s3://`` prefix).
``columns`` is a :class:`~ctdsfs.formats.casacore.columns_view.ColumnsView`
reading the table through the container itself (its ``read``/``entry_size``),
so each format needs nothing of its own. A table that already has an entry
named ``columns`` keeps it, and the view is not shown there (one log line).
On a read-write mount the view writes cells into the table's own files (see
:mod:`~ctdsfs.formats.casacore.cell_write`); ``columns`` itself is never changed.
"""

import logging
import threading

from ..errors import CtdsfsError, ReadOnlyError
from ..formats.casacore.columns_view import ColumnsView

log = logging.getLogger(__name__)

COLUMNS = "columns"


def with_columns(container):
    """``container`` showing ``columns/`` in its table directories (None stays None)."""
    if container is None or isinstance(container, (WithColumns, ColumnsView)):
        return container
    return WithColumns(container)


class WithColumns:
    """A container, and ``columns/`` when it is a table (see the module docstring).

    Not a :class:`~ctdsfs.container.Container` subclass: every attribute it does not
    define is the wrapped container's own (``__getattr__``), writes included."""

    def __init__(self, inner):
        self.inner = inner
        self._lock = threading.RLock()
        self._children = {}  # name -> (the inner nested container, its wrapper)
        self._view = None
        self._told = False  # the clash with a table's own ``columns`` entry is logged once

    # Writes come to the daemon in the write call, not gathered in the kernel's cache and
    # sent later: a write into columns/NAME.npy that is refused fails there (EPERM).
    kernel_write_cache = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def kernel_keeps_pages(self):
        """Not on a read-write mount: a write into columns/ changes the table's files."""
        return self.inner.kernel_keeps_pages and not getattr(self.inner, "writable", False)

    def _shows_columns(self):
        """Whether ``columns`` is this wrapper's own entry (a table without one of its own)."""
        try:
            if not self.inner.contains("table.dat") or self.inner.nested("table.dat") is not None:
                return False
        except CtdsfsError:
            return False
        if self.inner.contains(COLUMNS):
            if not self._told:
                self._told = True
                log.warning("%s: the table has its own entry 'columns': shown as it is, "
                            "without the columns view", self.inner.label)
            return False
        return True

    def warm_decoders(self):
        """Load the compiled decoders this table's columns need (a mount's daemon, before
        it forks its workers)."""
        if self._shows_columns():
            self._columns_view().warm_decoders()

    def _is_view(self, key):
        return key == COLUMNS and self._shows_columns()

    def _columns_view(self):
        with self._lock:
            if self._view is None:
                self._view = ColumnsView(self.inner, f"{self.inner.label}/{COLUMNS}",
                                         table_label=self.inner.label)
            return self._view

    # -- reading

    def names(self):
        names = list(self.inner.names())
        return names + [COLUMNS] if self._shows_columns() else names

    def contains(self, name):
        return self._is_view(name) or self.inner.contains(name)

    def entry_size(self, key):
        return 0 if self._is_view(key) else self.inner.entry_size(key)

    def entry_blocks(self, key):
        return 0 if self._is_view(key) else self.inner.entry_blocks(key)

    def entry_stats(self, names):
        if COLUMNS not in names or not self._shows_columns():
            return self.inner.entry_stats(names)
        own = iter(self.inner.entry_stats([n for n in names if n != COLUMNS]))
        return [(0, 0) if n == COLUMNS else next(own) for n in names]

    def read(self, key, offset, size):
        if self._is_view(key):
            raise IsADirectoryError(key)
        return self.inner.read(key, offset, size)

    def cached(self, key, offset, size):
        return False if self._is_view(key) else self.inner.cached(key, offset, size)

    def symlink_target(self, name):
        return None if self._is_view(name) else self.inner.symlink_target(name)

    def _wrapped(self, name, child):
        """The one wrapper of the wrapped container's nested ``child`` (kept while it is)."""
        with self._lock:
            known = self._children.get(name)
            if known is None or known[0] is not child:
                known = self._children[name] = (child, with_columns(child))
            return known[1]

    def nested(self, name):
        if self._is_view(name):
            return self._columns_view()
        return self._wrapped(name, self.inner.nested(name))

    def classify(self, names):
        """The wrapped container's classify (one pass where it reads first blocks)."""
        view = COLUMNS in names and self._shows_columns()
        own = [n for n in names if n != COLUMNS] if view else names
        found = iter(self.inner.classify(own))
        return [self._columns_view() if view and n == COLUMNS else self._wrapped(n, next(found))
                for n in names]

    def reopened(self):
        return with_columns(self.inner.reopened())

    def reload_if_changed(self):
        """The wrapped container's answer; when it changed (another process committed),
        the columns views below are made anew from the new table files at their next use."""
        changed = self.inner.reload_if_changed()
        if changed:
            self.close_views(forget=True)
        return changed

    # -- writing: ``columns`` itself is never created, replaced, renamed or removed here

    def _refuse(self, name):
        if self._is_view(name):
            raise ReadOnlyError(f"{self.inner.label}/{COLUMNS} is the read-only columns view")

    def create(self, name):
        self._refuse(name)
        return self.inner.create(name)

    def write(self, key, offset, data):
        self._refuse(key)
        written = self.inner.write(key, offset, data)
        if self._view is not None:
            self._view.forget_decoded()  # the table's own files changed under it
        return written

    def truncate(self, key, size):
        self._refuse(key)
        return self.inner.truncate(key, size)

    def remove(self, name, keep_open=False):
        self._refuse(name)
        return self.inner.remove(name, keep_open)

    def rename(self, old, new):
        self._refuse(old)
        self._refuse(new)
        return self.inner.rename(old, new)

    def make_nested(self, name):
        self._refuse(name)
        self.inner.make_nested(name)
        return self.nested(name)

    def close(self):
        self.close_views()
        self.inner.close()

    def close_views(self, forget=False):
        """Close the columns views shown below (the wrapped containers close their own);
        with ``forget``, the next use opens them anew."""
        with self._lock:
            if self._view is not None:
                self._view.close()
                if forget:
                    self._view = None
            for _, wrapper in self._children.values():
                if isinstance(wrapper, WithColumns):
                    wrapper.close_views(forget)
