"""The NHWC 16-bit layer outputs' ops (issue 42): numpy.py the reference, cuda.py and
nhwc.cu the device's."""
