"""The errors and warnings a user can act on, at the bottom of darknet_py: every module
imports from here, this module imports nothing of darknet_py.

Each module raises its own subclass of ``DarknetError`` (``CfgError``, ``WeightsError``,
``DataError``, ...) with a message that names the file (and line, key) at fault, and warns
with a subclass of ``DarknetWarning``. The command line (cli.py) turns ``USER_ERRORS`` into
one line on stderr and exit code 2 (``describe_error`` writes that line) and shows
``USER_WARNINGS`` one line each; any other exception is a bug and keeps its traceback. A
data-parallel rank reports its failure with the same one line (distributed/launcher.py).
"""


class DarknetError(Exception):
    """A problem with the user's files, arguments or machine, not a bug in darknet-py."""


class DarknetWarning(UserWarning):
    """Suspicious input that darknet-py can still use; the message names file and line."""


class UsageError(DarknetError):
    """A command's arguments do not fit together (raised below the command line, e.g. by
    the video path of `detect`)."""


# OSError covers the files darknet-py opens directly (names, image lists, outputs).
USER_ERRORS = (DarknetError, OSError)
USER_WARNINGS = (DarknetWarning,)


def describe_error(exc):
    """The one line that reports a USER_ERRORS exception."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())  # a message must stay on one line
