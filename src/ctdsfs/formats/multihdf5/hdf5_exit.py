"""HDF5 files that h5py reads through a Python file object (its ``fileobj`` driver: a
writer's JournaledFile, a remote object's RemoteFile) are closed before Python ends.

libhdf5 closes whatever is still open from its own C exit handler, which runs after the
interpreter's teardown; closing a file-object file calls back into Python there, and the
process dies by SIGSEGV after everything else went well. A file the teardown does not free
stays open that long: one kept by a daemon thread's frame, or by a cache it does not clear
in time (fsspec's filesystem instances). An atexit handler closes them while Python still
runs; a writer's changes since its last commit stay uncommitted, as after a crash."""

import atexit
import logging
import weakref

log = logging.getLogger(__name__)

_OPEN = weakref.WeakSet()  # h5py File objects over a file object, while they live


def close_at_exit(handle):
    """``handle`` (an h5py File over a file object), closed at exit if still open."""
    _OPEN.add(handle)
    return handle


@atexit.register
def _close_left_open():
    for handle in list(_OPEN):
        try:
            handle.close()
        except Exception as exc:  # (h5py's errors, from a damaged file or a closed source)
            log.warning("closing HDF5 file %s at exit: %s", handle.filename, exc)
