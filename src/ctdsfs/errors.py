"""Exceptions shared by the format codecs, the VFS and the command line.

Every message is one line that names the container, so the CLI can print it as is
(through :func:`printable`, since names in it come from the container).
"""

import logging
import os


class CtdsfsError(Exception):
    """Base class: an expected failure with a user-facing one-line message."""


class FormatError(CtdsfsError):
    """A container's bytes do not follow its format (damaged or hostile input)."""


class NotAContainer(FormatError):
    """The file is not of any container format ctdsfs knows."""


class ReadOnlyError(CtdsfsError):
    """A write was asked of a container that is read-only (by choice or after a failure)."""


class NotPermitted(CtdsfsError):
    """The container's format does not allow this change (EPERM)."""


class ContainerFull(CtdsfsError):
    """No room: the format has no room for another entry, or the disk none for the
    container to grow (ENOSPC). Raised before anything changed."""


class TooLarge(CtdsfsError):
    """A size or offset past what the container's format can hold (EFBIG).

    Raised before anything changed.
    """


class FSError(Exception):
    """A POSIX error for one operation; the adapter hands ``errno`` to the kernel."""

    def __init__(self, code, message=""):
        super().__init__(message or os.strerror(code))
        self.errno = code


class BlockError(CtdsfsError):
    """One block of a virtual file cannot be read correctly (bad CRC, past end of file).

    The VFS turns this into EIO for that read only; the rest of the container stays usable,
    and logs ``detail`` (what is wrong, without the container's name) once, with the
    file's path inside the mount.
    """

    def __init__(self, message, detail=None):
        super().__init__(message)
        self.detail = detail or message

class Escaped(str):
    """Text made safe for a terminal already (JSON with its own escapes): printable() keeps it."""


def printable(text):
    """``text`` (names and messages from containers are untrusted) made safe for one terminal
    or log line, in the manner of ``ls -b``.

    Unprintable characters (controls such as ESC or a newline, bidi overrides)
    become ``\\xNN`` below U+0080 and ``\\uNNNN`` above; a byte that is not UTF-8
    (kept in the name as a surrogate escape) becomes ``\\xNN`` of that byte, and
    a backslash ``\\\\``. So nothing raw reaches the terminal, any UTF-8 locale
    can print the result, and two different names never print alike.
    """
    if isinstance(text, Escaped):
        return text
    text = str(text)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(map(_printable_char, text))


def _printable_char(ch):
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable():
        return ch
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class PrintableFormatter(logging.Formatter):
    """Log lines whose message part (names from containers in it) passes through
    :func:`printable`; a traceback that follows stays as it is."""

    def formatMessage(self, record):
        return printable(super().formatMessage(record))
