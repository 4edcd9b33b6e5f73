"""Normalization: bias and scale, batch norm, the channel reductions, l2norm and lrn
(numpy.py, cuda.py; batchnorm.cu, normalization.cu)."""
