"""Optimizers: Adam's update and the 16-bit weight exchange (numpy.py, cuda.py, optimizer.cu)."""
