// The tensor-core convolution forward (fp32 or 16-bit output), GEMMs and weight packing with f16 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(f16, F16)
TC_TILES(TC_CONV_HALF_X, f16, F16)
TC_CONV_IN16_ENTRIES(f16, F16)
