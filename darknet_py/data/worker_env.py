"""Preloaded by the data loader's worker server (multiprocessing's forkserver) alone, never
imported elsewhere: it sets the math libraries' thread counts to 1 in the server, so that
every worker forked from it has them from its first instruction. A worker re-imports the
training process's main script before it runs any loader code, and a script that imports
OpenCV would otherwise load OpenCV's bundled OpenBLAS there with a thread for every CPU
but one (loader._work sets them too, for a server something else started)."""

import os

from .loader import WORKER_THREAD_VARIABLES

os.environ.update(dict.fromkeys(WORKER_THREAD_VARIABLES, "1"))
