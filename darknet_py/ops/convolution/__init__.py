"""Convolution: the GEMMs, im2col/col2im, the tensor-core convolution, the convolution
backward as implicit GEMMs and Hopper's wgmma GEMM (cuda.py, cuda_backward.py, wgmma.py;
numpy.py: their NumPy reference; gemm*.cu, conv_*.cu, im2col.cu and their headers), and the
channels-last 16-bit forward on Hopper (nhwc.py, conv_nhwc.cu; nhwc_numpy.py its reference,
nhwc_common.py their checks and packing)."""
