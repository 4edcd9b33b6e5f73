// A convolution's backward as implicit GEMMs on the tensor cores, tf32 operands
// (conv_backward_entries.cuh).
#include "conv_backward_entries.cuh"

CONV_BACKWARD_TC_ENTRIES(tf32, TF32)
