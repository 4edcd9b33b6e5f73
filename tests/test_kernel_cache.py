"""The cubin cache (backends/kernel_cache.py): compiled once, read back, damage repaired.
Needs nvcc (skipped without it); no GPU."""

import os
import shutil

import pytest

from darknet_py.backends import BackendError, kernel_cache, prebuilt

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

SOURCES = {
    "one.cu": 'extern "C" __global__ void one(float* x) { x[threadIdx.x] = 1.0f; }\n',
    "two.cu": 'extern "C" __global__ void two(float* x) { x[threadIdx.x] *= 2.0f; }\n',
}
ARCH = "sm_90"


@needs_nvcc
def test_compiled_once_then_read_without_nvcc(tmp_path):
    first = kernel_cache.cubins(SOURCES, ARCH, directory=tmp_path)
    assert set(first) == set(SOURCES) and all(c[:4] == b"\x7fELF" for c in first.values())
    entries = sorted(os.listdir(tmp_path))
    assert len(entries) == 2 and not any(e.startswith(".tmp") for e in entries)
    # a second start compiles nothing: an nvcc that does not exist is never called
    again = kernel_cache.cubins(SOURCES, ARCH, nvcc="/nonexistent/nvcc", directory=tmp_path)
    assert again == first
    # options of one file: its own entry, compiled; the other file's is read
    no_fma = kernel_cache.cubins(SOURCES, ARCH, {"two.cu": ["--fmad=false"]}, directory=tmp_path)
    assert no_fma["one.cu"] == first["one.cu"] and len(os.listdir(tmp_path)) == 3
    path = tmp_path / kernel_cache.entry_name(SOURCES["two.cu"], ("--fmad=false",), ARCH)
    assert kernel_cache.read_entry(path) == no_fma["two.cu"]


@needs_nvcc
def test_a_damaged_entry_is_compiled_again(tmp_path):
    first = kernel_cache.cubins(SOURCES, ARCH, directory=tmp_path)
    path = tmp_path / kernel_cache.entry_name(SOURCES["one.cu"], (), ARCH)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert kernel_cache.read_entry(path) is None
    with pytest.raises(kernel_cache.KernelCompileError, match="not found"):
        kernel_cache.cubins(SOURCES, ARCH, nvcc="/nonexistent/nvcc", directory=tmp_path)
    assert kernel_cache.cubins(SOURCES, ARCH, directory=tmp_path) == first
    assert kernel_cache.read_entry(path) == first["one.cu"]


@needs_nvcc
def test_key_covers_source_options_and_architecture():
    names = {
        kernel_cache.entry_name(SOURCES["one.cu"], (), "sm_90"),
        kernel_cache.entry_name(SOURCES["one.cu"], ("-lineinfo",), "sm_90"),
        kernel_cache.entry_name(SOURCES["one.cu"], (), "sm_80"),
        kernel_cache.entry_name(SOURCES["two.cu"], (), "sm_90"),
    }
    assert len(names) == 4


@needs_nvcc
def test_nvcc_errors_are_reported_and_nothing_is_cached(tmp_path):
    with pytest.raises(BackendError, match=r"nvcc failed on bad.cu for sm_90.*error"):
        kernel_cache.cubins({"bad.cu": "this is not CUDA\n"}, ARCH, directory=tmp_path)
    assert os.listdir(tmp_path) == []


@needs_nvcc
def test_an_unwritable_cache_still_gives_cubins(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory should be
    got = kernel_cache.cubins({"one.cu": SOURCES["one.cu"]}, ARCH, directory=blocked / "kernels")
    assert got["one.cu"][:4] == b"\x7fELF"


def test_headers_a_kernel_includes_are_found_once_and_hashed(tmp_path):
    (tmp_path / "shared.cuh").write_text(
        '#pragma once\n#include "inner.cuh"\n__device__ float twice(float v) { return 2.0f * v; }\n'
    )
    (tmp_path / "inner.cuh").write_text("#pragma once\n")
    source = (
        '#include "shared.cuh"\n#include <cstdint>\n#include "shared.cuh"\n'
        'extern "C" __global__ void k(float* x) { x[0] = twice(x[0]); }\n'
    )
    found = kernel_cache.included_headers(source, [str(tmp_path)])
    assert [name for name, _ in found] == ["shared.cuh", "inner.cuh"]
    first = kernel_cache.kernel_digest(source, (), [str(tmp_path)])
    assert first == kernel_cache.kernel_digest(source, (), [str(tmp_path)])
    (tmp_path / "inner.cuh").write_text("#pragma once\n// changed\n")
    assert kernel_cache.kernel_digest(source, (), [str(tmp_path)]) != first


def test_headers_are_found_in_several_folders_and_hashed_whichever_holds_them(tmp_path):
    source = '#include "outer.cuh"\nextern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    one, two, flat = tmp_path / "one", tmp_path / "two", tmp_path / "flat"
    for folder in (one, two, flat):
        folder.mkdir()
    for folder, name, text in (
        (one, "outer.cuh", '#include "inner.cuh"\n'),
        (two, "inner.cuh", "#define ONE 1\n"),
        (flat, "outer.cuh", '#include "inner.cuh"\n'),
        (flat, "inner.cuh", "#define ONE 1\n"),
    ):
        (folder / name).write_text(text)
    found = kernel_cache.included_headers(source, [str(one), str(two)])
    assert found == [("outer.cuh", '#include "inner.cuh"\n'), ("inner.cuh", "#define ONE 1\n")]
    assert (
        kernel_cache.kernel_digest(source, (), [str(one), str(two)])
        == kernel_cache.kernel_digest(source, (), [str(flat)])
        != kernel_cache.kernel_digest(source, (), [str(one)])
    )


def test_every_kernel_file_names_only_headers_that_exist():
    import re

    sources = prebuilt.kernel_sources()
    assert "blas.cu" in sources and "gemm_wgmma_solo.cu" in sources
    for name, source in sources.items():
        wanted = set(re.findall(r'^\s*#\s*include\s+"([^"]+)"', source, re.MULTILINE))
        found = {
            header for header, _ in kernel_cache.included_headers(source, prebuilt.KERNEL_DIRS)
        }
        assert wanted <= found, (name, wanted - found)


@needs_nvcc
def test_a_kernel_with_a_header_compiles(tmp_path):
    source = prebuilt.kernel_sources()["blas.cu"]
    assert '#include "../common/common.cuh"' in source
    got = kernel_cache.cubins(
        {"blas.cu": source}, ARCH, directory=tmp_path, include_dirs=prebuilt.KERNEL_DIRS
    )
    assert got["blas.cu"][:4] == b"\x7fELF"


@needs_nvcc
def test_processes_starting_together_compile_each_kernel_once(tmp_path):
    """The ranks of a machine with a cold cache: one compiles, the others read its cubins."""
    import subprocess
    import sys

    calls = tmp_path / "nvcc-calls"
    counting = tmp_path / "nvcc"
    counting.write_text(f'#!/bin/sh\necho x >> {calls}\nexec {shutil.which("nvcc")} "$@"\n')
    counting.chmod(0o755)
    cache = tmp_path / "cache"
    code = (
        "import sys; from darknet_py.backends import kernel_cache; "
        f"c = kernel_cache.cubins({SOURCES!r}, {ARCH!r}, nvcc={str(counting)!r}, "
        f"directory={str(cache)!r}); sys.stdout.buffer.write(c['one.cu'])"
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        )
        for _ in range(3)
    ]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0, 0]
    assert outputs[0][:4] == b"\x7fELF" and outputs.count(outputs[0]) == 3
    assert len(calls.read_text().split()) == len(SOURCES)  # not once per process
    assert sorted(os.listdir(cache)) == sorted(
        kernel_cache.entry_name(src, (), ARCH) for src in SOURCES.values()
    )
