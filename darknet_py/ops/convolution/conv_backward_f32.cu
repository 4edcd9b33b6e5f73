// A convolution's backward as implicit GEMMs in fp32 FFMA (conv_backward_entries.cuh):
// the tiles conv_backward's fp32 plans name, and the transposed weights as they are.
#include "conv_backward_entries.cuh"

CONV_WGRAD_F32(conv_wgrad_f32_128x128x8, 128, 128, 8, 8, 8, 2)
CONV_WGRAD_F32(conv_wgrad_f32_64x64x16, 64, 64, 16, 4, 4, 3)
CONV_WGRAD_F32(conv_wgrad_f32_32x32x16, 32, 32, 16, 4, 4, 8)
CONV_DGRAD_F32(conv_dgrad_f32_128x128x8, 128, 128, 8, 8, 8, 2)
CONV_DGRAD_F32(conv_dgrad_f32_64x64x16, 64, 64, 16, 4, 4, 3)
CONV_DGRAD_CLASS_F32(conv_dgrad_class_f32_128x128x8, 128, 128, 8, 8, 8, 2)
CONV_DGRAD_CLASS_F32(conv_dgrad_class_f32_64x64x16, 64, 64, 16, 4, 4, 3)
PACK_TRANSPOSED(pack_transposed_f32, TF32, true)
