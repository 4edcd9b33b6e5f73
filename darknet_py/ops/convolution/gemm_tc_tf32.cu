// The tensor-core convolution forward, GEMMs and weight packing with tf32 operands
// (gemm_tc.cuh).
#include "gemm_tc.cuh"

TC_PRECISION_ENTRIES(tf32, TF32)
