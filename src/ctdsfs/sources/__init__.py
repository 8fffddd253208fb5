"""Sources: from what a user names (a path, a URL, an fsspec chain) to the container tree
a mount, a command or the fsspec filesystem shows, with the views laid over it
(:mod:`.opener` is the one way in)."""
