"""Checks of the arguments the Network's public methods take: one clear ValueError for a
value of the wrong kind, before anything changes."""

import numpy as np


def whole_number(value, what, least=1):
    """value as an int, or a ValueError saying that `what` takes a whole number (a float
    such as 2.5 was cut to 2, and True read as 1)."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < least
    ):
        raise ValueError(f"{what} must be a whole number of at least {least}, got {value!r}")
    return int(value)


def switch(value, what):
    """value as a bool, or a ValueError: bool("false") is True, so only True, False, 1 and
    0 are taken."""
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, (int, np.integer)) and value in (0, 1)
    ):
        return bool(value)
    raise ValueError(f"{what} takes True or False, got {value!r}")
