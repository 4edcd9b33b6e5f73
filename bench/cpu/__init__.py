"""CPU inference against OpenCV's DNN module and ONNX Runtime."""
