"""``ctdsfs check`` of any source: one container, or every container in a tree.

The source is opened by the opener without trusting its CRCs and without views (the
check is of what is stored); a directory source or an ``s3://`` prefix is walked, and
each container in it checked as ``formats.check`` checks one (a MultiFile-stored
table's ``table.mf`` included), with what the tree itself found (containers shown raw,
hidden names) among the problems.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ..errors import CtdsfsError
from ..formats.check import check_container
from .directory import DirectorySource, TableView
from .opener import OpenOptions, open_source

Lines = tuple[list[str], list[str]]  # (problems, notes), each a 'location: text' line


def check_path(source: str | os.PathLike, progress: Optional[Callable] = None,
               timestamp: Optional[tuple[int, int]] = None, remote: Any = None) -> Lines:
    """Open ``source`` (every source a mount takes) and check all of it; ``progress``
    as for ``check_container``; ``timestamp``: TileDB arrays as at (start, end)."""
    try:
        container = open_source(source, OpenOptions(verify_crc=False, views=False,
                                                    timestamp=timestamp,
                                                    remote=remote)).container
    except CtdsfsError as exc:
        return [str(exc)], []
    try:
        return check_tree(container, progress)
    finally:
        container.close()


def check_tree(container: Any, progress: Optional[Callable] = None) -> Lines:
    """(problems, notes) of ``container`` and, in a directory source, of every container
    shown in it."""
    if not isinstance(container, DirectorySource):
        return check_container(container, progress)
    problems: list[str] = []
    notes: list[str] = []
    found = [container.container] if isinstance(container, TableView) else []
    for name in container.names():
        try:
            child = container.nested(name)
        except CtdsfsError as exc:
            problems.append(f"{container.label}/{name}: {exc}")
            continue
        if child is not None:
            found.append(child)
    for child in found:
        more_problems, more_notes = check_tree(child, progress)
        problems += more_problems
        notes += more_notes
    problems[:0] = [f"{container.label}: {p}" for p in container.problems]
    return problems, notes
