"""gpuwarden: keeps GPU inference boxes alive."""

# The one place the version is written (pyproject.toml reads it from here): importlib.metadata only to read it
# cost 37 ms of every start.
__version__ = "0.1.0"

# httpx imports its command-line client on import when click is installed (apprise installs it): click and
# pygments, 20 ms and 2 MB of every engine-watching daemon, before giving it up for want of rich. Marked absent,
# `import httpx` takes its own fallback at once (`httpx` the command is not ours to run).
import sys

sys.modules.setdefault("httpx._main", None)
del sys
