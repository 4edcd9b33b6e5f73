"""Counts in messages: "1 malformed line", "2 malformed lines"."""


def counted(count, singular, plural=None):
    """`count` and the noun in the number it takes: plural (default: singular + "s") for
    every count but 1."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"
