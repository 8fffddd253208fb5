"""The decoders' hot loops compiled to machine code by numba: one pass over the values
instead of NumPy's many, and without the GIL, so the threads decoding ahead run side by
side. Imported only by the kernel modules (:mod:`.dysco_kernels`, :mod:`.sisco_predict`),
which the readers of the managers that need them load when such a column is opened: a
mount of other tables never pays numba's import.

numba compiles a kernel at its first call in a new install and keeps the machine code in
a cache: beside the module when its directory is writable, else in the user's cache
directory (``~/.cache/numba``); when neither is, in a directory of the system's temporary
directory that is the user's alone, else nowhere (each process compiles them), instead
of refusing to load. numba does not check indices:
every kernel checks each index it computes from a file's bytes itself.
"""

import os
import stat
import tempfile

import numba


def _temporary_cache():
    """A directory of the system's temporary directory that is this user's alone, or None:
    numba's cache holds pickles, which another user could plant in one of theirs."""
    path = os.path.join(tempfile.gettempdir(), f"ctdsfs-numba-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    held = os.lstat(path)
    if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid() or held.st_mode & 0o077:
        return None
    return path


def kernel(func):
    """``func`` compiled (cached, releasing the GIL)."""
    try:
        return numba.njit(cache=True, nogil=True)(func)
    except RuntimeError:  # (numba found no writable cache directory)
        path = _temporary_cache()
        if path is None:  # (compiled in each process that uses it)
            return numba.njit(nogil=True)(func)
        numba.config.CACHE_DIR = path
        return numba.njit(cache=True, nogil=True)(func)


def helper(func):
    """A function the kernels of its module call, compiled into each (so cached with
    them: keep it in the kernels' module, whose changes renew their cache)."""
    return numba.njit(nogil=True)(func)
