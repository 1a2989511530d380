"""gpuwarden: keeps GPU inference boxes alive."""

# The one place the version is written (pyproject.toml reads it from here): importlib.metadata only to read it
# cost 37 ms of every start.
__version__ = "0.1.0"
