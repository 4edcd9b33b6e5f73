"""Normalization: bias and scale, batch norm, the channel reductions, l2norm and lrn
(numpy.py: batch norm's NumPy reference; cuda.py; batchnorm.cu, normalization.cu)."""
