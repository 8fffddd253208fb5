"""Time travel (``-o timestamp=``): which fragments, schema and metadata files an array
opened at a timestamp range reads, by the rules of libtiledb's array directory.

A fragment is read if the range asked for holds its time range whole, or (format
version 15 on) if the two overlap and the fragment (a consolidated one) keeps a timestamp
per cell, its cells then filtered by them; a metadata file and a delete only if the
range holds theirs whole. The schema is the newest written by the range's end (else the oldest).
"""

from .fragment_meta import timestamps

CELL_TIMESTAMPS_VERSION = 15  # fragments from here on may carry per-cell timestamps


def parse_timestamp(text):
    """``T`` (everything up to T) or ``T1:T2``, in ms since the epoch, as (start, end);
    None if ``text`` is not that."""
    first, colon, second = text.partition(":")
    try:
        start, end = (int(first), int(second)) if colon else (0, int(first))
    except ValueError:
        return None
    if start < 0 or end < start or end >= 1 << 64:
        return None
    return start, end


def fragment_version(name):
    """The format version at the end of a fragment name ``__t1_t2_uuid_V``, else None."""
    parts = name.split("_")
    return int(parts[5]) if len(parts) == 6 and parts[5].isdigit() else None


def in_time(name, timestamp, any_overlap=False):
    """Whether the timestamped ``name`` is read at ``timestamp`` (None: always)."""
    if timestamp is None:
        return True
    start, end = timestamp
    first, last = timestamps(name) or (0, 0)
    if any_overlap:
        return first <= end and start <= last
    return start <= first and last <= end


def fragment_overlap(name, timestamp):
    """How the time range of fragment ``name`` lies in ``timestamp``: "whole" (or no
    time travel), "partial" (an overlap libtiledb reads if the fragment, of version 15
    on, has per-cell timestamps), or None."""
    if in_time(name, timestamp):
        return "whole"
    version = fragment_version(name)
    if version is not None and version >= CELL_TIMESTAMPS_VERSION and \
            in_time(name, timestamp, any_overlap=True):
        return "partial"
    return None


def schema_at(names, timestamp):
    """The schema an array opened at ``timestamp`` uses, of ``names`` (oldest first)."""
    if timestamp is None:
        return names[-1]
    chosen = None
    for name in names:
        stamps = timestamps(name)
        if stamps and stamps[1] <= timestamp[1]:
            chosen = name
    return chosen or names[0]
