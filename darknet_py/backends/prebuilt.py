"""Kernels that need no compiler: the wheel carries every kernel file (ops/*/*.cu) built for the
GPU architectures in ARCHS (one fatbin per file, SASS for each), and a manifest that ties
each binary to what it was built from (kernel_cache.kernel_digest: the source, its nvcc
options and its headers).

At start the CUDA backend takes a file's binary from here when the manifest lists the
device's architecture and the file's digest matches its source as installed; otherwise
(an architecture the wheel lacks, a kernel edited after the build, a damaged binary) it
compiles that file with nvcc into the kernel cache, as without a wheel. A binary that
does not match its source is never loaded.

    python -m darknet_py.backends.prebuilt [--out DIR] [--arch sm_90 ...]

builds them (`make dist` does, before packing the wheel). Host-only: no PyCUDA here.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import sys
import tempfile
import zipfile

from . import kernel_cache

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
# Files built for other architectures than ARCHS: the Hopper GEMM uses sm_90a's own
# instructions (wgmma, setmaxnreg), which no other target has (ops/convolution/wgmma.py
# and nhwc.py load them).
FILE_ARCHS = {
    "gemm_wgmma.cu": ("sm_90a",),
    "gemm_wgmma_solo.cu": ("sm_90a",),
    "conv_nhwc.cu": ("sm_90a",),
}
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS_DIR = os.path.join(PACKAGE_DIR, "ops")
PREBUILT_DIR = os.path.join(PACKAGE_DIR, "kernels_bin")
MANIFEST = "manifest.json"
_FORMAT = 1


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def kernel_folders(ops_dir=OPS_DIR):
    """The op families' folders that hold kernel files (.cu or .cuh), sorted: where a kernel
    file is found by its name, and the folders of its quoted #includes (nvcc -I,
    kernel_cache.kernel_digest)."""
    names = sorted(os.listdir(ops_dir)) if os.path.isdir(ops_dir) else []
    folders = [os.path.join(ops_dir, name) for name in names]
    return [
        f
        for f in folders
        if os.path.isdir(f) and any(n.endswith((".cu", ".cuh")) for n in os.listdir(f))
    ]


KERNEL_DIRS = kernel_folders()


def kernel_paths(kernel_dirs=KERNEL_DIRS):
    """{file name: path} of every .cu file in kernel_dirs; kernels are named by their file
    alone (the cache, the manifest, the launchers' KERNEL_FILES), so a name in two
    folders is an error."""
    paths = {}
    for folder in kernel_dirs:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".cu"):
                if name in paths:
                    raise ValueError(f"kernel file {name} is in both {paths[name]} and {folder}")
                paths[name] = os.path.join(folder, name)
    return dict(sorted(paths.items()))


def kernel_sources(kernel_dirs=KERNEL_DIRS):
    """{file name: source} of every kernel file."""
    sources = {}
    for name, path in kernel_paths(kernel_dirs).items():
        with open(path) as f:
            sources[name] = f.read()
    return sources


def build(
    out_dir=PREBUILT_DIR,
    kernel_dirs=KERNEL_DIRS,
    archs=ARCHS,
    options=None,
    nvcc="nvcc",
    sources=None,
):
    """Compile every kernel file for `archs` into out_dir (one fatbin each, nvcc runs in
    parallel) and write the manifest last, so an interrupted build leaves none."""
    sources = kernel_sources(kernel_dirs) if sources is None else sources
    options = kernel_cache.KERNEL_OPTIONS if options is None else options
    kernel_cache.require_nvcc(nvcc)
    os.makedirs(out_dir, exist_ok=True)
    stale = os.path.join(out_dir, MANIFEST)
    if os.path.exists(stale):
        os.unlink(stale)

    def one(name):
        opts = tuple(options.get(name, ()))
        targets = file_archs(name, archs)
        gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in targets]
        binary = kernel_cache.run_nvcc(
            name,
            sources[name],
            ["--fatbin", *gencode, *opts],
            kernel_dirs,
            nvcc,
            f" for {', '.join(targets)}",
        )
        out = name[:-3] + ".fatbin"
        with open(os.path.join(out_dir, out), "wb") as f:
            f.write(binary)
        entry = {
            "digest": kernel_cache.kernel_digest(sources[name], opts, kernel_dirs),
            "binary": out,
            "sha256": _sha256(binary),
        }
        if name in FILE_ARCHS:
            entry["archs"] = list(targets)
        return name, entry

    workers = min(len(sources), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        kernels = dict(pool.map(one, sorted(sources)))
    manifest = {"format": _FORMAT, "archs": list(archs), "kernels": kernels}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def file_archs(name, archs=ARCHS):
    """The architectures a kernel file is built for: FILE_ARCHS's, else `archs`."""
    return FILE_ARCHS.get(name, tuple(archs))


def read_manifest(directory=PREBUILT_DIR):
    """The manifest, or None where there is none (a source checkout) or it is unreadable."""
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        return None
    return manifest


def prebuilt_binary(
    manifest, name, source, options, arch, directory=PREBUILT_DIR, include_dirs=KERNEL_DIRS
):
    """(binary, None) for a file the manifest covers for `arch` with a matching digest,
    else (None, why: 'none', 'arch', 'stale' or 'damaged')."""
    entry = (manifest or {}).get("kernels", {}).get(name)
    if entry is None:
        return None, "none"
    if arch not in entry.get("archs", manifest.get("archs", ())):
        return None, "arch"
    if entry.get("digest") != kernel_cache.kernel_digest(source, tuple(options), include_dirs):
        return None, "stale"
    try:
        with open(os.path.join(directory, os.path.basename(entry["binary"])), "rb") as f:
            binary = f.read()
    except (OSError, KeyError, TypeError):
        return None, "damaged"
    if _sha256(binary) != entry.get("sha256"):
        return None, "damaged"
    return binary, None


def binaries(
    sources,
    arch,
    options=None,
    directory=PREBUILT_DIR,
    include_dirs=KERNEL_DIRS,
    nvcc="nvcc",
    cache_directory=None,
    warn=True,
):
    """({file name: binary to load}, [files compiled]): the prebuilt binary of each file
    where it is valid for `arch`, the kernel cache (nvcc where it holds none) for the rest.
    A stale or damaged prebuilt file is reported on stderr once (warn)."""
    options = kernel_cache.KERNEL_OPTIONS if options is None else options
    manifest = read_manifest(directory)
    found, rest, bad = {}, {}, []
    for name, source in sources.items():
        binary, why = prebuilt_binary(
            manifest, name, source, options.get(name, ()), arch, directory, include_dirs
        )
        if binary is not None:
            found[name] = binary
        else:
            rest[name] = source
            if why in ("stale", "damaged"):
                bad.append(f"{name} ({why})")
    if bad and warn:
        print(
            f"darknet-py: prebuilt kernels in {directory} do not match their sources: "
            f"{', '.join(bad)}; compiling them with nvcc",
            file=sys.stderr,
        )
    if rest:
        found.update(kernel_cache.cubins(rest, arch, options, nvcc, cache_directory, include_dirs))
    return found, sorted(rest)


def check_wheel(wheel):
    """What a built wheel lacks or gets wrong, as lines (none when it is whole): every
    kernel source and bundled cfg of this checkout, and a binary for every architecture in
    ARCHS that matches the wheel's own kernel source by digest."""
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as root:
        names = set(z.namelist())
        want = {
            os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE_DIR))
            for folder in [*KERNEL_DIRS, os.path.join(PACKAGE_DIR, "cfgs")]
            for name in os.listdir(folder)
            if name.endswith((".cu", ".cuh", ".cfg"))
        }
        problems = [f"the wheel lacks {name}" for name in sorted(want - names)]
        z.extractall(root)
        kernels = kernel_folders(os.path.join(root, "darknet_py", "ops"))
        binaries_dir = os.path.join(root, "darknet_py", "kernels_bin")
        manifest = read_manifest(binaries_dir)
        if manifest is None:
            return problems + [f"the wheel lacks darknet_py/kernels_bin/{MANIFEST}"]
        for name, source in kernel_sources(kernels).items():
            opts = kernel_cache.KERNEL_OPTIONS.get(name, ())
            for arch in file_archs(name):
                why = prebuilt_binary(manifest, name, source, opts, arch, binaries_dir, kernels)[1]
                if why is not None:
                    problems.append(f"{name} for {arch}: prebuilt binary {why}")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m darknet_py.backends.prebuilt",
        description="Build every kernel for the wheel (make dist).",
    )
    ap.add_argument("--out", default=PREBUILT_DIR)
    ap.add_argument("--arch", action="append", help=f"repeatable; default {' '.join(ARCHS)}")
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--check-wheel", metavar="WHEEL", help="check a built wheel instead")
    args = ap.parse_args(argv)
    if args.check_wheel:
        problems = check_wheel(args.check_wheel)
        if problems:
            sys.exit("\n".join(f"{args.check_wheel}: {p}" for p in problems))
        print(
            f"{args.check_wheel}: every kernel prebuilt for {' '.join(ARCHS)}, matching its source"
        )
        return
    try:
        manifest = build(args.out, archs=tuple(args.arch or ARCHS), nvcc=args.nvcc)
    except kernel_cache.KernelCompileError as e:
        sys.exit(f"darknet-py: {e}")
    print(
        f"{len(manifest['kernels'])} kernel files built for {' '.join(manifest['archs'])} "
        f"into {args.out}"
    )


if __name__ == "__main__":
    main()
