"""The floor of the pyfuse3+trio stack, for the benchmark's small-files part.

The thinnest pyfuse3+trio file system that serves a directory tree: names, kinds
and sizes come from a listing saved before timing, so a mount, a ``find`` or an
``ls -lR`` through it costs only what pyfuse3, trio and the kernel cost. What it
measures is the least any pyfuse3+trio file system (ctdsfs among them) pays; it
imports neither numpy nor ctdsfs, so its start is Python's and pyfuse3's alone.

    python3 scripts/pyfuse3_floor.py LISTING ROOT MOUNTPOINT   # serves until unmounted
"""

import errno
import os
import pickle
import stat
import sys


def save_listing(root, out):
    """The listing ``serve`` serves: relative directory -> [(name, is_dir, size)]."""
    listing = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        listing["" if rel == "." else rel] = (
            [(name, True, 0) for name in sorted(dirnames)]
            + [(name, False, os.lstat(os.path.join(dirpath, name)).st_size)
               for name in sorted(filenames)])
    with open(out, "wb") as f:
        pickle.dump(listing, f)


def serve(listing_path, root, mountpoint):
    """The floor of the stack for the small-files part: the thinnest pyfuse3+trio file
    system serving a tree, everything precomputed (names, kinds and sizes from a listing
    saved before timing, an inode on first sight, kernel timeouts of a day, keep_cache,
    reads by os.pread on the real file). Any pyfuse3+trio file system pays at least its
    mount time and its find."""
    import pyfuse3
    import trio

    with open(listing_path, "rb") as f:
        listing = pickle.load(f)  # relative directory -> [(name, is_dir, size)]
    mtime_ns = os.stat(listing_path).st_mtime_ns
    paths, info, kids = {pyfuse3.ROOT_INODE: ""}, {pyfuse3.ROOT_INODE: (True, 0)}, {}

    def children(ino):  # name -> inode, numbered when the directory is first seen
        found = kids.get(ino)
        if found is None:
            found = kids[ino] = {}
            base = paths[ino]
            for name, is_dir, size in listing.get(base, ()):
                child = found[name] = len(paths) + 1
                paths[child] = f"{base}/{name}" if base else name
                info[child] = (is_dir, size)
        return found

    def attr(ino):
        is_dir, size = info[ino]
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = (stat.S_IFDIR | 0o555) if is_dir else (stat.S_IFREG | 0o444)
        a.st_nlink = 1
        a.st_size = size
        a.st_blksize = 4096
        a.st_blocks = (size + 511) // 512
        a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = mtime_ns
        a.entry_timeout = a.attr_timeout = 86400
        return a

    class Floor(pyfuse3.Operations):
        async def lookup(self, parent, name, ctx=None):
            ino = children(parent).get(os.fsdecode(name))
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return attr(ino)

        async def getattr(self, ino, ctx=None):
            return attr(ino)

        async def opendir(self, ino, ctx):
            return ino

        async def readdir(self, fh, start, token):
            items = list(children(fh).items())
            for i in range(start, len(items)):
                name, ino = items[i]
                if not pyfuse3.readdir_reply(token, os.fsencode(name), attr(ino), i + 1):
                    return

        async def open(self, ino, flags, ctx):
            fd = os.open(os.path.join(root, paths[ino]), os.O_RDONLY)
            return pyfuse3.FileInfo(fh=fd, keep_cache=True)

        async def read(self, fh, off, size):
            return os.pread(fh, size, off)

        async def release(self, fh):
            os.close(fh)

    pyfuse3.init(Floor(), mountpoint, {"ro", "fsname=floor"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


if __name__ == "__main__":
    sys.exit(serve(*sys.argv[1:4]))
