"""Where bytes read from a file or decoded are put: buffers placed so that the kernel
and the page allocator do the least work.

* :func:`aligned_empty`: the kernel copies from the page cache into a destination 1 to
  31 bytes past its source (modulo a page), which is where NumPy's and Python's large
  buffers tend to start, 3 to 4 times slower than otherwise (rep movsb: 530 against
  150 us a MiB on AMD EPYC); this buffer starts as far past a 64-byte boundary as its
  bytes do in their file.
* :func:`huge_page_buffer`: a large buffer across a huge page's border gets small pages
  there, each a page fault; this one starts on the border.
* :func:`spare_buffer`: a few buffers kept for the next compressed tiles or chunks (a
  fresh one costs a page fault every 4 KiB), page-aligned (O_DIRECT reads into them).
"""

import contextlib
import mmap
import threading

import numpy as np

ALIGNMENT = 64
HUGE_PAGE = 2 << 20  # (x86-64)
SPARES_KEPT = 3  # spare buffers kept for the next reads
SPARE_MAX = 16 << 20  # bytes of a spare buffer kept, at most
_SPARES = []
_SPARES_LOCK = threading.Lock()


def aligned_empty(size, offset=0):
    """An unset ``uint8`` array of ``size`` bytes for the bytes at ``offset`` of a file:
    its start lies ``offset`` bytes past a multiple of ALIGNMENT."""
    raw = np.empty(size + ALIGNMENT - 1, np.uint8)
    skip = (offset - raw.ctypes.data) % ALIGNMENT
    return raw[skip:skip + size]


def huge_page_buffer(size):
    """An unset ``uint8`` array of ``size`` bytes starting on a huge page's border (the
    pages of the slack before it are never touched, so they cost nothing)."""
    whole = np.empty(size + HUGE_PAGE, np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    return whole[skip:skip + size]


@contextlib.contextmanager
def spare_buffer(size):
    """A writable buffer of at least ``size`` bytes, one of the few kept for the next
    reads where one is large enough (never two users at once); kept after, in place of
    a smaller one if as many are kept already."""
    with _SPARES_LOCK:  # (by place, never by ==)
        fits = [k for k, spare in enumerate(_SPARES) if len(spare) >= size]
        buffer = _SPARES.pop(min(fits, key=lambda k: len(_SPARES[k]))) if fits else None
    if buffer is None:  # (whole MiB: fits the next ones; page-aligned, for direct reads)
        buffer = mmap.mmap(-1, -(-size // (1 << 20)) << 20,
                           flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        yield buffer
    finally:
        with _SPARES_LOCK:
            if len(buffer) <= SPARE_MAX:
                _SPARES.append(buffer)
                if len(_SPARES) > SPARES_KEPT:
                    _SPARES.pop(min(range(len(_SPARES)), key=lambda k: len(_SPARES[k])))
