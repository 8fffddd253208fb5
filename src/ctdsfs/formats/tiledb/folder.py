"""A TileDB folder (an array's or a group's): what both hold and how they are read.

Both keep their metadata in ``__meta``; both are listed without following a link
anywhere below the folder the user named (``beneath``), so nothing outside is read.
A group is shown as its own ``metadata.json`` beside its members, each shown as a
directory source shows it (an array as an array, a nested group as a group).
"""

import logging
import os
import stat
from collections import OrderedDict

from ...container import name_problem
from ...errors import CtdsfsError, FormatError
from ...io.beneath import kind_beneath, listdir_beneath
from .fragment import TileDBDirectory
from .fragment_meta import ArrayFile, by_time
from .schema import json_bytes, metadata_as_tiledb_py, parse_metadata
from .time import in_time

log = logging.getLogger(__name__)

GROUP_MARKER = "__tiledb_group.tdb"  # the file every group folder holds


class TileDBFolder(TileDBDirectory):
    """An array or group folder: its listing and its metadata."""

    timestamp = None  # (start, end) of time travel: the metadata files in it count

    def __init__(self, path):
        super().__init__(os.fspath(path))
        self.path = os.fspath(path)

    def _list(self, folder, files_only=False):
        """The names in ``folder`` of this folder, sorted (only regular files if
        ``files_only``). No link is followed on the way or in it: a folder that is a
        link (to somewhere outside, maybe) is not read, and ``problems`` says so."""
        try:
            names = sorted(listdir_beneath(self.path, folder))
        except FileNotFoundError:
            return []
        except OSError as exc:
            if kind_beneath(self.path, folder, stat.S_ISLNK):
                self._note(f"{folder}: a link, not followed (ctdsfs reads nothing outside "
                           f"the array)")
                return []
            raise FormatError(f"{self.label}: {folder}: {exc.strerror}") from None
        if files_only:
            names = [n for n in names
                     if kind_beneath(self.path, os.path.join(folder, n), stat.S_ISREG)]
        return names

    def _note(self, problem):
        if problem not in self.problems:
            self.problems.append(problem)


    def metadata(self):
        """``__meta`` applied oldest first, keyed as tiledb-py shows it."""
        values = {}
        for name in by_time(self._list("__meta", files_only=True)):
            if name.endswith(".vac") or not in_time(name, self.timestamp):
                continue
            what = f"{self.label}: __meta/{name}"
            try:
                parse_metadata(ArrayFile(self.path, os.path.join("__meta", name))
                               .read_small(what), what, values)
            except CtdsfsError as exc:
                self.problems.append(str(exc))
                log.warning("%s", exc)
        return metadata_as_tiledb_py(values)


class TileDBGroup(TileDBFolder):
    """A group folder: metadata.json (the group's own metadata) and its members."""

    def __init__(self, path, timestamp, open_member):
        super().__init__(path)
        self.timestamp = timestamp  # its metadata's and its members' time travel
        self.open_member = open_member  # a member's path -> its container (array.py's)

    def _build(self):
        entries = OrderedDict()
        entries["metadata.json"] = json_bytes(self.metadata())
        for name in self._list("."):
            if name.startswith("__"):
                continue  # (the group's own files: __meta, __group, the marker)
            why = name_problem(name) or ("name used twice" if name in entries else None)
            if not why and not kind_beneath(self.path, name, stat.S_ISDIR):
                why = "not a directory (a group holds arrays and groups)"
            if why:
                self._note(f"{name!r} not shown: {why}")
                continue
            entries[name] = self.open_member(os.path.join(self.path, name))
        return entries

    def describe(self):
        return {"container": self.label, "format": "TileDB group",
                "metadata": self.metadata(), "members": [
                    n for n in self.names() if n != "metadata.json"],
                "problems": list(self.problems)}

    def info_lines(self, info):
        return [f"{info['container']}: TileDB group, {len(info['members'])} member(s)",
                f"  metadata keys    {', '.join(info['metadata']) or 'none'}"] + \
            [f"  member           {m}" for m in info["members"]] + \
            [f"  problem: {p}" for p in info["problems"]]

    def check(self, bar=None):
        self.names()
        self.metadata()
        return [f"{self.label}: {p}" for p in dict.fromkeys(self.problems)], []
