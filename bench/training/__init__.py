"""Training: end to end against the C Darknet, beside PyTorch, per precision."""
