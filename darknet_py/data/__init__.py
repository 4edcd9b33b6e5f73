"""Darknet's training data: .data files and lists (config), labels and truth rows
(labels), image augmentation (augment), batches (loader), anchors (anchors).

Images are Darknet-style float32 RGB in [0, 1]. All randomness comes from NumPy
generators derived from a seed, so a seed reproduces every batch.
"""

from .anchors import (
    anchor_mean_iou,
    compute_anchors,
    format_anchors,
    gather_label_boxes,
    kmeans_anchors,
)
from .augment import ClassifierAugment, DetectorAugment, hsv_to_rgb
from .config import DataConfig, DataError, load_data_config, read_list
from .labels import (
    MAX_BOXES,
    MissingLabelFile,
    check_classifier_labels,
    classifier_label_index,
    classifier_truth,
    correct_boxes,
    detection_truth,
    label_path,
    parse_labels,
    read_image_labels,
    read_labels,
)
from .loader import Batch, DataLoader

__all__ = [
    "Batch",
    "ClassifierAugment",
    "DataConfig",
    "DataError",
    "DataLoader",
    "DetectorAugment",
    "MAX_BOXES",
    "MissingLabelFile",
    "anchor_mean_iou",
    "check_classifier_labels",
    "classifier_label_index",
    "classifier_truth",
    "compute_anchors",
    "correct_boxes",
    "detection_truth",
    "format_anchors",
    "gather_label_boxes",
    "hsv_to_rgb",
    "kmeans_anchors",
    "label_path",
    "load_data_config",
    "parse_labels",
    "read_image_labels",
    "read_labels",
    "read_list",
]
