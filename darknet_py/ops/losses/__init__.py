"""Losses: softmax and the costs, the yolo, region and detection losses (numpy.py, cuda.py;
softmax.cu, yolo_loss.cu, region_loss.cu). The detection losses' NumPy references stay in
darknet_py/losses/, on the floor below the backends: the layers use them too (their
constants and truth layouts, and [Gaussian_yolo]'s loss on host arrays); numpy.py calls them."""
