"""The interface every transformer backend implements (numpy reference, PyCUDA).

The KV cache is an arena of `capacity` physical slots allocated once. Which
slot holds which token is decided by the caller (core/kv_slots.py): a backend
only writes K/V into the slots it is told to and attends over the slots it is
told to. Evicted frames therefore leave holes that cost nothing.

One call, `forward`, serves prefill (N tokens) and decode (N = 1):

    x            [N, hidden]      input embeddings (token rows from `embed`,
                                  or vision-encoder rows), float32
    positions    [N] int64        absolute RoPE position of each input row
    write_slots  [N] int32        arena slot receiving each row's K/V
    context_slots[C] int32        already-filled slots every row attends to
                                  (in addition to rows 0..i of this call:
                                  causal within the call)
    logits       "last" | "all" | "none"

    returns ForwardResult(logits [1 or N, vocab] float32 or None,
                          hidden_states list of [N, hidden] per layer, only
                          when return_hidden=True: entry 0 = input
                          embeddings, entry l = output of layer l, last entry
                          = after the final norm, as HF's output_hidden_states)

K is stored after RoPE, so a slot keeps the position it was written with.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .spec import ModelSpec


@dataclass
class ForwardResult:
    logits: np.ndarray | None                 # [1, vocab] ("last") or [N, vocab] ("all")
    hidden_states: list = field(default_factory=list)


class Backend(Protocol):
    spec: ModelSpec
    capacity: int                              # KV arena slots

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        """[N] int -> [N, hidden] float32 rows of the token embedding table."""

    def forward(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                context_slots: np.ndarray, logits: str = "last",
                return_hidden: bool = False) -> ForwardResult:
        """See the module docstring."""

    def copy_slots(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        """Move K/V of src slots into dst slots (all layers); used by compaction and swaps."""

    def read_kv(self, slots: np.ndarray) -> np.ndarray:
        """[2, layers, len(slots), kv_dim] float32 host copy of K (after RoPE) and V of the slots."""

    def write_kv(self, slots: np.ndarray, kv: np.ndarray) -> None:
        """Inverse of read_kv: overwrite the slots with kv [2, layers, len(slots), kv_dim]."""

    def memory_bytes(self) -> int:
        """Bytes held by weights + KV arena (device memory for GPU backends)."""
