"""Kernel benchmarks and probes: GEMM, convolution plans and backward, batch norm passes."""
