"""Pure, synchronous codecs and container classes. No FUSE, no trio: usable as a library."""
