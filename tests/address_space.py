"""A cap on the address space a test's own code may add to its process, so that an
unbounded allocation fails at once (MemoryError) instead of swapping.

The cap counts from what the process maps already: a pytest worker that ran other tests
first may map gigabytes of libraries, arenas and thread stacks, and an absolute cap would
then fail a small read."""

import resource
from contextlib import contextmanager

from ctdsfs.formats.casacore.base import mapped_bytes


@contextmanager
def address_space(more=4 << 30):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped_bytes() + more
    resource.setrlimit(resource.RLIMIT_AS, (
        limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
