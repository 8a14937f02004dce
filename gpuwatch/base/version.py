"""The package's version, in a leaf of its own: the wire's hello and `--version` read it without
importing the package's `track()` and `autolog()` (and so without a circle through the client)."""

__version__ = "0.1.0"
