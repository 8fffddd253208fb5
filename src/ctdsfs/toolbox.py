"""Offline container jobs (``ctdsfs pack`` / ``unpack``), through the container interface.

``pack`` turns a directory tree into one container, subdirectories becoming
nested containers (a whole MeasurementSet in one file); ``unpack`` is the
reverse, byte for byte. Both show a progress bar with throughput and ETA on a
terminal, and stay quiet otherwise or with ``quiet``.
"""

import os
import shutil
import sys
import tempfile

from tqdm import tqdm

from .container import create_container, open_container
from .errors import CtdsfsError

CHUNK = 4 << 20


def _progress(total, quiet, what):
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=what,
                disable=quiet or not sys.stderr.isatty(), leave=False)


def _tree_size(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return total


def pack(source, output, *, block_size=4 << 20, use_crc=False, version=2, quiet=False):
    """One container holding the tree at ``source``; ``output`` must not exist."""
    if not os.path.isdir(source):
        raise CtdsfsError(f"{source}: not a directory")
    container = create_container(output, block_size=block_size, use_crc=use_crc,
                                 version=version)
    try:
        with _progress(_tree_size(source), quiet, "pack") as bar:
            _pack_into(container, source, bar)
        container.close()
    except BaseException:
        container.store.close()
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
            container.create(name)
            with open(path, "rb") as f:
                offset = 0
                while chunk := f.read(CHUNK):
                    container.write(name, offset, chunk)
                    offset += len(chunk)
                    bar.update(len(chunk))
        else:
            raise CtdsfsError(f"{path}: only files and directories can be packed")


def _container_size(container):
    total = 0
    for name in container.names():
        child = container.nested(name)
        total += _container_size(child) if child is not None else container.entry_size(name)
    return total


def unpack(source, output, *, quiet=False):
    """The tree a container holds, written to ``output`` (which must not exist)."""
    if os.path.lexists(output):
        raise CtdsfsError(f"{output}: already exists")
    container = open_container(source)
    parent = os.path.dirname(os.path.abspath(output))
    staging = tempfile.mkdtemp(prefix=".ctdsfs-unpack-", dir=parent)
    try:
        with _progress(_container_size(container), quiet, "unpack") as bar:
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
        child = container.nested(name)
        if child is not None:
            os.mkdir(path)
            _unpack_into(child, path, bar)
            continue
        size = container.entry_size(name)
        with open(path, "wb") as f:
            for offset in range(0, size, CHUNK):
                data = container.read(name, offset, CHUNK)
                f.write(data)
                bar.update(len(data))
