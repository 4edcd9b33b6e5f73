"""What a backend's pin() returns where nothing was pinned (the CPU's arrays, or memory the
driver refused): one function, so callers can tell (`unpin is unpin_nothing`)."""


def unpin_nothing():
    pass
