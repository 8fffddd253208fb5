"""Exceptions shared by the format codecs, the VFS and the command line.

Every message is one line that names the container, so the CLI can print it as is.
"""


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
    """The container's format has no room for another entry (ENOSPC)."""


class BlockError(CtdsfsError):
    """One block of a virtual file cannot be read correctly (bad CRC, past end of file).

    The VFS turns this into EIO for that read only; the rest of the container stays usable,
    and logs ``detail`` (what is wrong, without the container's name) once, with the
    file's path inside the mount.
    """

    def __init__(self, message, detail=None):
        super().__init__(message)
        self.detail = detail or message
