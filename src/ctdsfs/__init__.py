"""ctdsfs: scientific container files (casacore MultiFile, ...) as ordinary directories."""

__version__ = "0.1.0"
