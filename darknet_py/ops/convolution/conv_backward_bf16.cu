// A convolution's backward as implicit GEMMs on the tensor cores, bf16 operands
// (conv_backward_entries.cuh).
#include "conv_backward_entries.cuh"

CONV_BACKWARD_TC_ENTRIES(bf16, BF16)
CONV_WGRAD_IN16_ENTRIES(bf16, BF16)
