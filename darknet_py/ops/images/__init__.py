"""Images: photos uploaded as uint8 and letterboxed on the device (cuda.py, preprocess.cu)."""
