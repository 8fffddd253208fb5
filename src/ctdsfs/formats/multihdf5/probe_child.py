"""The child process of ``probe``: open an untrusted HDF5 file as MultiHDF5 and touch
everything ctdsfs will, under the probe's limits, then print the verdict as one JSON line.

Run in a process forked by ``probe_server`` for ``probe.probe`` only; a crash or a hang
here costs that process, never the caller.
"""

import json
import math
import os
import resource
import time

from ...errors import CtdsfsError
from ...remote.schemes import SPEC_ENV
from ...remote.wire import RemoteError
from .container import HDF5_ERRORS, MultiHDF5
from .probe import MEMORY_LIMIT, cpu_limit


class CpuBudget:
    """RLIMIT_CPU kept ``seconds`` ahead of the CPU time used at the last step forward: a
    spinning HDF5 is ended by the kernel (SIGXCPU) once it has spent that much getting
    nowhere, however busy the machine. The limit counts whole seconds, so a step may get
    up to one second more."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        self.limit = None

    def step(self):
        limit = math.ceil(time.process_time() + self.seconds)
        if limit != self.limit:
            if self.hard != resource.RLIM_INFINITY:
                limit = min(limit, self.hard)
            resource.setrlimit(resource.RLIMIT_CPU, (limit, self.hard))
            self.limit = limit


def _touch(container, problems, budget):
    """Everything the main process touches later, nested containers included; the
    containers' problems are gathered into ``problems``."""
    for name in container.names():
        budget.step()
        child = container.nested(name)
        if child is not None:
            _touch(child, problems, budget)
            continue
        try:
            container.stored_spans(name)
        except HDF5_ERRORS as exc:  # an error, not a crash: EIO for that file later
            problems.append(f"{container.label}/{name}: its chunk index cannot be read ({exc})")
    budget.step()
    container.describe()
    budget.step()
    try:
        list(container.group)  # check and a writer's sweep of leftovers list every link
    except HDF5_ERRORS as exc:
        problems.append(f"{container.label}: its group cannot be listed ({exc})")
    problems.extend(container.problems)
    return problems


def main(path):
    source = path
    if SPEC_ENV in os.environ:  # a remote object (the HTTP stack is imported for it alone)
        from ...remote.store import from_spec

        source = from_spec(os.environ[SPEC_ENV])
    # (set once the trusted imports are done: the bound is for what the file makes HDF5 do)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (a crash is reported, not dumped)
    budget = CpuBudget(cpu_limit())
    budget.step()
    try:
        container = MultiHDF5.open_unprobed(source, progress=budget.step)
        try:
            verdict = {"problems": _touch(container, [], budget)}
        finally:
            budget.step()  # (closing a file of thousands of entries takes a while too)
            container.abandon()
    except RemoteError as exc:
        verdict = {"unanswered": str(exc)}
    except CtdsfsError as exc:
        verdict = {"refused": str(exc)}
    except HDF5_ERRORS + (MemoryError,) as exc:
        verdict = {"refused": f"{path}: damaged MultiHDF5 structure ({exc})"}
    if "refused" in verdict and getattr(source, "failure", None) is not None:
        verdict = {"unanswered": str(source.failure)}  # (the server's, not the file's)
    print(json.dumps(verdict))
    return 0
