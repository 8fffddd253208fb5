"""The addresses read from a server instead of a local path, in one place that the
registry, the mount and the remote store ask without importing the remote code
(``remote.py`` is imported only once a source turns out to be remote)."""

REMOTE_SCHEMES = ("s3://", "http://", "https://")
SPEC_ENV = "CTDSFS_REMOTE_SPEC"  # how an HDF5 probe child gets the same pinned object
