"""Pooling: maxpool, local and global average pooling (numpy.py, cuda.py, pooling.cu)."""
