// The tensor-core convolution forward (fp32 images and output; the 16-bit ones: conv_tc_half_*.cu), GEMMs and weight packing with bf16 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(bf16, BF16)
