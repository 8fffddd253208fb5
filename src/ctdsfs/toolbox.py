"""Offline container jobs (``ctdsfs pack`` / ``unpack`` / ``convert``), through the
container interface.

``pack`` turns a directory tree into one container, subdirectories becoming
nested containers (a whole MeasurementSet in one file); ``unpack`` is the
reverse, byte for byte; ``convert`` copies one container into a new one of
another format (MultiFile v2, v1, MultiHDF5), keeping names, contents and
nesting. All show a progress bar with throughput and ETA on a terminal, and
stay quiet otherwise or with ``quiet``.
"""

import os
import queue
import shutil
import sys
import tempfile
import threading

import numpy as np

from .errors import CtdsfsError
from .formats import create_container, open_container, refuse_existing
from .io.store import open_regular

CHUNK = 4 << 20
# Block sizes a pack may choose (casacore reads any): the largest that keeps the
# container within PACKED_GROWTH_MAX of the tree's bytes, counting each file's
# last partial block, 8 header bytes per block, and a header block plus a
# partial parent block per nested directory. Big blocks keep block lists short
# and reads in long runs; small files need small blocks.
CHOSEN_BLOCK_SIZES = tuple(1 << k for k in range(22, 8, -1))  # 4 MiB down to 512 bytes
PACKED_GROWTH_MAX = 1.05


class SilentBar:
    """What a progress bar is off a terminal: nothing (tqdm, a tenth of a second of a
    command's start, is imported only for a bar shown)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass


def progress_bar(total, quiet, what):
    """A tqdm bar with throughput and ETA on a terminal; silent off one or with ``quiet``."""
    if quiet or not sys.stderr.isatty():
        return SilentBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=what,
                leave=False)


def _tree_sizes(path):
    """(sizes of the files under ``path``, number of subdirectories), links not followed."""
    sizes, directories = [], 0
    for dirpath, dirs, files in os.walk(path):
        directories += len(dirs)
        sizes += [os.lstat(os.path.join(dirpath, f)).st_size for f in files]
    return sizes, directories


def _tree_size(path):
    return sum(_tree_sizes(path)[0])


def choose_block_size(sizes, directories=0):
    """The largest of CHOSEN_BLOCK_SIZES whose container of files of ``sizes`` (and
    ``directories`` nested containers) stays within PACKED_GROWTH_MAX of their bytes."""
    sizes = np.asarray(sizes, dtype=np.int64)
    allowed = PACKED_GROWTH_MAX * int(sizes.sum())
    for block_size in CHOSEN_BLOCK_SIZES:
        blocks = int((-(-sizes // block_size)).sum()) + 2 * directories
        if blocks * (block_size + 8) <= allowed:
            return block_size
    return CHOSEN_BLOCK_SIZES[-1]


def pack(source, output, *, format="mf2", block_size=None, use_crc=False, quiet=False):
    """One container holding the tree at ``source``; ``output`` must not exist. Without
    a ``block_size`` one is chosen from the tree. Returns the block size used."""
    if not os.path.isdir(source):
        raise CtdsfsError(f"{source}: not a directory")
    sizes, directories = _tree_sizes(source)
    block_size = block_size or choose_block_size(sizes, directories)
    _build(output, sum(sizes), "pack", lambda c, bar: _pack_into(c, source, bar), quiet,
           format=format, block_size=block_size, use_crc=use_crc)
    return block_size


def _build(output, total, what, fill, quiet, **options):
    """A new container at ``output`` filled by ``fill(container, bar)``; on any failure
    nothing is left behind."""
    container = create_container(output, **options)
    try:
        with progress_bar(total, quiet, what) as bar:
            fill(container, bar)
        container.close()
    except BaseException:
        container.abandon()
        for leftover in (output, output + "_hdrext"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise


def _pack_into(container, directory, bar):
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.islink(path):
            raise CtdsfsError(f"{path}: symbolic links cannot be packed")
        if os.path.isdir(path):
            _pack_into(container.make_nested(name), path, bar)
        elif os.path.isfile(path):
            _copy_file(container, name, _file_chunks(path), bar)
        else:
            raise CtdsfsError(f"{path}: only files and directories can be packed")


def _prefetched(chunks, depth=4):
    """``chunks`` produced by a reader thread up to ``depth`` ahead, so reading the
    source and writing the target overlap (both release the GIL)."""
    results = queue.Queue(depth)
    done = object()
    stop = threading.Event()

    def produce():
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                results.put(chunk)
            results.put(done)
        except BaseException as exc:  # handed to the consumer, raised there
            results.put(exc)

    reader = threading.Thread(target=produce, daemon=True)
    reader.start()
    try:
        while (item := results.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # let a blocked producer finish
            try:
                results.get_nowait()
            except queue.Empty:
                reader.join(0.01)


def _copy_file(container, name, chunks, bar):
    """A new virtual file ``name`` in ``container`` holding the bytes of ``chunks``."""
    container.create(name)
    offset = 0
    for chunk in _prefetched(chunks):
        container.write(name, offset, chunk)
        offset += len(chunk)
        bar.update(len(chunk))


def _file_chunks(path):
    """The bytes of regular file ``path`` (one that became a FIFO or a device since it was
    looked at is refused in one line, never opened)."""
    with os.fdopen(open_regular(path), "rb") as f:
        yield from iter(lambda: f.read(CHUNK), b"")


def _chunks(container, name):
    size = container.entry_size(name)
    return (bytes(container.read(name, offset, CHUNK)) for offset in range(0, size, CHUNK))


def convert(source, output, *, format="mf2", block_size=None, use_crc=False, quiet=False):
    """``source`` copied into the new container ``output`` of ``format`` (mf2, mf1, hdf5)."""
    src = open_container(source)
    try:
        _build(output, _size_that_fits(src, output), "convert",
               lambda dst, bar: _copy_tree(src, dst, bar), quiet,
               format=format, block_size=block_size or src.usage().block_size,
               use_crc=use_crc)
    finally:
        src.close()


def _copy_tree(src, dst, bar):
    for name in src.names():
        child = src.nested(name)
        if child is not None:
            _copy_tree(child, dst.make_nested(name), bar)
        else:
            _copy_file(dst, name, _chunks(src, name), bar)


def _container_size(container):
    total = 0
    for name in container.names():
        child = container.nested(name)
        total += _container_size(child) if child is not None else container.entry_size(name)
    return total


def _size_that_fits(container, target):
    """The bytes ``container`` holds, refused up front if more than ``target``'s file system
    has free: sizes come from the container (a hostile one may claim petabytes)."""
    total = _container_size(container)
    directory = os.path.dirname(os.path.abspath(target))
    try:
        st = os.statvfs(directory)
    except OSError:
        return total  # (the write that follows names the missing directory)
    if total > st.f_bavail * st.f_frsize:
        raise CtdsfsError(f"{container.label}: its files hold {total} bytes, more than the "
                          f"{st.f_bavail * st.f_frsize} free in {directory}")
    return total


def unpack(source, output, *, quiet=False):
    """The tree a container holds, written to ``output`` (which must not exist)."""
    refuse_existing(output)
    container = open_container(source)
    parent = os.path.dirname(os.path.abspath(output))
    staging = tempfile.mkdtemp(prefix=".ctdsfs-unpack-", dir=parent)
    try:
        with progress_bar(_size_that_fits(container, output), quiet, "unpack") as bar:
            _unpack_into(container, staging, bar)
        os.rename(staging, output)  # the tree appears whole or not at all
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        container.close()


def _unpack_into(container, directory, bar):
    for name in container.names():  # names were validated when the container was read
        path = os.path.join(directory, name)
        link = container.symlink_target(name)
        if link is not None:  # a directory source's link stays a link (never followed)
            os.symlink(link, path)
            continue
        child = container.nested(name)
        if child is not None:
            os.mkdir(path)
            _unpack_into(child, path, bar)
            continue
        with open(path, "wb") as f:
            for data in _prefetched(_chunks(container, name)):
                f.write(data)
                bar.update(len(data))


# ---------------------------------------------------------------- table storage

def _exchange(a, b):
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange):
        err = ctypes.get_errno()
        raise CtdsfsError(f"cannot swap {a} and {b}: {os.strerror(err)}")


def _replace_tree(table, build):
    """Build the new form of ``table`` beside it, swap it in, drop the old form.

    A crash leaves the old form (with a stray ``.ctdsfs-new`` beside it) or the
    new one (with a stray ``.ctdsfs-old``): the table always opens.
    """
    table = os.path.abspath(table)
    staging, old = table + ".ctdsfs-new", table + ".ctdsfs-old"
    for leftover in (staging, old):  # from a run that crashed
        if os.path.lexists(leftover):
            shutil.rmtree(leftover)
    try:
        build(staging)
        with open(os.path.join(staging, "table.dat"), "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _exchange(staging, table)
    os.rename(staging, old)
    shutil.rmtree(old)


def _require_table(table):
    if not os.path.isfile(os.path.join(table, "table.dat")):
        raise CtdsfsError(f"{table}: not a casacore table (no table.dat)")


def to_sepfile(table, *, quiet=False):
    """Store a MultiFile table tree (subtables too) as separate files, in place."""
    from .sources.directory import directory_or_table

    _require_table(table)
    view = directory_or_table(os.path.abspath(table))
    try:
        total = _size_that_fits(view, table)

        def build(staging):
            os.mkdir(staging)
            with progress_bar(total, quiet, "to-sepfile") as bar:
                _unpack_into(view, staging, bar)
        _replace_tree(table, build)
    finally:
        view.close()


def to_multifile(table, *, block_size=None, use_crc=False, quiet=False):
    """Store a table tree in separate files as MultiFile tables (subtables too), in place.
    Without a ``block_size`` each table's is chosen from its own storage manager files.
    Returns ``[(table directory, block size)]``."""
    from .formats.casacore import tabledat

    _require_table(table)
    chosen = []

    def convert_dir(src, dst, bar):
        os.mkdir(dst)
        names = sorted(os.listdir(src))
        is_table = "table.dat" in names
        if is_table and "table.mf" not in names:
            for name in names:
                if name.startswith("table.f") and os.path.islink(os.path.join(src, name)):
                    raise CtdsfsError(f"{os.path.join(src, name)}: a symbolic link cannot be "
                                      "stored in a MultiFile")

            manager_files = [name for name in names if name.startswith("table.f")
                             and os.path.isfile(os.path.join(src, name))]
            table_block_size = block_size or choose_block_size(
                [os.lstat(os.path.join(src, name)).st_size for name in manager_files])
            chosen.append((src, table_block_size))

            def fill(container, bar):
                for name in manager_files:
                    _copy_file(container, name, _file_chunks(os.path.join(src, name)), bar)
            _build(os.path.join(dst, "table.mf"), 0, "to-multifile", fill, True,
                   block_size=table_block_size, use_crc=use_crc)
        for name in names:
            path = os.path.join(src, name)
            if os.path.islink(path):  # a link stays a link, never followed
                os.symlink(os.readlink(path), os.path.join(dst, name))
            elif os.path.isdir(path):
                convert_dir(path, os.path.join(dst, name), bar)
            elif is_table and name == "table.dat" and "table.mf" not in names:
                with open(path, "rb") as f:
                    stored = tabledat.decode(f.read(), path)
                with open(os.path.join(dst, name), "wb") as f:
                    f.write(stored.with_storage("MultiFile", table_block_size).encode())
            elif not (is_table and "table.mf" not in names and name.startswith("table.f")):
                shutil.copy2(path, os.path.join(dst, name))
            bar.update(os.lstat(path).st_size)

    with progress_bar(_tree_size(table), quiet, "to-multifile") as bar:
        _replace_tree(table, lambda staging: convert_dir(os.path.abspath(table), staging, bar))
    return chosen
