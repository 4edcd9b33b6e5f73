// The tensor-core convolution forward, GEMMs and weight packing with f16 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(f16, F16)
