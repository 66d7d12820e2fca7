"""Exceptions the model layer raises and the engine (core/) turns into fallbacks.

They live here, not in core/, so model/ never imports core/ (the engine
imports the model, not the other way round).
"""
from __future__ import annotations


class NonFiniteLogitsError(ValueError):
    """The logits hold NaN (anywhere) or +-Inf among the action bins: the forward pass is broken."""


class DeviceKVUnavailable(RuntimeError):
    """A snapshot's KV left on a GPU can no longer be read as offered (its buffer moved on, or the copy
    was torn by a concurrent rewrite)."""
