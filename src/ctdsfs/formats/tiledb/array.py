"""TileDB arrays (seed 003; ``format_spec/`` in TileDB-Inc/TileDB) as read-only directories.

An array folder holds ``__schema/`` (generic tiles), ``__fragments/NAME/``
(data files ``a<i>.tdb``, ``d<i>.tdb``, ``_var``, ``_validity``, and
``__fragment_metadata.tdb``: generic tiles plus a footer at its end),
``__commits/NAME.wrt`` (a fragment without one is not part of the array) and
``__meta/`` (array metadata). Shown as::

    schema.json  schemas/NAME.json  metadata.json
    fragments/NAME/fragment.json  FIELD.npy  FIELD.offsets.npy + FIELD.data
                  FIELD.validity.npy  raw/ (the fragment's own files)
    dense/ATTR.npy  ATTR.offsets.npy + ATTR.data  ATTR.validity.npy
                  (dense arrays: every fragment merged, as libtiledb reads it)
    sparse/DIM.npy  ATTR.npy  (and the var-sized and nullable files, as above)
                  (sparse arrays: every cell in libtiledb's global order)

Format versions 1 and 2 keep the schema in ``__array_schema.tdb``, a
fragment's metadata in one generic tile, and every dimension's coordinates in
``__coords.tdb``; their fragments are committed folders ``__uuid_t1``.

Listing is cheap: fragment names come from ``__commits``, a fragment's files
from its footer alone (read when its directory is first listed); the metadata
tiles are read when sizes or fragment.json are asked for, and a data tile is
decoded when a read touches it. A tile that cannot be decoded, or whose checksum fails, is
EIO for that read, logged with the array, fragment, field and tile.
"""

import logging
import os
import stat
from collections import OrderedDict

from ...container import name_problem
from ...errors import CtdsfsError, FormatError
from ...io.beneath import kind_beneath
from ...io.byte_reader import Reader
from ...io.directory import PlainDirectory, mark_shown_raw
from .deletes import consolidated_commits
from .dense import DenseView
from .folder import GROUP_MARKER, TileDBFolder, TileDBGroup
from .fragment import Fragment, TileDBDirectory
from .fragment_meta import ArrayFile, FragmentMetadata, by_time, legacy_timestamps, timestamps
from .schema import (
    LEGACY_SCHEMA,
    json_bytes,
    parse_enumeration,
    parse_schema,
    read_generic_tile,
    read_name,
    schema_json,
)
from .sparse import SparseView
from .time import fragment_overlap, schema_at

log = logging.getLogger(__name__)


class _Folder(TileDBDirectory):
    """A directory of given entries (``schemas/``, ``fragments/``, ``dense/``); one of files
    only says so, and a stat of it then lists nothing (the array's root lists whatever
    its views' fragments are like)."""

    def __init__(self, label, build, holds_directories=False):
        super().__init__(label)
        self._builder = build
        self.holds_directories = holds_directories

    def _build(self):
        return self._builder()


class TileDBArray(SparseView, DenseView, TileDBFolder):
    """A TileDB array folder as schema.json, schemas/, metadata.json, fragments/, dense/
    or sparse/."""

    def __init__(self, path, timestamp=None):
        super().__init__(path)
        self.timestamp = timestamp  # (start, end) in ms: time travel, as tiledb.open's
        self._schemas = {}
        self.schema_names = by_time(self._list("__schema", files_only=True))
        if not self.schema_names and LEGACY_SCHEMA in self._list(".", files_only=True):
            self.schema_names = [LEGACY_SCHEMA]
        if not self.schema_names:
            raise FormatError(f"{self.label}: no array schema in __schema")
        self.schema = self.schema_named(schema_at(self.schema_names, timestamp))
        self._fragments = {}
        self.fragment_names = self._committed_fragments()
        self._merged_cache = None  # (field key, its merged parts): dense/ or sparse/
        self._sparse_cache = None  # sparse/: (every cell in the global order, fragments)

    def schema_named(self, name):
        """The schema in ``__schema/name`` (parsed once)."""
        with self._lock:
            if name not in self._schemas:
                if name not in self.schema_names:
                    raise FormatError(f"{self.label}: no schema {name!r} in __schema")
                folder = "." if name == LEGACY_SCHEMA else "__schema"
                what = f"{self.label}: {os.path.normpath(os.path.join(folder, name))}"
                data = ArrayFile(self.path, os.path.join(folder, name)).read_small(what)
                schema = parse_schema(data, what)
                if "enumerations" in schema:
                    schema["enumerations"] = [self._enumeration(e)
                                              for e in schema["enumerations"]]
                self._schemas[name] = schema
            return self._schemas[name]

    def _enumeration(self, listed):
        """An enumeration the schema lists, read from ``__schema/__enumerations``: its
        labels; or, if it cannot be read, why (the rest of the array still shows)."""
        what = f"{self.label}: __schema/__enumerations/{listed['file']}"
        try:
            why = name_problem(listed["file"])
            if why:
                raise FormatError(f"{what}: not a file name: {why}")
            data = ArrayFile(self.path, os.path.join("__schema", "__enumerations",
                                                     listed["file"])).read_small(what)
            enumeration = parse_enumeration(data, what)
            if enumeration["name"] != listed["name"]:
                raise FormatError(f"{what}: holds {enumeration['name']!r}, not "
                                  f"{listed['name']!r}")
            return enumeration
        except CtdsfsError as exc:
            self._note(str(exc))
            return {**listed, "problem": str(exc)}

    def _committed_fragments(self):
        """Fragment folders with a commit: ``__commits/NAME.wrt``, or a line
        ``__commits/NAME.wrt`` of a ``.con`` file (commits consolidated, version 12 on),
        ``NAME.ok`` beside a folder in the array's own (5 to 11), or (1 and 2, renamed
        when complete) a ``__uuid_t1`` folder with fragment metadata."""
        self.fragment_paths = {n: os.path.join("__fragments", n)
                               for n in self._list("__fragments")}  # (inside the array)
        committed = set()
        for name in self._list("."):
            if name.endswith(".ok") and name.startswith("__") and name[:-3] != "__":
                self.fragment_paths.setdefault(name[:-3], name[:-3])
                committed.add(name[:-3])
            elif legacy_timestamps(name) and kind_beneath(
                    self.path, os.path.join(name, "__fragment_metadata.tdb"), stat.S_ISREG):
                self.fragment_paths.setdefault(name, name)
                committed.add(name)
        present = set(self.fragment_paths)
        for name in self._list("__commits"):
            if name.endswith(".wrt"):
                committed.add(name[:-4])
            elif name.endswith(".con"):
                what = f"{self.label}: __commits/{name}"
                text = ArrayFile(self.path, os.path.join("__commits", name)).read_small(what)
                for line, _ in consolidated_commits(text, what):
                    folder, _, commit = line.partition("/")
                    if folder in ("__commits", "__fragments") and commit.endswith(".wrt"):
                        committed.add(commit[:-4])
        for name in sorted(present - committed):
            self.problems.append(f"fragment {name!r} not shown: no commit file")
        shown = []
        for name in by_time(present & committed):
            if not self._read_at_timestamp(name):
                continue
            why = name_problem(name)
            if not why and kind_beneath(self.path, self.fragment_paths[name], stat.S_ISLNK):
                why = "a link, not followed"
            elif not why and not kind_beneath(self.path, self.fragment_paths[name],
                                              stat.S_ISDIR):
                why = "not a directory"
            if why:
                self._note(f"fragment {name!r} not shown: {why}")
            else:
                shown.append(name)
        return shown

    def _read_at_timestamp(self, name):
        """Whether libtiledb reads fragment ``name`` at the time travel asked for: one
        whose time range the asked one holds, or (format version 15 on) one that overlaps
        it and keeps a timestamp per cell (then filtered by them); a fragment whose
        metadata cannot be read is kept, to show its problem."""
        overlap = fragment_overlap(name, self.timestamp)
        if overlap != "partial":
            return overlap == "whole"
        try:
            return self.fragment(name)._load_meta().has_timestamps
        except CtdsfsError:
            return True

    def fragment(self, name):
        with self._lock:
            if name not in self._fragments:
                self._fragments[name] = Fragment(self, name)
            return self._fragments[name]

    def _schemas_folder(self):
        entries = OrderedDict()
        for name in self.schema_names:
            try:
                entries[name + ".json"] = json_bytes(schema_json(self.schema_named(name)))
            except CtdsfsError as exc:
                self.problems.append(str(exc))
        return entries

    def _build(self):
        entries = OrderedDict()
        entries["schema.json"] = json_bytes(schema_json(self.schema))
        entries["schemas"] = _Folder(f"{self.label}/schemas", self._schemas_folder)
        entries["metadata.json"] = json_bytes(self.metadata())
        entries["fragments"] = _Folder(f"{self.label}/fragments", lambda: OrderedDict(
            (name, self.fragment(name)) for name in self.fragment_names), True)
        if self.schema["array_type"] == 0:
            entries["dense"] = _Folder(f"{self.label}/dense", self._dense_folder)
        else:
            entries["sparse"] = _Folder(f"{self.label}/sparse", self._sparse_folder)
        if self._list("__fragment_meta", files_only=True):
            entries["fragment_meta"] = _Folder(f"{self.label}/fragment_meta",
                                               self._consolidated_metadata)
        return entries

    def _consolidated_metadata(self):
        """``__fragment_meta/NAME.meta`` (footers of several fragments, kept together so
        that opening reads one file) as NAME.json."""
        entries = OrderedDict()
        for name in self._list("__fragment_meta", files_only=True):
            what = f"{self.label}: __fragment_meta/{name}"
            try:
                data = ArrayFile(self.path, os.path.join("__fragment_meta", name)) \
                    .read_small(what)
                entries[name + ".json"] = json_bytes(self._footers(data, what))
            except CtdsfsError as exc:
                self.problems.append(str(exc))
                log.warning("%s", exc)
        return entries

    def _footers(self, data, what):
        body, _ = read_generic_tile(data, 0, what)
        r = Reader(body, what)
        listed = [(read_name(r, "Q"), r.unpack("Q")) for _ in range(r.count("I", 16))]
        ends = [offset for _, offset in listed[1:]] + [len(body)]
        footers = []
        for (name, start), end in zip(listed, ends):
            if not start <= end <= len(body):
                raise FormatError(f"{what}: footer of {name!r} at {start}..{end} is not inside")
            meta = FragmentMetadata(None, self.schema_named, f"{what}: {name}",
                                    footer=body[start:end])
            footers.append({"fragment": name, **meta.footer_json()})
        return {"fragments": footers}


    def info_lines(self, info):
        """``ctdsfs info`` as text, from what describe() gave."""
        schema = info["schema"]
        lines = [f"{info['container']}: TileDB {schema['array_type']} array, schema version "
                 f"{schema['version']}, {len(info['schemas'])} schema(s), "
                 f"{len(info['fragments'])} fragment(s)",
                 f"  order            tiles {schema['tile_order']}, cells {schema['cell_order']}, "
                 f"capacity {schema['capacity']}"]
        for kind, fields in (("dimension", schema["dimensions"]), ("attribute", schema["attributes"])):
            for f in fields:
                filters = "+".join(g["name"] for g in (f["filters"] or {"filters": []})["filters"])
                extra = f" domain {f['domain']} tile {f['tile_extent']}" if kind == "dimension" else ""
                lines.append(f"  {kind:<16} {f['name']}: {f['type']} x {f['cell_val_num']}"
                             f"{extra}{' nullable' if f.get('nullable') else ''}"
                             f" [{filters or 'no filters'}]")
        lines.append(f"  metadata keys    {', '.join(info['metadata']) or 'none'}")
        if "timestamp" in info:
            lines.append(f"  time travel      {info['timestamp'][0]} to {info['timestamp'][1]} "
                         f"ms: the fragments, schema and metadata read then")
        for frag in info["fragments"]:
            if "problem" in frag:
                lines.append(f"  fragment {frag['name']}: {frag['problem']}")
            else:
                lines.append(f"  fragment {frag['name']}: v{frag['version']}, {frag['tiles']} tiles, "
                             f"{frag['cells']} cells, non-empty domain {frag['non_empty_domain']}")
        lines += [f"  not shown: {why}" for why in info["not_shown"]]
        lines += [f"  problem: {p}" for p in info["problems"]]
        return lines

    def describe(self):
        info = {"container": self.label, "format": "TileDB",
                "schema": schema_json(self.schema), "schemas": self.schema_names,
                "metadata": self.metadata(), "fragments": []}
        for name in self.fragment_names:
            frag = self.fragment(name)
            entry = {"name": name, "timestamps": list(timestamps(name) or (0, 0))}
            try:
                meta = frag._load_meta()
                entry.update({"version": meta.version, "dense": meta.dense,
                              "non_empty_domain": meta.non_empty_domain,
                              "tiles": len(frag.cell_counts()),
                              "cells": sum(frag.cell_counts())})
            except CtdsfsError as exc:
                entry["problem"] = str(exc)
            info["fragments"].append(entry)
        info["problems"] = list(self.problems)
        info["not_shown"] = self.not_shown()
        if self.timestamp is not None:
            info["timestamp"] = list(self.timestamp)
        return info

    def not_shown(self):
        """What ctdsfs does not show of this intact array, by design, and why."""
        why = self._sparse_refusal() if self.schema["array_type"] == 1 else None
        return [f"sparse/: {why}"] if why else []

    def check(self, bar=None):
        """Every fragment's tiles decoded and checked, then what the array itself lacks."""
        problems, notes = [], []
        for name in self.fragment_names:
            p, n = self.fragment(name).check(bar)
            problems += p
            notes += n
        self.metadata()
        notes += [f"{self.label}: not shown: {why}" for why in self.not_shown()]
        return problems + [f"{self.label}: {p}" for p in dict.fromkeys(self.problems)], notes


def looks_like_directory(path):
    """An array folder: ``__schema`` is a directory (``__fragments`` may not exist yet), or
    (before version 10) ``__array_schema.tdb`` is a file; or a group folder
    (``__tiledb_group.tdb``); none of them a link."""
    return is_array(path) or kind_beneath(path, GROUP_MARKER, stat.S_ISREG)


def is_array(path):
    return kind_beneath(path, "__schema", stat.S_ISDIR) or \
        kind_beneath(path, LEGACY_SCHEMA, stat.S_ISREG)


def open_file(path, *, verify_crc=True, writable=False, timestamp=None):
    """The TileDB array (or group) folder at ``path``, always read-only (a read-write
    mount shows it too, refusing changes); checksums are always verified. ``timestamp``
    (start, end): the array as ``tiledb.open(path, timestamp=(start, end))`` reads it
    (a group's arrays too)."""
    if is_array(path):
        return TileDBArray(path, timestamp)
    return TileDBGroup(path, timestamp, lambda member: _open_member(member, timestamp))


def _open_member(path, timestamp):
    """A group's member: an array or a group as such; any other directory (a group holds
    only arrays and groups), or one that does not open, as its raw files, saying why."""
    if looks_like_directory(path):
        try:
            return open_file(path, timestamp=timestamp)
        except CtdsfsError as exc:
            why = f"not shown as a TileDB array: {exc}"
    else:
        why = "not a TileDB array or group"
    return mark_shown_raw(PlainDirectory(path), why)
