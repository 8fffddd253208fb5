"""POSIX semantics over the container interface, independent of FUSE (and testable without it)."""

from .filesystem import ROOT_INO, Attr, ContainerFS, FSError, UnknownAttr

__all__ = ["ROOT_INO", "Attr", "ContainerFS", "FSError", "UnknownAttr"]
