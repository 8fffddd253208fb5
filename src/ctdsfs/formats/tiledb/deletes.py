"""Delete conditions (``__commits/NAME.del``, format 16 on; TileDB's
``format_spec/delete_commit_file.md``): which cells of a sparse array a delete removes.

A delete file is one generic tile holding a tree of nodes: an expression node (type 0:
AND, OR or NOT over its children) or a value node (type 1: a field, a comparison and the
value's bytes in the field's type; no bytes for null). The condition stored is the
negation of the one the user gave (the cells to keep): a delete at time T removes the
cells written at or before T that fail it; libtiledb applies it to the newest write of a
coordinate (an older write never comes back). A null cell fails every comparison (so
a delete removes it unless a NOT turns that round); a var-sized value is compared as
bytes, no bytes being the empty string (so tiledb-py's ``s != None``, stored as
``s == ''``, removes every cell that is not an empty string).
"""

import operator
import os

import numpy as np

from ...errors import FormatError
from ...io.byte_reader import Reader
from .fragment_meta import ArrayFile, by_time, timestamps
from .schema import read_generic_tile
from .time import in_time

COMPARE = {0: operator.lt, 1: operator.le, 2: operator.gt, 3: operator.ge, 4: operator.eq,
           5: operator.ne}
AND, OR, NOT = 0, 1, 2
MAX_DEPTH = 64  # nested expressions deeper than this are refused (no runaway recursion)
SMALLEST_NODE = 10  # an expression node's bytes: no child count can claim more


def read_deletes(array, names):
    """(name, timestamp, condition) of every delete of the array's ``__commits`` (holding
    ``names``) that its time travel reads, oldest first: ``.del`` files, and the deletes
    a ``.con`` file (commits consolidated) carries."""
    tiles = {}
    for name in names:
        what = f"{array.label}: __commits/{name}"
        if name.endswith(".del"):
            tiles.setdefault(name, (ArrayFile(array.path, os.path.join("__commits", name))
                                    .read_small(what), what))
        elif name.endswith(".con"):
            data = ArrayFile(array.path, os.path.join("__commits", name)).read_small(what)
            for marker, tile in consolidated_commits(data, what):
                folder, _, commit = marker.partition("/")
                if tile is not None and folder == "__commits":
                    tiles[commit] = (tile, f"{what}: {commit}")
    deletes = []
    for name in by_time(tiles):
        if not in_time(name, array.timestamp):
            continue
        data, what = tiles[name]
        body, end = read_generic_tile(data, 0, what)
        if end != len(data):
            raise FormatError(f"{what}: {len(data) - end} bytes after the condition's tile")
        deletes.append((name, (timestamps(name) or (0, 0))[1], parse_condition(body, what)))
    return deletes


def consolidated_commits(data, what):
    """The lines of a ``.con`` file (``__commits/NAME.wrt``, ``__commits/NAME.del``...),
    each as (line, the delete's tile for a ``.del`` line (its size, a uint64, and its
    bytes follow the line), else None)."""
    entries, pos = [], 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        line = bytes(data[pos:end]).decode("utf-8", "surrogateescape")
        pos, tile = end + 1, None
        if line.endswith(".del"):
            r = Reader(data[pos:], what)
            size = r.count("Q", 1)
            tile = bytes(r.take(size))
            pos += 8 + size
        entries.append((line, tile))
    return entries


def parse_condition(body, what):
    r = Reader(body, what)
    node = _node(r, what, 0)
    if r.left():
        raise FormatError(f"{what}: {r.left()} bytes after the delete condition")
    return node


def _node(r, what, depth):
    if depth > MAX_DEPTH:
        raise FormatError(f"{what}: delete condition nested deeper than {MAX_DEPTH}")
    kind = r.unpack("B")
    if kind == 1:
        op = r.unpack("B")
        if op not in COMPARE:
            raise FormatError(f"{what}: comparison {op} of a delete condition is not one "
                              f"ctdsfs applies (LT, LE, GT, GE, EQ, NE)")
        name = bytes(r.take(r.unpack("I"))).decode("utf-8", "surrogateescape")
        return ("value", op, name, bytes(r.take(r.unpack("Q"))))
    if kind == 0:
        combine = r.unpack("B")
        if combine not in (AND, OR, NOT):
            raise FormatError(f"{what}: combination {combine} of a delete condition is not "
                              f"AND, OR or NOT")
        children = [_node(r, what, depth + 1) for _ in range(r.count("Q", SMALLEST_NODE))]
        if not children or (combine == NOT and len(children) != 1):
            raise FormatError(f"{what}: a delete condition's {('AND', 'OR', 'NOT')[combine]} "
                              f"with {len(children)} operands")
        return ("expr", combine, children)
    raise FormatError(f"{what}: delete condition node type {kind} (0 or 1)")


def condition_fields(node):
    """The names of the fields a condition compares."""
    if node[0] == "value":
        return {node[2]}
    return set().union(*(condition_fields(child) for child in node[2]))


def matches(node, cells, count):
    """A bool per cell: whether the condition holds. ``cells(name)`` gives (field, values:
    an array, or an object array of bytes for a var-sized field, validity or None)."""
    if node[0] == "expr":
        results = [matches(child, cells, count) for child in node[2]]
        if node[1] == NOT:
            return ~results[0]
        return np.logical_and.reduce(results) if node[1] == AND else \
            np.logical_or.reduce(results)
    _, op, name, value = node
    field, values, validity = cells(name)
    valid = np.ones(count, bool) if validity is None else validity != 0
    if field.var:
        return valid & np.fromiter((COMPARE[op](v, value) for v in values), bool, count)
    if len(value) != field.dtype.itemsize or field.cell_val_num != 1:
        raise FormatError(f"a delete condition compares {name!r} with {len(value)} bytes, "
                          f"which ctdsfs does not apply")
    return valid & COMPARE[op](values, np.frombuffer(value, field.dtype)[0])
