"""backends/kernel_signatures.py: kernels' argument formats read from their declarations."""

import pytest

from darknet_py.backends import kernel_signatures, prebuilt
from darknet_py.backends.kernel_signatures import SignatureError, file_signatures


def test_plain_entries_and_their_parameter_kinds():
    source = """
    // extern "C" __global__ void commented_out(int a)
    extern "C" __global__ void __launch_bounds__(256) scale(const float* __restrict__ x,
                                                            int n, unsigned int seed,
                                                            long long stride, float alpha,
                                                            void* out)
    { }
    __global__ void not_an_entry(int a) { }
    """
    assert file_signatures(source) == {"scale": "PiIqfP"}


def test_entries_made_by_macros_x_macros_and_pasting():
    source = """
#define ENTRY(NAME, T, BM, WM, WN)                                                      \\
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) NAME( \\
        const T* in, int rows, float beta, T* out)                                      \\
    {                                                                                   \\
    }
#define TILES(X, PREC, T) X(PREC, T, 64x64, 2, 2) X(PREC, T, 32x64, 1, 2)
#define TILE_X(PREC, T, TILE, WM, WN) ENTRY(tile_##PREC##_##TILE, T, 64, WM, WN)
#define ALL(PREC, T) \\
    TILES(TILE_X, PREC, T) \\
    extern "C" __global__ void pack_##PREC(const float* in, int n, T* out) { }
ALL(f16, __half)
ENTRY(plain_entry, float, 64, 2, 2)
"""
    assert file_signatures(source) == {
        "tile_f16_64x64": "PifP",
        "tile_f16_32x64": "PifP",
        "pack_f16": "PiP",
        "plain_entry": "PifP",
    }


def test_an_unknown_parameter_type_is_named():
    source = 'extern "C" __global__ void k(const float* x, size_t n) {}'
    with pytest.raises(SignatureError, match=r"k\.cu: kernel k takes a parameter of type 'size_t'"):
        file_signatures(source, "k.cu")


def test_an_entry_declared_twice_differently_is_refused():
    source = """
extern "C" __global__ void k(int n) {}
#if 0
extern "C" __global__ void k(float n) {}
#endif
"""
    with pytest.raises(SignatureError, match="kernel k declared twice, taking 'i' and 'f'"):
        file_signatures(source, "k.cu")


def test_a_kernel_in_two_loaded_files_is_refused(tmp_path):
    for name in ("a.cu", "b.cu"):
        (tmp_path / name).write_text('extern "C" __global__ void same(int n) {}\n')
    with pytest.raises(SignatureError, match="kernel same is declared in both a.cu and b.cu"):
        kernel_signatures.kernel_table(["a.cu", "b.cu"], [str(tmp_path)])


def test_headers_are_read_where_a_file_includes_them():
    # pooling.cu's entries come from its own text; gemm_tc_f16.cu's from gemm_tc.cuh's
    # macros it invokes.
    assert kernel_signatures.signatures("pooling.cu")["maxpool_backward_kernel"] == "PPiP"
    tc = kernel_signatures.signatures("gemm_tc_f16.cu")
    assert tc["pack_weights_f16"] == "PiiiP"
    assert {n for n in tc if n.startswith("gemm_tc_f16_")} == {
        f"gemm_tc_f16_{tile}_{case}"
        for tile in ("128x128", "64x128", "32x128", "16x128", "64x64")
        for case in ("nn", "nt", "tn")
    }


def test_a_tensor_map_kernel_is_not_for_pycuda():
    fmt = kernel_signatures.signatures("gemm_wgmma.cu")["wgmma_gemm_f16"]
    with pytest.raises(SignatureError, match="takes a tensor map"):
        kernel_signatures.pycuda_format("wgmma_gemm_f16", fmt)


def test_every_kernel_file_reads():
    for filename in prebuilt.kernel_paths():
        assert kernel_signatures.signatures(filename), f"{filename} declares no entry point"
