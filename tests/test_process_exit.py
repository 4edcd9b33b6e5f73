"""The command's end (processes.exit_process): the process ends as the interpreter's own
exit would leave it (threads finished, exit handlers run, streams flushed, the status
given), only without the teardown of every module."""

import subprocess
import sys
import textwrap


def run_script(tmp_path, body):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60
    )


def test_threads_finish_exit_handlers_run_and_buffered_output_is_flushed(tmp_path):
    done = run_script(
        tmp_path,
        """
        import atexit, concurrent.futures, sys, threading, time
        from pathlib import Path
        from darknet_py.processes import exit_process

        out = Path(sys.argv[1])

        def slow_write(name):
            time.sleep(0.3)
            (out / name).write_text("done")

        threading.Thread(target=slow_write, args=("thread.txt",)).start()
        pool = concurrent.futures.ThreadPoolExecutor(1)  # never shut down by the script
        pool.submit(slow_write, "pool.txt")
        atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
        sys.stdout.write("no newline, still buffered")
        sys.stderr.write("to stderr")
        exit_process(3)
        """,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline, still buffered"
    assert done.stderr == "to stderr"
    for name in ("thread.txt", "pool.txt", "atexit.txt"):
        assert (tmp_path / name).exists(), name


def test_codes_as_sys_exit_gives_them(tmp_path):
    for code, status, stderr in (
        ("None", 0, ""),
        ("0", 0, ""),
        ("2", 2, ""),
        ("'bad'", 1, "bad\n"),
    ):
        done = run_script(
            tmp_path, f"from darknet_py.processes import exit_process\nexit_process({code})\n"
        )
        assert (done.returncode, done.stderr) == (status, stderr), code


def test_the_command_gives_its_whole_output_and_status(tmp_path):
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(
        "[net]\nwidth=32\nheight=32\nchannels=3\n\n"
        "[convolutional]\nfilters=4\nsize=3\nstride=1\npad=1\nactivation=leaky\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "darknet_py", "info", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip().splitlines()
    assert any(line.startswith("Total BFLOPs:") for line in lines)
    assert lines[-1].startswith("Activations and workspace at batch 1:")  # the last line
    cfg.write_text("[net]\nwidth=32\nheight=32\nchannels=3\n\n[convolutional]\nfilters=four\n")
    bad = subprocess.run(
        [sys.executable, "-m", "darknet_py", "info", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "filters" in bad.stderr
