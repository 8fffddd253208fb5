"""The decoders' hot loops compiled to machine code by numba: one pass over the values
instead of NumPy's many, and without the GIL, so the threads decoding ahead run side by
side. Imported only by the kernel modules (:mod:`.dysco_kernels`, :mod:`.sisco_predict`),
which the readers of the managers that need them load when such a column is opened: a
mount of other tables never pays numba's import.

numba compiles a kernel at its first call in a new install and keeps the machine code in
a cache: beside the module when its directory is writable, else in the user's cache
directory (``~/.cache/numba``); when neither is, the kernels cache in a directory of the
system's temporary directory instead of refusing to load. numba does not check indices:
every kernel checks each index it computes from a file's bytes itself.
"""

import os
import tempfile

import numba


def _temporary_cache():
    return os.path.join(tempfile.gettempdir(), f"ctdsfs-numba-{os.getuid()}")


def kernel(func):
    """``func`` compiled (cached, releasing the GIL)."""
    try:
        return numba.njit(cache=True, nogil=True)(func)
    except RuntimeError:  # (numba found no writable cache directory)
        numba.config.CACHE_DIR = _temporary_cache()
        return numba.njit(cache=True, nogil=True)(func)


def helper(func):
    """A function the kernels of its module call, compiled into each (so cached with
    them: keep it in the kernels' module, whose changes renew their cache)."""
    return numba.njit(nogil=True)(func)
