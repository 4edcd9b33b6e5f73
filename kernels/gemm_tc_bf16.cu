// The tensor-core convolution forward, GEMMs and weight packing with bf16 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(bf16, BF16)
