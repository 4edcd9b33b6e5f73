"""The detection heads' training losses on host arrays: the NumPy backend's ops and the
references the CUDA kernels (ops/losses/yolo_loss.cu, ops/losses/region_loss.cu) are tested
against. Below the layers: they use box maths (boxes.py) and nothing above it."""
