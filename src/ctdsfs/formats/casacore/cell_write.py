"""Cells of a casacore column written back into its storage manager's files.

``-o rw,columns`` lets a write into ``columns/NAME.npy`` change the cells it covers.
The bytes go where the decoder reads them from: the SSM and tiled readers' ``places``
(the same geometry their ``read`` uses) give each value's byte, or for a Bool its bit,
in the manager's file; values are encoded in the table's byte order, Bools set bit by
bit in the bytes that hold them (a read-modify-write of those bytes only). Only bytes
whose content changes are written, through the table's source (``source.write``), so
they reach the file by the route raw writes take and are committed with them.

What is written is decided before anything is (:func:`why_not_written`): columns whose
cells each have one fixed place in a file nothing else rewrites, in a source whose
commits are atomic. A failure part-way through a write puts back what it had written.
"""

import numpy as np

from ...errors import BlockError, CtdsfsError, FormatError
from .base import TP_BOOL, TP_STRING, disk_dtype, read_exact

WRITTEN_MANAGERS = ("StandardStMan", "TiledColumnStMan", "TiledShapeStMan", "TiledCellStMan",
                    "TiledDataStMan")
WINDOW_GAP = 64 << 10  # places closer than this are read (and compared) in one read
MERGE_GAP = 64  # changed bytes this close are written in one write (the gap unchanged)


def why_not_written(table, col):
    """Why the cells of ``col`` are not written (None: they are)."""
    if not col.decoded:
        return f"{col.manager} is not decoded"
    if col.data_type == TP_STRING:
        return "String columns are not written"
    if col.in_cube_records:
        return ("the id and coordinate columns of a hypercolumn are not written (their values "
                "are in the hypercubes' records, in the manager's header)")
    if col.manager not in WRITTEN_MANAGERS:
        return (f"{col.manager} columns are not written (their cells have no fixed place "
                "in the file)")
    return None


def commits_atomically(source, name):
    """Whether writes to ``name`` of ``source`` are committed all at once (a MultiFile's
    copy-on-write commit), not written in place as they come (a plain directory)."""
    ask = getattr(source, "commits_atomically", None)
    return bool(ask(name)) if callable(ask) else False


def write_cells(table, col, start, values, changed):
    """Write the elements of rows ``start..start+len(values)`` of ``col`` where ``changed``
    (a bool array shaped as ``values``, of the column's getcol dtype) is set."""
    edits, row = [], 0
    try:
        for file, places in table.cell_places(col.name, start, start + len(values)):
            n = len(places)
            if places.shape[1:] != values.shape[1:]:
                raise BlockError(f"{table.label}: column {col.name}: cells of shape "
                                 f"{places.shape[1:]} in {file}, {values.shape[1:]} shown")
            chosen = changed[row:row + n]
            edits += _file_edits(table, col, file, places[chosen], values[row:row + n][chosen])
            row += n
    except FormatError as exc:  # (a place outside its file too)
        raise BlockError(str(exc)) from None
    if row != len(values):
        raise BlockError(f"{table.label}: column {col.name}: rows {start}..{start + len(values)}"
                         f" have {row} stored cells")
    done = []
    try:
        for file, offset, old, new in edits:
            table.source.write(file, offset, new)
            done.append((file, offset, old))
    except BaseException:
        table.forget_cached()
        try:
            for file, offset, old in reversed(done):  # (into blocks copied for this change)
                table.source.write(file, offset, old)
        except (CtdsfsError, OSError):
            pass  # the container went read-only: nothing of this is committed
        raise
    table.forget_cached()


def _file_edits(table, col, file, places, values):
    """[(file, offset, old bytes, new bytes)] that store ``values`` at ``places``."""
    if not len(places):
        return []
    if col.data_type == TP_BOOL:
        bits = places.astype(np.int64)
        order = np.argsort(bits)
        bits, new_bits = bits[order], values.astype(np.uint8)[order]
        starts = bits // 8
        windows = _windows(starts, starts + 1)
        edits = []
        for lo, hi, i, j in windows:
            old = np.frombuffer(read_exact(table.source, file, lo, hi - lo, "cells"), np.uint8)
            unpacked = np.unpackbits(old, bitorder="little")
            unpacked[bits[i:j] - lo * 8] = new_bits[i:j]
            edits += _changed_runs(file, lo, old, np.packbits(unpacked, bitorder="little"))
        return edits
    encoded = np.ascontiguousarray(values.astype(disk_dtype(col.data_type, table.big_endian)))
    size = encoded.dtype.itemsize
    order = np.argsort(places, kind="stable")
    starts = places.astype(np.int64)[order]
    items = encoded.reshape(-1)[order].view(np.uint8).reshape(-1, size)
    edits = []
    for lo, hi, i, j in _windows(starts, starts + size):
        old = np.frombuffer(read_exact(table.source, file, lo, hi - lo, "cells"), np.uint8)
        new = old.copy()
        new[(starts[i:j] - lo)[:, None] + np.arange(size)] = items[i:j]
        edits += _changed_runs(file, lo, old, new)
    return edits


def _windows(starts, ends):
    """(first byte, end byte, first item, end item) of groups of items (sorted, their byte
    ranges ``starts..ends`` too) within WINDOW_GAP of each other: each group is one read."""
    breaks = np.flatnonzero(starts[1:] - ends[:-1] > WINDOW_GAP) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks, [len(starts)]])
    return [(int(starts[i]), int(ends[j - 1]), int(i), int(j))
            for i, j in zip(firsts, lasts)]


def _changed_runs(file, lo, old, new):
    """Edits for the bytes where ``new`` differs from ``old`` (runs MERGE_GAP apart joined)."""
    differ = np.flatnonzero(old != new)
    if not len(differ):
        return []
    breaks = np.flatnonzero(np.diff(differ) > MERGE_GAP) + 1
    edits = []
    for run in np.split(differ, breaks):
        a, b = int(run[0]), int(run[-1]) + 1
        edits.append((file, lo + a, old[a:b].tobytes(), new[a:b].tobytes()))
    return edits
