"""``ctdsfs map``: a picture of where a container's bytes live.

Every MultiFile block gets one role: the header (block 0), a continuation
block of the header (in use, or the spare set), a block of one virtual file
(a nested container counts as its file), free, belonging to nothing, claimed
twice, or failing its CRC. A MultiHDF5 has no blocks of its own, so its map
cuts the HDF5 file into block-sized cells and shows which file's chunks lie
in each (HDF5's own metadata fills the rest). Large containers are scaled:
one cell then stands for several blocks and shows the most telling role
among them. The map renders as text (coloured on a terminal), PNG or SVG,
with no imaging library.
"""

import struct
import zlib
from collections import Counter

import numpy as np

from .errors import CtdsfsError, printable
from .formats.check import bad_crc_blocks, progress_for
from .formats.multifile.container import MultiFile

# Roles that are not files, most telling first (a scaled cell shows the first present).
BAD_CRC, CONFLICT, HEADER, CONTINUATION, SPARE, FREE, METADATA, UNUSED = range(-8, 0)
ROLES = {  # role: (text symbol, RGB colour, legend text)
    BAD_CRC: ("!", (220, 30, 30), "fails its CRC check"),
    CONFLICT: ("X", (200, 0, 200), "claimed twice"),
    HEADER: ("#", (40, 40, 40), "header (block 0)"),
    CONTINUATION: ("+", (100, 100, 100), "header continuation"),
    SPARE: ("-", (160, 160, 160), "spare continuation set"),
    FREE: (".", (200, 235, 200), "free"),
    METADATA: ("~", (170, 170, 200), "HDF5 metadata or unallocated"),
    UNUSED: (" ", (255, 255, 255), "belongs to nothing"),
}
FILE_SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (188, 189, 34), (23, 190, 207), (174, 199, 232), (255, 187, 120),
           (152, 223, 138), (197, 176, 213), (196, 156, 148), (247, 182, 210), (219, 219, 141),
           (158, 218, 229)]
MAX_CELLS = 64 * 32


class BlockMap:
    """``roles``: one int per block (>= 0: index into ``files``; < 0: a role above)."""

    def __init__(self, label, description, roles, files, unit):
        self.label = label
        self.description = description
        self.roles = roles
        self.files = files  # [(name, size, blocks)]
        self.unit = unit  # what one entry of ``roles`` stands for, in bytes

    def cells(self, max_cells=MAX_CELLS):
        """(blocks per cell, one role per cell): the most telling role of each group."""
        per = max(1, -(-len(self.roles) // max_cells))
        if per == 1:
            return 1, list(self.roles)
        out = []
        for start in range(0, len(self.roles), per):
            group = self.roles[start:start + per]
            special = [r for r in group if r < 0 and r <= SPARE]
            if special:
                out.append(min(special))
            elif any(r >= 0 for r in group):
                out.append(Counter(r for r in group if r >= 0).most_common(1)[0][0])
            else:
                out.append(min(group))
        return per, out

    def counts(self):
        return Counter(self.roles)

    def to_json(self):
        counts = self.counts()
        return {"container": self.label, "description": self.description, "unit": self.unit,
                "cells": len(self.roles),
                "roles": {ROLES[r][2]: counts[r] for r in ROLES if counts[r]},
                "files": [{"name": n, "size": s, "blocks": b, "cells": counts[i]}
                          for i, (n, s, b) in enumerate(self.files)],
                "map": self.roles}


def block_map(container, verify_crc=True, progress=None):
    """The :class:`BlockMap` of a MultiFile or MultiHDF5 container.

    ``progress(total_bytes)`` as for :func:`~ctdsfs.formats.check.check_container` follows
    the CRC checks.
    """
    if isinstance(container, MultiFile):
        return _multifile_map(container, verify_crc, progress)
    if container.format_name == "MultiHDF5":
        return _multihdf5_map(container)
    raise CtdsfsError(f"{container.label}: a {container.format_name} has no block map")


def _multifile_map(c, verify_crc, progress):
    h = c.header
    nblocks = c.nblocks  # bounded by the file: never the header's word alone
    roles = np.full(nblocks, UNUSED, np.int64)
    claims = np.zeros(nblocks, np.int64)

    def claim(blocks, role):
        blocks = np.asarray(blocks, np.int64)
        blocks = blocks[(blocks >= 0) & (blocks < nblocks)]
        np.add.at(claims, blocks, 1)
        roles[blocks] = role

    claim([0], HEADER)
    if h.version == 2:
        for index, blocks in enumerate(h.cont_sets):
            active = index == h.active_cont_set
            used = h.cont_used[index] if active else 0
            claim(np.asarray(blocks)[:used], CONTINUATION)
            claim(np.asarray(blocks)[used:], SPARE)
    claim(h.free_blocks, FREE)
    files = []
    for index, name in enumerate(c.names()):
        blocks = c._entry(name).blocks
        suffix = "/" if c.nested(name) is not None else ""
        files.append((name + suffix, c.entry_size(name), len(blocks)))
        claim(np.asarray(blocks, np.int64), index)
    if verify_crc and h.use_crc:
        owned = np.concatenate([np.asarray(c._entry(n).blocks, np.int64) for n in c.names()]
                               or [np.zeros(0, np.int64)])
        with progress_for(progress, len(owned) * h.block_size) as bar:
            roles[bad_crc_blocks(c, owned, bar)] = BAD_CRC
    roles[(claims > 1) & (roles != BAD_CRC)] = CONFLICT
    description = (f"MultiFile version {h.version}, {nblocks} blocks of {h.block_size} bytes"
                   + (", CRCs" if h.use_crc else ""))
    return BlockMap(c.label, description, roles.tolist(), files, h.block_size)


def _multihdf5_map(c):
    """Cells of the HDF5 file, one block size each, marked with the file whose chunks lie there."""
    import os

    from .formats.multihdf5.container import HDF5_ERRORS

    bs = c.block_size
    size = os.path.getsize(c.path)
    ncells = max(1, -(-size // bs))
    roles = np.full(ncells, METADATA, np.int64)
    files = []

    def walk(container, prefix):
        for name in container.names():
            child = container.nested(name)
            if child is not None:
                walk(child, f"{prefix}{name}/")
                continue
            index = len(files)
            files.append((prefix + name, container.entry_size(name),
                          container.entry_blocks(name)))
            try:
                spans = container.stored_spans(name)
            except HDF5_ERRORS:
                continue  # a damaged chunk index: nothing to place (check reports it)
            for _, _, offset, stored in spans:
                if offset is not None:  # (a compact dataset lives in its object header)
                    roles[offset // bs:(offset + max(stored, 1) - 1) // bs + 1] = index
    walk(c, "")
    description = f"MultiHDF5, {size} bytes shown in cells of {bs} bytes (the block size)"
    return BlockMap(c.label, description, roles.tolist(), files, bs)


# ---------------------------------------------------------------- rendering

def _symbol(role):
    return ROLES[role][0] if role < 0 else FILE_SYMBOLS[role % len(FILE_SYMBOLS)]


def _colour(role):
    return ROLES[role][1] if role < 0 else PALETTE[role % len(PALETTE)]


def _legend(bmap, per):
    counts = bmap.counts()
    lines = [f"{printable(bmap.label)}: {bmap.description}; one character per "
             f"{'block' if per == 1 else f'{per} blocks'}"]
    lines += [f"  {sym!r:>4}  {text}: {counts[r]}" for r, (sym, _, text) in ROLES.items()
              if counts[r]]
    for i, (name, size, blocks) in enumerate(bmap.files):
        lines.append(f"  {_symbol(i)!r:>4}  {printable(name)}: {size} bytes, {blocks} blocks")
    return lines


def render_text(bmap, colour=False, width=64, max_cells=MAX_CELLS):
    per, cells = bmap.cells(max_cells)
    lines = _legend(bmap, per)
    digits = len(str(len(bmap.roles)))
    for start in range(0, len(cells), width):
        row = cells[start:start + width]
        if colour:
            text = "".join(f"\x1b[48;2;{r};{g};{b}m{_contrast(r, g, b)}{_symbol(c)}"
                           for c in row for r, g, b in [_colour(c)]) + "\x1b[0m"
        else:
            text = "".join(_symbol(c) for c in row)
        lines.append(f"{start * per:>{digits}} {text}")
    return "\n".join(lines) + "\n"


def _contrast(r, g, b):
    return "\x1b[30m" if r * 0.3 + g * 0.6 + b * 0.1 > 128 else "\x1b[97m"


def render_png(bmap, cell=8, width=64):
    per, cells = bmap.cells()
    width = max(1, min(width, len(cells)))
    rows = -(-len(cells) // width)
    image = np.full((rows * cell, width * cell, 3), 255, np.uint8)
    for i, role in enumerate(cells):
        y, x = divmod(i, width)
        image[y * cell:(y + 1) * cell - 1, x * cell:(x + 1) * cell - 1] = _colour(role)
    height, w = image.shape[:2]
    raw = b"".join(b"\0" + image[y].tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def render_svg(bmap, cell=12, width=64):
    from xml.sax.saxutils import escape

    per, cells = bmap.cells()
    width = max(1, min(width, len(cells)))
    rows = -(-len(cells) // width)
    legend = _legend(bmap, per)
    line = 16
    height = rows * cell + (len(legend) + 1) * line
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(width * cell, 480)}" '
           f'height="{height}" font-family="monospace" font-size="12">']
    for i, role in enumerate(cells):
        y, x = divmod(i, width)
        r, g, b = _colour(role)
        out.append(f'<rect x="{x * cell}" y="{y * cell}" width="{cell - 1}" '
                   f'height="{cell - 1}" fill="rgb({r},{g},{b})"/>')
    counts = bmap.counts()
    roles = [None] + [r for r in ROLES if counts[r]] + list(range(len(bmap.files)))
    for k, (role, text) in enumerate(zip(roles, legend)):
        y = rows * cell + (k + 1) * line
        if role is not None:
            r, g, b = _colour(role)
            out.append(f'<rect x="0" y="{y - 10}" width="10" height="10" '
                       f'fill="rgb({r},{g},{b})" stroke="black" stroke-width="0.5"/>')
        out.append(f'<text x="14" y="{y}">{escape(text.strip())}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
