"""The floor of the pyfuse3+trio stack, for the benchmark's small-files, remote, TileDB and
columns parts.

The thinnest pyfuse3+trio file systems doing what ctdsfs does, so what they cost is
the least any pyfuse3+trio file system (ctdsfs among them) pays here:
- ``serve``: a directory tree, names, kinds and sizes from a listing saved before
  timing, so a mount, a ``find`` or an ``ls -lR`` through it costs only what pyfuse3,
  trio and the kernel cost. It imports neither numpy nor ctdsfs, so its start is
  Python's and pyfuse3's alone.
- ``serve_object``: one S3 object as one file, read by the same ranged GETs as the
  benchmark's raw baselines (8 MiB, 8 in flight, sequential readahead; botocore or
  obstore), each reply a view of the fetched bytes; or, with ``memory``, fetched
  whole before the mount and served from memory: what the FUSE path alone costs.
- ``serve_files``: local files read whole into memory before the mount and served
  under new names, for the TileDB and columns parts: given the decoded .npy files
  (saved from the native library), ``np.load`` through it costs what any
  pyfuse3+trio file system pays to hand NumPy those bytes, nothing decoded; with
  ``--hop`` each read is answered from a worker thread, as a file system that reads a
  disk for it must (its loop stays free meanwhile): what that hop adds.

    python3 scripts/pyfuse3_floor.py LISTING ROOT MOUNTPOINT        # serves until unmounted
    python3 scripts/pyfuse3_floor.py s3 botocore|obstore|memory ENDPOINT BUCKET KEY MOUNTPOINT
    python3 scripts/pyfuse3_floor.py files [--hop] MOUNTPOINT NAME=PATH ...
"""

import errno
import os
import pickle
import stat
import sys
import time


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
    with open(listing_path, "rb") as f:
        listing = pickle.load(f)  # relative directory -> [(name, is_dir, size)]
    _serve_tree(listing, os.stat(listing_path).st_mtime_ns, mountpoint,
                lambda path: os.open(os.path.join(root, path), os.O_RDONLY),
                lambda fh, off, size: os.pread(fh, size, off), os.close)


def _serve_tree(listing, mtime_ns, mountpoint, open_file, read, release, hop=False):
    """Serve ``listing`` (relative directory -> [(name, is_dir, size)]) until unmounted:
    ``open_file(path)`` gives a file handle (an int), ``read(fh, offset, size)`` its
    bytes (called in a worker thread with ``hop``), ``release(fh)`` ends it."""
    import pyfuse3
    import trio

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
            return pyfuse3.FileInfo(fh=open_file(paths[ino]), keep_cache=True)

        async def read(self, fh, off, size):
            if hop:
                return await trio.to_thread.run_sync(read, fh, off, size)
            return read(fh, off, size)

        async def release(self, fh):
            release(fh)

    pyfuse3.init(Floor(), mountpoint, {"ro", "fsname=floor"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


def _ranged_get(library, endpoint, bucket, key, concurrency):
    """(size, mtime_ns, ``get(start, end)``) of the object through ``library`` (``memory``:
    fetched whole by botocore now); the credentials come from the AWS environment."""
    if library == "memory":
        size, mtime_ns, get = _ranged_get("botocore", endpoint, bucket, key, concurrency)
        whole = memoryview(get(0, size))
        return size, mtime_ns, lambda start, end: whole[start:end]
    if library == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(bucket, endpoint=endpoint, region="us-east-1",
                        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                        client_options={"allow_http": True})
        meta = obstore.head(store, key)
        return meta["size"], int(meta["last_modified"].timestamp() * 1e9), \
            lambda start, end: obstore.get_range(store, key, start=start, end=end)
    import botocore.config
    import botocore.session

    client = botocore.session.Session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", config=botocore.config.Config(
            max_pool_connections=concurrency + 2, s3={"addressing_style": "path"}))
    head = client.head_object(Bucket=bucket, Key=key)
    return head["ContentLength"], int(head["LastModified"].timestamp() * 1e9), \
        lambda start, end: client.get_object(Bucket=bucket, Key=key,
                                             Range=f"bytes={start}-{end - 1}")["Body"].read()


def serve_object(library, endpoint, bucket, key, mountpoint, concurrency=8, chunk=8 << 20,
                 readahead=8):
    """The floor of the stack for the remote part: object ``key`` as the file ``object``,
    read in ``chunk``-byte ranged GETs by ``concurrency`` threads (``library``: botocore,
    obstore, or memory), the chunks after the one read asked for ``readahead`` ahead and those
    behind dropped; a read waits in a thread only for a chunk not fetched yet. No retries,
    versions, caches or checks: any pyfuse3+trio file system reading S3 through that
    library pays at least this."""
    from concurrent.futures import ThreadPoolExecutor

    import pyfuse3
    import trio

    size, mtime_ns, ranged_get = _ranged_get(library, endpoint, bucket, key, concurrency)
    count = -(-size // chunk)
    pool = ThreadPoolExecutor(concurrency)
    chunks = {}  # index -> Future of its bytes (touched only on trio's thread)

    def get(i):
        return ranged_get(i * chunk, min((i + 1) * chunk, size))

    def wanted(i):
        for j in range(i, min(i + 1 + readahead, count)):
            if j not in chunks:
                chunks[j] = pool.submit(get, j)
        for j in [j for j in chunks if j < i - 1]:
            del chunks[j]
        return chunks[i]

    def attr(ino):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = (stat.S_IFDIR | 0o555) if ino == pyfuse3.ROOT_INODE else (stat.S_IFREG | 0o444)
        a.st_nlink = 1
        a.st_size = 0 if ino == pyfuse3.ROOT_INODE else size
        a.st_blksize = 4096
        a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = mtime_ns
        a.entry_timeout = a.attr_timeout = 86400
        return a

    class ObjectFloor(pyfuse3.Operations):
        async def lookup(self, parent, name, ctx=None):
            if parent != pyfuse3.ROOT_INODE or name != b"object":
                raise pyfuse3.FUSEError(errno.ENOENT)
            return attr(2)

        async def getattr(self, ino, ctx=None):
            return attr(ino)

        async def open(self, ino, flags, ctx):
            return pyfuse3.FileInfo(fh=ino)

        async def read(self, fh, off, length):
            end = min(off + length, size)
            pieces = []
            for i in range(off // chunk, (end - 1) // chunk + 1) if off < end else ():
                future = wanted(i)
                data = future.result() if future.done() \
                    else await trio.to_thread.run_sync(future.result)
                pieces.append(memoryview(data)[max(off - i * chunk, 0):end - i * chunk])
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    pyfuse3.init(ObjectFloor(), mountpoint, {"ro", "fsname=floor"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
        pool.shutdown(cancel_futures=True)


def serve_files(*args):
    """The floor of the stack for the decoded views: each ``NAME=PATH`` of ``specs`` read
    whole into memory before the mount, then served as the file NAME at the root, each
    read reply a view of those bytes (no copy, no check, kernel timeouts of a day,
    keep_cache). Whatever a view decodes, any pyfuse3+trio file system handing the
    decoded bytes to a reader pays at least this. ``--hop`` first: each read answered
    from a worker thread."""
    hop = args[:1] == ("--hop",)
    mountpoint, *specs = args[hop:]
    names, data = [], []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or "/" in name or name in names:
            sys.exit(f"pyfuse3_floor.py files: NAME=PATH expected, one per NAME: {spec!r}")
        with open(path, "rb") as f:
            data.append(memoryview(f.read()))
        names.append(name)
    listing = {"": [(name, False, len(view)) for name, view in zip(names, data)]}
    _serve_tree(listing, time.time_ns(), mountpoint, names.index,
                lambda fh, off, size: data[fh][off:off + size], lambda fh: None, hop)


if __name__ == "__main__":
    if sys.argv[1:2] == ["files"]:
        sys.exit(serve_files(*sys.argv[2:]))
    if sys.argv[1:2] == ["s3"]:
        sys.exit(serve_object(*sys.argv[2:7]))
    sys.exit(serve(*sys.argv[1:4]))
