// The tensor-core convolution forward with a 16-bit side, bf16 operands (gemm_tc.cuh): fp32
// images into a 16-bit output (the _h entries: batch norm's x under training) and images
// kept at 16 bits (the _in16 entries: layer outputs, issue 26). Apart from gemm_tc_bf16.cu
// so that each file compiles in about half the time (in parallel where there are cores).
#include "gemm_tc.cuh"

TC_TILES(TC_CONV_HALF_X, bf16, BF16)
TC_CONV_IN16_ENTRIES(bf16, BF16)
