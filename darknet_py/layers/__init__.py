"""One module per Darknet layer type; LAYER_TYPES maps a section type to its class."""

import importlib

# section type -> (module, class). Imported on first use.
_LAYER_CLASSES = {
    "convolutional": ("convolutional", "ConvolutionalLayer"),
    "connected": ("connected", "ConnectedLayer"),
    "maxpool": ("maxpool", "MaxpoolLayer"),
    "avgpool": ("avgpool", "AvgpoolLayer"),
    "dropout": ("dropout", "DropoutLayer"),
    "softmax": ("softmax", "SoftmaxLayer"),
    "cost": ("cost", "CostLayer"),
    "route": ("route", "RouteLayer"),
    "shortcut": ("shortcut", "ShortcutLayer"),
    "upsample": ("upsample", "UpsampleLayer"),
    "reorg": ("reorg", "ReorgLayer"),
    "crop": ("crop", "CropLayer"),
    "local": ("local", "LocalLayer"),
    "batchnorm": ("batchnorm", "BatchnormLayer"),
    "yolo": ("yolo", "YoloLayer"),
    "region": ("region", "RegionLayer"),
    "detection": ("detection", "DetectionLayer"),
    "activation": ("activation", "ActivationLayer"),
    "logistic": ("logistic", "LogisticLayer"),
    "l2norm": ("l2norm", "L2normLayer"),
    "normalization": ("normalization", "NormalizationLayer"),
    "deconvolutional": ("deconvolutional", "DeconvolutionalLayer"),
    # the AlexeyAB fork's
    "sam": ("sam", "SamLayer"),
    "scale_channels": ("scale_channels", "ScaleChannelsLayer"),
    "local_avgpool": ("local_avgpool", "LocalAvgpoolLayer"),
    "reorg3d": ("reorg3d", "Reorg3dLayer"),
    "empty": ("empty", "EmptyLayer"),
    "gaussian_yolo": ("gaussian_yolo", "GaussianYoloLayer"),
    # recurrent layers (both Darknets; [conv_lstm] is the fork's)
    "rnn": ("rnn", "RnnLayer"),
    "gru": ("gru", "GruLayer"),
    "lstm": ("lstm", "LstmLayer"),
    "crnn": ("crnn", "CrnnLayer"),
    "conv_lstm": ("conv_lstm", "ConvLstmLayer"),
    "history": ("history", "HistoryLayer"),
    "implicit": ("implicit", "ImplicitLayer"),
}

LAYER_TYPES = tuple(_LAYER_CLASSES)


def layer_class(type_):
    module, cls = _LAYER_CLASSES[type_]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
