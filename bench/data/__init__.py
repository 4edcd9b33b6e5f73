"""The data loader on its own."""
