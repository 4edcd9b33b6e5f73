"""Shared by several op families: the headers their kernels include (*.cuh) and the
helpers of their NumPy references (numpy.py)."""
