"""Run a command, prefixing each line of its output (stdout and stderr together) with the
seconds since this wrapper started: where a whole-process run's time goes (start-up, the
first iterations, the end). Exits with the command's code.

    python3 bench/multigpu/timestamped.py COMMAND [ARGS...]
"""

import subprocess
import sys
import time


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    start = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        bufsize=1,
        text=True,
        errors="replace",
    )
    for line in process.stdout:
        sys.stdout.write(f"[{time.monotonic() - start:8.3f}] {line}")
        sys.stdout.flush()
    code = process.wait()
    print(f"[{time.monotonic() - start:8.3f}] exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
