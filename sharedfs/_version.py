"""Single source of the version (read by hatchling and by ``sharedfs.__version__``)."""

__version__ = "0.1.0"
