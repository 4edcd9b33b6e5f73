"""Whole networks: the batch-64 forward, batch 1 on each device, where the time goes."""
