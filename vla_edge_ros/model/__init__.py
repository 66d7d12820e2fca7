"""Weights, model architecture and the transformer backends (numpy reference, PyCUDA)."""
