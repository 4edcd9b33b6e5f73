"""Writing output files atomically, with the mode a plain open() would give them."""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_path(path, suffix=""):
    """Yield a temporary path beside `path` to write; on success it becomes `path` in one
    rename (readers never see half a file), on failure it is removed. The file gets the
    mode open() would give it: mkstemp's 0600 would hide it from the user's group."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", suffix=suffix,
                               dir=directory)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomically(path, text):
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
