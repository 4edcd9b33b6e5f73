"""Pooling: maxpool, local and global average pooling (cuda.py, pooling.cu)."""
