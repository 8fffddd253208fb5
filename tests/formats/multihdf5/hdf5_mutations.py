"""Hostile MultiHDF5 files made with h5py from real ones: escapes out of the file, cycles,
aliases, filters, huge claims. Used by the trust tests and by the fuzz test's child process.

Every escape points at ``secret.bin`` / ``secret.h5`` planted beside the container, whose
bytes all repeat MARKER: no byte ctdsfs serves may ever contain it.
"""

import os

import h5py
import numpy as np

HEADER = "__MultiHDF5_Header__"
MARKER = b"<ctdsfs-escape-marker>"
SECRET_ROWS = 4


def _marker_bytes(size):
    return (MARKER * (size // len(MARKER) + 1))[:size]


def plant_secrets(directory, block_size):
    """secret.bin (raw bytes) and secret.h5 (a MultiHDF5-shaped file) beside the container."""
    raw = _marker_bytes(SECRET_ROWS * block_size)
    with open(os.path.join(directory, "secret.bin"), "wb") as f:
        f.write(raw)
    with h5py.File(os.path.join(directory, "secret.h5"), "w") as f:
        f.create_dataset("g/FileData", data=np.frombuffer(raw, np.uint8).reshape(SECRET_ROWS, -1))
        header = f.create_group(HEADER).attrs
        header["blockSize"] = np.int64(block_size)
        header["hdrCounter"] = np.int64(1)
        header.create("names", ["g"], dtype=h5py.string_dtype("ascii"))
        header["sizes"] = np.array([len(raw)], np.int64)


def containers(f):
    """Every container group of the file (root first, nested ones after) as (group, names)."""
    out = []

    def visit(group):
        names = [n for n in _names(group) if n and n in group]
        out.append((group, names))
        for name in names:
            if isinstance(group[name], h5py.Group) and HEADER in group[name]:
                visit(group[name])
    visit(f)
    return out


def add_entry(group, name, size):
    """List one more entry in the container group's header."""
    attrs = group[HEADER].attrs
    names = _names(group)
    sizes = [int(s) for s in np.atleast_1d(attrs["sizes"])] if names else []
    attrs.create("names", names + [name], dtype=h5py.string_dtype("ascii"))
    attrs.create("sizes", np.array(sizes + [size], np.int64))


def set_size(group, name, size):
    attrs = group[HEADER].attrs
    sizes = np.array(attrs["sizes"], np.int64)
    sizes[_names(group).index(name)] = size
    attrs["sizes"] = sizes


def _block_size(group):
    return int(group[HEADER].attrs["blockSize"])


def _replace_data(group, name, **create):
    del group[name]["FileData"]
    return group[name].create_dataset("FileData", **create)


def external_storage(group, name, directory):
    bs = _block_size(group)
    _replace_data(group, name, shape=(SECRET_ROWS, bs), dtype=np.uint8,
                  external=[(os.path.join(directory, "secret.bin"), 0, SECRET_ROWS * bs)])


def external_link_group(group, name, directory):
    del group[name]
    group[name] = h5py.ExternalLink(os.path.join(directory, "secret.h5"), "/g")


def external_link_data(group, name, directory):
    del group[name]["FileData"]
    group[name]["FileData"] = h5py.ExternalLink(os.path.join(directory, "secret.h5"),
                                                "/g/FileData")


def external_link_header(group, name, directory):
    del group[HEADER]
    group[HEADER] = h5py.ExternalLink(os.path.join(directory, "secret.h5"), "/" + HEADER)


def virtual_dataset(group, name, directory):
    bs = _block_size(group)
    layout = h5py.VirtualLayout((SECRET_ROWS, bs), np.uint8)
    layout[:] = h5py.VirtualSource(os.path.join(directory, "secret.h5"), "/g/FileData",
                                   shape=(SECRET_ROWS, bs))
    del group[name]["FileData"]
    group[name].create_virtual_dataset("FileData", layout)


def soft_link(group, name, directory):
    target = _other(group, name) or group  # (the container itself when it holds one file)
    del group[name]
    group[name] = h5py.SoftLink(target.name)


def hard_alias(group, name, directory):
    target = _other(group, name) or group
    del group[name]
    group[name] = target


def shared_data(group, name, directory):
    other = _other(group, name)
    if other is not None and "FileData" in other:
        del group[name]["FileData"]
        group[name]["FileData"] = other["FileData"]


def loop_to_root(group, name, directory):
    """Two hard links back to the file's root: without cycle detection every walk doubles."""
    for loop in ("loop1", "loop2"):
        group[loop] = group.file["/"]
        add_entry(group, loop, 0)


def gzip_filter(group, name, directory):
    data = group[name]["FileData"][...]
    bs = _block_size(group)
    _replace_data(group, name, data=data, chunks=(1, bs), maxshape=(None, bs),
                  compression="gzip", shuffle=True)


def huge_dims(group, name, directory):
    bs = _block_size(group)
    _replace_data(group, name, shape=(1 << 40, bs), chunks=(1, bs), maxshape=(None, bs),
                  dtype=np.uint8)
    set_size(group, name, (1 << 40) * bs - 1)


def too_many_names(group, name, directory):
    """More names than casacore can write: only a header group made anew (a version-2
    object header, dense attribute storage) can hold them."""
    block_size = _block_size(group)
    del group[HEADER]
    attrs = group.create_group(HEADER).attrs
    attrs["blockSize"], attrs["hdrCounter"] = np.int64(block_size), np.int64(1)
    attrs.create("names", [f"n{i}" for i in range(5000)], dtype=h5py.string_dtype("ascii"))
    attrs.create("sizes", np.zeros(5000, np.int64))


def _other(group, name):
    """Another entry's group in the same container, or None."""
    others = [n for n in _names(group) if n and n != name and n in group]
    return group[others[0]] if others else None


def _names(group):
    value = group[HEADER].attrs["names"]
    if getattr(value, "dtype", None) is not None and value.dtype.names:  # casacore's empty []
        return []
    return [n.decode() if isinstance(n, bytes) else str(n) for n in np.atleast_1d(value)]


ESCAPES = (external_storage, external_link_group, external_link_data, virtual_dataset)
STRUCTURAL = ESCAPES + (external_link_header, soft_link, hard_alias, shared_data, loop_to_root,
                        gzip_filter, huge_dims, too_many_names)


def open_for_mutation(path):
    return h5py.File(path, "r+", libver="v110")  # (lets an attribute exceed 64 KiB)


def mutate(path, mutation, rng, directory):
    """Apply ``mutation`` to a random plain file entry of a random container in ``path``."""
    with open_for_mutation(path) as f:
        choices = []
        for group, names in containers(f):
            plain = [n for n in names if HEADER not in group[n] and "FileData" in group[n]]
            choices += [(group, n) for n in plain]
        group, name = rng.choice(choices)
        mutation(group, name, directory)


def metadata_offsets(path):
    """Offsets of the bytes of ``path`` that are not dataset contents: HDF5's own structures,
    where a flipped byte tests the library rather than the data."""
    size = os.path.getsize(path)
    metadata = np.ones(size, bool)
    with h5py.File(path, "r") as f:
        def visit(_, item):
            if isinstance(item, h5py.Dataset) and item.chunks is not None:
                def clear(info):
                    metadata[info.byte_offset:info.byte_offset + info.size] = False
                item.id.chunk_iter(clear)
        f.visititems(visit)
    return np.flatnonzero(metadata)
