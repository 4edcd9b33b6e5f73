"""scripts/kernels_check.py (`make kernels-check`): a file that passed is not compiled again
until it or a header it includes changes; a failure is reported and exits 1. Runs with a
stand-in nvcc that logs what it is asked to compile."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernels_check.py"

FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake nvcc 1.0"; exit 0; fi
for a in "$@"; do last="$a"; done
echo "$last $*" >> "$LOG"
case "$last" in *broken.cu) echo "broken.cu(1): error: nope"; exit 2;; esac
exit 0
"""


def run(tmp_path, *extra):
    env = dict(
        os.environ,
        DARKNET_KERNEL_CACHE=str(tmp_path / "cache" / "kernels"),
        LOG=str(tmp_path / "log"),
    )
    (tmp_path / "log").write_text("")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--nvcc",
            str(tmp_path / "nvcc"),
            "--kernels",
            str(tmp_path / "k"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    compiled = sorted(
        Path(line.split()[0]).name for line in (tmp_path / "log").read_text().splitlines()
    )
    return done, compiled


def test_only_changed_files_and_their_includers_compile_again(tmp_path):
    (tmp_path / "nvcc").write_text(FAKE_NVCC)
    (tmp_path / "nvcc").chmod(0o755)
    k = tmp_path / "k"
    k.mkdir()
    (k / "common.cuh").write_text("// shared\n")
    (k / "a.cu").write_text('#include "common.cuh"\n')
    (k / "b.cu").write_text("// alone\n")
    (k / "gemm_wgmma.cu").write_text("// Hopper only\n")
    done, compiled = run(tmp_path)
    assert done.returncode == 0, done.stderr
    # every file for sm_90, and the wgmma file for sm_90a as well
    assert compiled == ["a.cu", "b.cu", "gemm_wgmma.cu", "gemm_wgmma.cu"]
    assert "4 builds to compile, 0 unchanged" in done.stdout
    done, compiled = run(tmp_path)
    assert compiled == [] and "0 builds to compile, 4 unchanged" in done.stdout
    (k / "common.cuh").write_text("// shared, edited\n")
    assert run(tmp_path)[1] == ["a.cu"]
    assert run(tmp_path, "--all")[1] == ["a.cu", "b.cu", "gemm_wgmma.cu", "gemm_wgmma.cu"]


def test_a_failing_file_is_reported_exits_1_and_is_tried_again(tmp_path):
    (tmp_path / "nvcc").write_text(FAKE_NVCC)
    (tmp_path / "nvcc").chmod(0o755)
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "broken.cu").write_text("nope\n")
    done, compiled = run(tmp_path)
    assert done.returncode == 1
    assert "k/broken.cu (sm_90): FAILED" in done.stdout
    assert "broken.cu(1): error: nope" in done.stderr
    assert run(tmp_path)[1] == ["broken.cu"]


def test_without_nvcc_it_says_so_and_passes(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--nvcc", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    assert "nvcc not found, kernels not compiled" in done.stdout
