"""Images: photos uploaded as uint8 and letterboxed on the device (numpy.py, cuda.py,
preprocess.cu)."""
