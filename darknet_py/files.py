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

from .errors import DarknetError


class OverwriteError(DarknetError):
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
    except ValueError:  # a NUL byte in the path
        raise error(f"{path!r}: not a valid path (it holds a NUL byte)") from None
    if stat.S_ISDIR(mode):
        noun = what if what.endswith("file") else f"{what} file"  # "weights file", "image file"
        raise error(f"{path}: is a directory, not the {noun}")
    if not stat.S_ISREG(mode):
        raise error(
            f"{path}: not a regular file (a pipe, socket or device); give the {what} as a file"
        )
    if not os.access(path, os.R_OK):
        raise error(f"{path}: cannot read the {what} (permission denied)")
    return path


def refuse_overwrite(paths, overwrite, flag="--overwrite"):
    """Raise OverwriteError naming the outputs in `paths` that exist, unless overwrite."""
    if overwrite:
        return
    existing = [os.fspath(p) for p in paths if os.path.lexists(p)]
    if existing:
        shown = ", ".join(existing[:3]) + (
            f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        )
        raise OverwriteError(
            f"{shown}: already exist{'s' if len(existing) == 1 else ''}; "
            f"not replacing {'it' if len(existing) == 1 else 'them'} "
            f"(pass {flag} to replace, or choose another output)"
        )


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
    except OSError:  # it exists but belongs to someone else
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
    suffix = os.path.splitext(path)[1]  # OpenCV picks the image format from it
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-{os.getpid()}-", suffix=suffix, dir=directory)
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
        if e.strerror is None:  # a message of our own, already naming the file
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
    raise OverwriteError(
        f"{files(make_outputs(1))[0]}: {limit} earlier runs' outputs are "
        f"there; choose an output or remove them"
    )


def file_identity(path):
    """What tells one version of a file from another: (device, inode, size, mtime), or
    None when nothing is there. An atomic write makes a new inode, so a file another
    process wrote under the same name since has another identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class OutputClaims:
    """The outputs a long run (training) claimed at its start, followed until it ends: a
    file that appears or changes under one of their names meanwhile (a second run writing
    to the same directory) is not the run's to replace. Such a name's writes go to the
    first free numbered name beside it (yolov3_final-2.weights), said once in one line."""

    def __init__(self, log=print):
        self.log = log
        self._replaceable = {}  # path -> the identity the run may replace (None: absent)
        self._moved = {}  # a claimed name -> the name its writes go to instead

    def claim(self, paths):
        """Take `paths` as they are now (checked already: absent, or the run's to replace,
        such as the backup it continues from or a file --overwrite replaces)."""
        for path in paths:
            self._replaceable[os.path.abspath(path)] = file_identity(path)

    def where(self, path):
        """The name `path`'s writes go to: itself, unless it was taken by someone else."""
        return self._moved.get(os.path.abspath(path), os.fspath(path))

    def _ours(self, path):
        identity = file_identity(path)
        return identity is None or identity == self._replaceable.get(os.path.abspath(path))

    def target(self, path):
        """The name to write `path` to now: `path` when nothing is there or what is there
        is the run's own (claimed at the start, or written by the run); else the name it
        moved to (found now, and said in one line, when this is the first such write)."""
        key = os.path.abspath(path)
        current = self.where(path)
        if self._ours(current):
            return current
        for run in range(2, 10000):
            other = run_numbered(os.fspath(path), run)
            if other != current and file_identity(other) is None:
                break
        else:
            raise OverwriteError(
                f"{path}: 10000 numbered names beside it are taken; "
                f"not replacing files this run did not write"
            )
        self.log(
            f"darknet-py: warning: {current}: written by someone else since this run "
            f"started (another run with the same output directory?); not replacing it, "
            f"writing {other} instead"
        )
        self._moved[key] = other
        return other

    def wrote(self, path):
        """Record the file the run has just written, which it may then replace."""
        self._replaceable[os.path.abspath(path)] = file_identity(path)
