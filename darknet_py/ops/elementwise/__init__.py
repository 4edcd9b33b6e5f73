"""Element-wise and shape ops: vector ops (blas), activations, shape ops (copies, upsample,
reorg, shortcut, channel scaling and weighting), dropout, binarize (numpy.py, cuda.py; blas.cu,
activations.cu, shape.cu, dropout.cu, binary.cu). activations.cu also holds batch norm's
fused apply and rebuild kernels, which ops/normalization launches."""
