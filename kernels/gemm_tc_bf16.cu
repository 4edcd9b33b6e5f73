// The tensor-core convolution forward (fp32 or 16-bit output), GEMMs and weight packing with bf16 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(bf16, BF16)
TC_TILES(TC_CONV_HALF_X, bf16, BF16)
TC_CONV_IN16_ENTRIES(bf16, BF16)
