"""The wheel's prebuilt kernels (backends/prebuilt.py): which binary the backend loads, and
when it compiles instead. No GPU and no CUDA toolkit: a stand-in nvcc writes a binary that
names its source's digest, its output kind and its architectures."""

import hashlib
import os
import stat
import sys
import zipfile

import pytest

from darknet_py.backends import kernel_cache, prebuilt

FAKE_NVCC = f"""#!{sys.executable}
import hashlib, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
src = open(args[-1], "rb").read()
if b"syntax error" in src:
    sys.exit("error: bad kernel")
rest = [a for a in args[:-1] if a != out and a != "-o" and not a.startswith("-I")]
digest = hashlib.sha256(src).hexdigest()
open(out, "wb").write(("BIN " + " ".join(rest) + " " + digest).encode())
"""

SOURCES = {
    "one.cu": '#include "common.cuh"\nextern "C" __global__ void one(float* x) { x[0] = ONE; }\n',
    "two.cu": 'extern "C" __global__ void two(float* x) { x[0] *= 2.0f; }\n',
}
OPTIONS = {"two.cu": ("--fmad=false",)}


@pytest.fixture()
def tree(tmp_path):
    """(kernel dir, prebuilt dir, cache dir, nvcc): two kernel files built for ARCHS."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name, text in SOURCES.items():
        (kernels / name).write_text(text)
    (kernels / "common.cuh").write_text("#define ONE 1.0f\n")
    built = tmp_path / "kernels_bin"
    prebuilt.build(str(built), [str(kernels)], options=OPTIONS, nvcc=str(nvcc))
    return kernels, built, tmp_path / "cache", str(nvcc)


def load(tree, sources=SOURCES, arch="sm_90", options=OPTIONS):
    kernels, built, cache, nvcc = tree
    return prebuilt.binaries(sources, arch, options, str(built), [str(kernels)], nvcc, str(cache))


def test_build_writes_one_fatbin_per_file_for_every_arch_and_a_manifest(tree):
    kernels, built, _, _ = tree
    manifest = prebuilt.read_manifest(str(built))
    assert manifest["archs"] == list(prebuilt.ARCHS) == ["sm_80", "sm_86", "sm_89", "sm_90"]
    assert set(manifest["kernels"]) == set(SOURCES)
    entry = manifest["kernels"]["two.cu"]
    binary = (built / entry["binary"]).read_bytes()
    assert binary.startswith(b"BIN --fatbin -gencode=arch=compute_80,code=sm_80 ")
    assert b"code=sm_90 --fmad=false" in binary
    assert entry["sha256"] == hashlib.sha256(binary).hexdigest()
    assert entry["digest"] == kernel_cache.kernel_digest(
        SOURCES["two.cu"], ("--fmad=false",), [str(kernels)]
    )


def test_matching_binaries_are_loaded_and_nothing_is_compiled(tree, capsys):
    _, built, cache, _ = tree
    for arch in prebuilt.ARCHS:
        binaries, compiled = load(tree, arch=arch)
        assert compiled == []
        assert binaries["one.cu"] == (built / "one.fatbin").read_bytes()
    assert not cache.exists() and capsys.readouterr().err == ""


def test_an_edited_source_is_compiled_not_taken_stale(tree, capsys):
    edited = dict(SOURCES, **{"two.cu": SOURCES["two.cu"].replace("2.0f", "3.0f")})
    binaries, compiled = load(tree, edited)
    assert compiled == ["two.cu"]
    assert binaries["two.cu"].startswith(b"BIN --cubin -arch=sm_90 --fmad=false")
    digest = hashlib.sha256(edited["two.cu"].encode()).hexdigest()
    assert binaries["two.cu"].endswith(digest.encode())
    assert "two.cu (stale)" in capsys.readouterr().err
    assert len(os.listdir(tree[2])) == 1  # compiled into the kernel cache


def test_an_edited_header_or_changed_options_make_a_binary_stale(tree, capsys):
    kernels = tree[0]
    assert load(tree, options={})[1] == ["two.cu"]
    (kernels / "common.cuh").write_text("#define ONE 2.0f\n")
    assert load(tree)[1] == ["one.cu"]
    err = capsys.readouterr().err
    assert "two.cu (stale)" in err and "one.cu (stale)" in err


def test_an_architecture_the_wheel_lacks_is_compiled_silently(tree, capsys):
    binaries, compiled = load(tree, arch="sm_100")
    assert compiled == ["one.cu", "two.cu"]
    assert binaries["one.cu"].startswith(b"BIN --cubin -arch=sm_100 ")
    assert capsys.readouterr().err == ""
    assert load(tree, arch="sm_100")[0] == binaries  # now from the cache


def test_a_damaged_binary_or_no_manifest_falls_back_to_nvcc(tree, capsys):
    _, built, _, _ = tree
    data = bytearray((built / "one.fatbin").read_bytes())
    data[5] ^= 0xFF
    (built / "one.fatbin").write_bytes(bytes(data))
    assert load(tree)[1] == ["one.cu"]
    assert "one.cu (damaged)" in capsys.readouterr().err
    (built / prebuilt.MANIFEST).unlink()
    assert load(tree)[1] == ["one.cu", "two.cu"]
    assert capsys.readouterr().err == ""


def test_without_nvcc_a_stale_binary_is_an_error_not_a_silent_load(tree):
    kernels, built, cache, _ = tree
    edited = dict(SOURCES)
    edited["one.cu"] += "// edited\n"
    with pytest.raises(kernel_cache.KernelCompileError, match="nvcc .* not found"):
        prebuilt.binaries(
            edited,
            "sm_90",
            OPTIONS,
            str(built),
            [str(kernels)],
            "/nonexistent/nvcc",
            str(cache),
            warn=False,
        )


def test_a_failed_build_leaves_no_manifest(tree):
    kernels, built, _, nvcc = tree
    (kernels / "bad.cu").write_text("syntax error\n")
    with pytest.raises(kernel_cache.KernelCompileError, match="nvcc failed on bad.cu"):
        prebuilt.build(str(built), [str(kernels)], options=OPTIONS, nvcc=nvcc)
    assert prebuilt.read_manifest(str(built)) is None


def test_check_wheel_finds_a_binary_that_does_not_match_the_wheels_source(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    built = tmp_path / "kernels_bin"
    prebuilt.build(str(built), nvcc=str(nvcc))

    def wheel(path, edit=None):
        top = os.path.dirname(prebuilt.PACKAGE_DIR)
        with zipfile.ZipFile(path, "w") as z:
            for folder in [*prebuilt.KERNEL_DIRS, os.path.join(prebuilt.PACKAGE_DIR, "cfgs")]:
                for name in os.listdir(folder):
                    if not os.path.isfile(os.path.join(folder, name)):  # __pycache__
                        continue
                    with open(os.path.join(folder, name)) as f:
                        text = f.read()
                    z.writestr(
                        os.path.relpath(os.path.join(folder, name), top),
                        text + (edit or "") if name == "blas.cu" else text,
                    )
            for name in os.listdir(built):
                z.write(built / name, f"darknet_py/kernels_bin/{name}")
        return str(path)

    assert prebuilt.check_wheel(wheel(tmp_path / "good.whl")) == []
    problems = prebuilt.check_wheel(wheel(tmp_path / "stale.whl", "// edited\n"))
    assert problems == [f"blas.cu for {a}: prebuilt binary stale" for a in prebuilt.ARCHS]


def test_kernel_files_are_found_in_the_family_folders_and_a_name_only_once(tmp_path):
    ops = tmp_path / "ops"
    for family, name in (
        ("conv", "gemm.cu"),
        ("conv", "gemm.cuh"),
        ("norm", "bn.cu"),
        ("headers", "common.cuh"),
    ):
        (ops / family).mkdir(parents=True, exist_ok=True)
        (ops / family / name).write_text("// kernel\n")
    (ops / "empty").mkdir()
    (ops / "__init__.py").write_text("")
    folders = prebuilt.kernel_folders(str(ops))
    assert folders == [str(ops / f) for f in ("conv", "headers", "norm")]
    assert prebuilt.kernel_paths(folders) == {
        "bn.cu": str(ops / "norm" / "bn.cu"),
        "gemm.cu": str(ops / "conv" / "gemm.cu"),
    }
    (ops / "headers" / "gemm.cu").write_text("// the same name again\n")
    with pytest.raises(ValueError, match="kernel file gemm.cu is in both"):
        prebuilt.kernel_paths(folders)
    shipped = prebuilt.kernel_paths()
    assert {
        os.path.relpath(shipped[name], prebuilt.OPS_DIR)
        for name in (
            "gemm.cu",
            "batchnorm.cu",
            "pooling.cu",
            "blas.cu",
            "yolo_loss.cu",
            "optimizer.cu",
            "preprocess.cu",
        )
    } == {
        "convolution/gemm.cu",
        "normalization/batchnorm.cu",
        "pooling/pooling.cu",
        "elementwise/blas.cu",
        "losses/yolo_loss.cu",
        "optimizers/optimizer.cu",
        "images/preprocess.cu",
    }
