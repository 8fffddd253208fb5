"""Which reads of one file carry on a sequential reader, when several read it at once.

Readers of one file share its decoder (handles are inode numbers, and the kernel's
requests of all of them reach the same object), so "the last read" is whichever
reader's came last: two readers going through their own halves would each look like
jumps to the other and never be read ahead of. This keeps the ends of the latest few
readers instead, and how far ahead of each the pieces were asked for.
"""

import threading
from collections import OrderedDict

STREAMS = 8  # readers followed at once per file (the least recent is forgotten)


class ReadStreams:
    def __init__(self, streams: int = STREAMS) -> None:
        self._streams = streams
        # the piece a reader's last read ended in -> the last piece asked for it
        self._asked: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()

    def follow(self, first: int, last: int) -> int | None:
        """A read of pieces ``first`` .. ``last``: the first piece to ask ahead for (past
        ``last`` and what was asked for this reader already), or None if the read carries
        on no reader (it starts in, or next to, the piece one's last read ended in: the
        kernel's reads overlap a little)."""
        with self._lock:
            for end in self._asked:
                if abs(first - end) <= 1:
                    asked = max(self._asked.pop(end), last)
                    self._asked[last] = asked
                    return asked + 1
            self._asked[last] = last
            while len(self._asked) > self._streams:
                self._asked.popitem(last=False)
            return None

    def asked(self, last: int, until: int) -> None:
        """Pieces up to ``until`` are asked for, for the reader whose read ended in ``last``."""
        with self._lock:
            if last in self._asked:
                self._asked[last] = max(self._asked[last], until)

    def followed(self) -> int:
        """How many readers are followed (the pieces read ahead of them share a cache)."""
        with self._lock:
            return len(self._asked)
