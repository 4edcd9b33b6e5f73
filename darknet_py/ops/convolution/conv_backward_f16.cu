// A convolution's backward as implicit GEMMs on the tensor cores, f16 operands
// (conv_backward_entries.cuh).
#include "conv_backward_entries.cuh"

CONV_BACKWARD_TC_ENTRIES(f16, F16)
CONV_WGRAD_IN16_ENTRIES(f16, F16)
