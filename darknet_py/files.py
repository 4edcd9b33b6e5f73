"""The rules every command follows for the files it reads and writes.

Reading: a path must be a regular file; a directory, a named pipe or a device is refused
up front (opening a pipe blocks until someone writes to it).

Writing: nothing that already exists is replaced unless the user says so (``--overwrite``),
every file is written atomically (a temporary file beside it, renamed into place), errors
name the file the user asked for, never the temporary, and temporaries an interrupted run
left behind are removed when the next run writes into the same directory.
"""
import contextlib
import os
import re
import stat
import tempfile
import time


class OverwriteError(Exception):
    """An output file exists and --overwrite was not given."""


def check_input_file(path, what, error):
    """Raise error("PATH: ...") unless path is a regular file that can be read; `what`
    names the file for the message ("weights file", "image")."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror})") from None
    except ValueError:   # a NUL byte in the path
        raise error(f"{path!r}: not a valid path (it holds a NUL byte)") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a directory, not the {what} file")
    if not stat.S_ISREG(mode):
        raise error(f"{path}: not a regular file (a pipe, socket or device); give the "
                    f"{what} as a file")
    if not os.access(path, os.R_OK):
        raise error(f"{path}: cannot read the {what} (permission denied)")
    return path


def refuse_overwrite(paths, overwrite, flag="--overwrite"):
    """Raise OverwriteError naming the outputs in `paths` that exist, unless overwrite."""
    if overwrite:
        return
    existing = [os.fspath(p) for p in paths if os.path.lexists(p)]
    if existing:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more"
                                            if len(existing) > 3 else "")
        raise OverwriteError(f"{shown}: already exist{'s' if len(existing) == 1 else ''}; "
                             f"not replacing {'it' if len(existing) == 1 else 'them'} "
                             f"(pass {flag} to replace, or choose another output)")


# Temporaries are named .<kind>-<pid>-<random>: a later run can tell whether the process
# that made one is still writing it.
TEMPORARY = re.compile(r"^\.(weights|chart|output)-(\d+)-")
# Earlier versions named them .weights-<8 random> and .chart-<8 random>.png, without the
# process id; only an interrupted write of theirs leaves one, so they are always stale.
OLD_TEMPORARY = re.compile(r"^\.(weights-[a-z0-9_]{8}|chart-[a-z0-9_]{8}\.png)$")
# A temporary without a live owner is stale; one whose owner id was reused is removed
# once this old.
STALE_SECONDS = 3600


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # it exists but belongs to someone else
        return True
    return True


def remove_stale_temporaries(directory):
    """Delete the temporaries that interrupted atomic writes left in directory; returns
    their paths. Those of a process still running (another run writing there) stay."""
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    now = time.time()
    for name in names:
        match = TEMPORARY.match(name)
        if not (match or OLD_TEMPORARY.match(name)):
            continue
        path = os.path.join(directory, name)
        try:
            if match and now - os.lstat(path).st_mtime <= STALE_SECONDS:
                owner = int(match.group(2))
                if owner == os.getpid() or _process_alive(owner):
                    continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def atomic_output(path, kind="output"):
    """Yield a temporary path beside `path` to write to; on success it replaces `path` in
    one rename, on failure it is removed and `path` is untouched. An OSError names `path`
    (a full disk reads "PATH: No space left on device"), not the temporary."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]   # OpenCV picks the image format from it
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-{os.getpid()}-", suffix=suffix,
                                   dir=directory)
        os.close(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    try:
        yield tmp
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        if e.strerror is None:   # a message of our own, already naming the file
            raise
        raise OSError(e.errno, e.strerror, path) from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path):
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_text_atomically(path, text):
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def run_numbered(path, run):
    """`path` for a command's first run, `stem-N.ext` for its N-th: predictions.jpg,
    predictions-2.jpg, ..."""
    if run == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}-{run}{ext}"


def first_free_run(make_outputs, files=list, limit=10000):
    """The outputs of the first run number N (1, 2, ...) for which files(make_outputs(N))
    names only files that do not exist yet: a default output never replaces an earlier
    run's and never makes a second run fail."""
    for run in range(1, limit + 1):
        outputs = make_outputs(run)
        if not any(os.path.lexists(p) for p in files(outputs)):
            return outputs
    raise OverwriteError(f"{files(make_outputs(1))[0]}: {limit} earlier runs' outputs are "
                         f"there; choose an output or remove them")

